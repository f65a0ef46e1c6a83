"""Rollout engines: servers that speak SGLang's HTTP subset (slime-contracts.md section 5).

`RolloutEngine` is the control surface the trainer uses on any engine: it talks HTTP to `url`, so an
engine only has to say how it starts and stops. `cpu_server.CPUEngine` runs a transformers model on
CPU; a GPU engine launching real SGLang servers can subclass the same base. Rollout code itself only
ever posts to `/generate` (through `slime.utils.http_utils.post`) and never knows which engine runs.
"""

from slime.engine.base import EngineError, RolloutEngine

__all__ = ["EngineError", "RolloutEngine"]
