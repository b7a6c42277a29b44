"""probing.agent.memory."""
