"""Load test of the rollout: the real training-side path driven by a scripted engine instead of a model.

    scripted_engine.py  an SGLang-protocol `/generate` server replaying reference solutions (own process)
    harness.py          starts it and a slime router, runs slime's generate_rollout for N concurrent episodes

`benchmarks/rollout_scale.py` measures with it; `tests/awm_grpo/test_rollout_scale.py` checks it.
"""
