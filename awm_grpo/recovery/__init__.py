"""The implicit-recovery method: progress predicates, turn-level credit, its metrics and its experiment.

    progress.py  Phi(s) from predicates over the episode's DB, tracked per turn by the rollout
    credit.py    turn rewards and credit as pure functions (the formulas live there)
    plugin.py    slime's custom advantage function and the recovery metrics of a step's traces
    metrics.py   recovery_success, additional_damage, ... from a small per-episode record
    split.py     the controlled recovery split: damaged handovers built and evaluated
    compare.py   B1 against the method on the CPU default (`python -m awm_grpo.recovery.compare`)

`--custom-advantage-function-path awm_grpo.recovery.advantages` is the plugin's public path.
The method in the project's own words: docs/recovery-method.md.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """`awm_grpo.recovery.advantages` resolves on first use, so credit.py and progress.py import without torch."""
    if name == "advantages":
        from awm_grpo.recovery.plugin import advantages

        return advantages
    raise AttributeError(f"module 'awm_grpo.recovery' has no attribute {name!r}")
