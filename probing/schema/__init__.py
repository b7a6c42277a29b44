"""probing.schema."""
