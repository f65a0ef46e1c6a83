"""Every ablation switch of the recovery method is a launcher knob that reaches the advantage function.

Real resolution path: knob (environment variable) -> `awm_grpo.launch.config.resolve` -> runtime YAML
(`runtime_config`) -> slime's own `apply_custom_config` -> `awm_grpo.recovery.plugin.credit_config`.
"""

from __future__ import annotations

import argparse

import pytest
import yaml

from awm_grpo.launch import config as C
from awm_grpo.launch.job import runtime_config
from awm_grpo.recovery.credit import CreditConfig
from awm_grpo.recovery.plugin import advantages, credit_config
from slime.arguments import apply_custom_config
from slime.utils.types import Sample

# knob variable, value unlike the default, CreditConfig attribute
SWITCHES = [("AWM_CREDIT_BINARY_ONLY", "1", "binary_only", True),
            ("AWM_CREDIT_PROGRESS_FORM", "potential", "progress_form", "potential"),
            ("AWM_CREDIT_ESTIMATOR", "naive", "estimator", "naive"),
            ("AWM_CREDIT_BASELINE", "mean", "baseline", "mean"),
            ("AWM_CREDIT_SCALE", "group_std", "scale", "group_std"),
            ("AWM_CREDIT_GAMMA_V", "0.25", "gamma_v", 0.25),
            ("AWM_CREDIT_LAMBDA", "0.2", "lam", 0.2), ("AWM_CREDIT_BETA", "0", "beta", 0.0),
            ("AWM_CREDIT_ETA", "0.9", "eta", 0.9)]


def runtime_args(tmp_path, env: dict[str, str]) -> argparse.Namespace:
    """args as the trainer sees them: the launcher's runtime YAML loaded by slime's loader."""
    cfg = C.resolve(None, gpus=[], env={"AWM_CREDIT_METHOD": "ours", "AWM_PREDICATES": "/tmp/p.jsonl", **env})
    path = tmp_path / "rt.yaml"
    path.write_text(yaml.safe_dump(runtime_config(cfg)))
    args = argparse.Namespace()
    apply_custom_config(args, str(path))
    return args


def test_defaults_reach_the_advantage_function_unchanged(tmp_path):
    cfg, binary_only = credit_config(runtime_args(tmp_path, {}))
    assert cfg == CreditConfig(method="ours", max_turns=8) and binary_only is False  # cpu profile: 8 turns


@pytest.mark.parametrize(("env", "value", "attr", "want"), SWITCHES, ids=[s[0] for s in SWITCHES])
def test_each_switch_reaches_the_credit_config(tmp_path, env, value, attr, want):
    cfg, _ = credit_config(runtime_args(tmp_path, {env: value}))
    assert getattr(cfg, attr) == want
    assert getattr(CreditConfig(), attr) != want  # the test value differs from the default


def test_a_bad_switch_value_is_refused_by_the_launcher_and_by_the_plugin(tmp_path):
    with pytest.raises(C.ConfigError, match="AWM_CREDIT_ESTIMATOR"):
        C.resolve(None, gpus=[], env={"AWM_CREDIT_ESTIMATOR": "nope"})
    args = runtime_args(tmp_path, {})
    args.awm_credit_estimator = "nope"  # a hand-edited runtime YAML
    with pytest.raises(ValueError, match="awm_credit_estimator 'nope' is unknown"):
        credit_config(args)


def sample(index: int, phi: list[float], phi_b: list[float]) -> Sample:
    T = len(phi)
    credit = {"span": [[t, t + 1] for t in range(T)], "phi": phi, "phi_b": phi_b, "phi0": 0.0, "phi0_b": 0.0,
              "write": [True] * T, "error": [False] * T, "fmt": [False] * T, "rel_read": [False] * T,
              "ok": [True] * T, "rel_tool": [True] * T}
    return Sample(index=index, group_index=0, response_length=T, loss_mask=[1] * T, reward=0.0,
                  status=Sample.Status.COMPLETED, metadata={"awm": {"turns": T, "verdict": "others", "credit": credit}})


def test_binary_only_knob_changes_the_advantages(tmp_path):
    """S1 through the knob: a half-met scalar predicate earns progress only without it."""
    a, b = sample(0, [0.5], [0.0]), sample(1, [0.0], [0.0])
    plain = runtime_args(tmp_path, {"AWM_CREDIT_LAMBDA": "1", "AWM_CREDIT_ETA": "1"})
    s1 = runtime_args(tmp_path, {"AWM_CREDIT_LAMBDA": "1", "AWM_CREDIT_ETA": "1", "AWM_CREDIT_BINARY_ONLY": "true"})
    assert advantages(plain, [a, b]) == [[0.5], [-0.5]]
    assert advantages(s1, [a, b]) == [[0.0], [0.0]]


def test_naive_estimator_knob_changes_the_advantages(tmp_path):
    """A pool of two: naive normalises by the pool's std (+-1), carry + leave-one-out does not."""
    a, b = sample(0, [0.5], [0.5]), sample(1, [0.0], [0.0])
    env = {"AWM_CREDIT_LAMBDA": "1", "AWM_CREDIT_ETA": "1"}
    assert advantages(runtime_args(tmp_path, env), [a, b]) == [[0.5], [-0.5]]
    naive = advantages(runtime_args(tmp_path, {**env, "AWM_CREDIT_ESTIMATOR": "naive"}), [a, b])
    assert naive[0][0] == pytest.approx(1.0, abs=1e-4) and naive[1][0] == pytest.approx(-1.0, abs=1e-4)
