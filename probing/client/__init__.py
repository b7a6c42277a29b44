"""probing.client."""
