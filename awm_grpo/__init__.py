"""The AWM GRPO recipe: multi-turn rollouts on AWM environments, rewards, traces, and its launcher.

Data flows one way: data_prep -> rollout (chat, env_client, protocol) -> reward -> traces; eval plays
held-out splits with the same rollout; launch/ starts slime.train with these as plugins; recovery/ is
the implicit-recovery method; warmstart/ the SFT that gives RL a non-zero start.

Modules that moved into those subpackages raise an error that names their new home.
"""

from __future__ import annotations

from awm.moved import register

MOVED = {
    "awm_grpo.progress": "awm_grpo.recovery.progress",
    "awm_grpo.credit": "awm_grpo.recovery.credit",
    "awm_grpo.recovery_metrics": "awm_grpo.recovery.metrics",
    "awm_grpo.recovery_split": "awm_grpo.recovery.split",
    "awm_grpo.compare": "awm_grpo.recovery.compare",
    "awm_grpo.drill": "awm_grpo.warmstart.drill",
    "awm_grpo.counterfactual": "awm_grpo.warmstart.counterfactual",
    "awm_grpo.config": "awm_grpo.launch.config",
    "awm_grpo.knobs": "awm_grpo.launch.knobs",
    "awm_grpo.processes": "awm_grpo.launch.processes",
}


register(MOVED)
