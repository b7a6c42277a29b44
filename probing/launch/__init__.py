"""probing.launch."""
