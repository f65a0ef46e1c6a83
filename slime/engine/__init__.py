"""Rollout engines: servers that speak SGLang's HTTP subset (docs/trainer.md, slime's contracts).

`RolloutEngine` is the control surface the trainer uses on any engine: it talks HTTP to `url`, so an
engine only has to say how it starts and stops. `cpu_server.CPUEngine` runs a transformers model on
CPU; `sglang_engine.SGLangEngine` launches a real SGLang server (GPU); `base.EngineClient` controls an
engine started elsewhere. `pool.EnginePool` runs a training run's engines as Ray actors, with an
optional router process in front (`router_process`). Rollout code itself only
ever posts to `/generate` (through `slime.utils.http_utils.post`) and never knows which engine runs.
"""

from slime.engine.base import EngineError, RolloutEngine

__all__ = ["EngineError", "RolloutEngine"]
