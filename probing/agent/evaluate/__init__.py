"""probing.agent.evaluate."""
