"""probing.outside."""
