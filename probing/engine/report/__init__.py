"""`report`: what one HTML page of a job holds, gathered from a live process, a record, or
every rank of a job; the pictures themselves are cli/pictures/."""
