"""Forks a child (as a DataLoader worker is forked) that waits until told to exit; the child
then leaves through sys.exit, so the atexit handlers it inherited run in it."""

import os
import sys

release_read, release_write = os.pipe()
started_read, started_write = os.pipe()
child = os.fork()
if child == 0:
    # Python code runs in the child only after the at-fork hooks: this byte means they ran.
    os.write(started_write, b"x")
    os.close(release_write)
    os.read(release_read, 1)
    sys.exit(0)

os.close(release_read)
os.read(started_read, 1)
print(f"ready child={child}", flush=True)
for line in sys.stdin:
    if line.strip() == "release-child":
        os.close(release_write)
        os.waitpid(child, 0)
        print("child exited", flush=True)
