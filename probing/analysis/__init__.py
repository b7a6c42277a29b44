"""probing.analysis."""
