"""AgentGym-protocol environments in the recipe: the HTTP client the rollout plays them with (client.py),
AgentGym's own BabyAI server run from a side venv (babyai.py), and a format-only warm start (warmstart.py).

The other direction, AWM tasks served to AgentGym clients, is `awm env agentgym` (awm.serve.agentgym_server)."""
