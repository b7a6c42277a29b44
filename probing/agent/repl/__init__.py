"""probing.agent.repl."""
