"""probing.agent.pytorch."""
