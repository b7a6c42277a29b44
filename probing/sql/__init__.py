"""probing.sql."""
