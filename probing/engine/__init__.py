"""probing.engine."""
