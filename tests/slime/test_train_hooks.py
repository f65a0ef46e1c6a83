"""Rollout/eval log hooks and the custom advantage function through `python -m slime.train`
(real Ray, CPU engine, tiny model), plus the hook return-value contract in process."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from test_train_loop import _command, _env, _run, _train_records, toy  # noqa: F401 - toy is a fixture

from slime.utils.log_hooks import call_log_hook, interpret_hook_return


def test_hook_return_values():
    assert interpret_hook_return(None, "h").skip_default is False
    assert interpret_hook_return(True, "h").skip_default is True
    got = interpret_hook_return({"a": 1, "b": 2.5, "c": "text", "d": math.nan, "e": True}, "h")
    assert (got.skip_default, got.metrics) == (False, {"a": 1.0, "b": 2.5, "e": 1.0})
    with pytest.raises(TypeError, match="return None, a bool"):
        interpret_hook_return([1], "h")

    async def async_hook(rollout_id, args, samples, extra, seconds):
        return {"n": len(samples) + rollout_id}

    assert asyncio.run(call_log_hook(async_hook, "h", 2, None, [1, 2], {}, 0.1)).metrics == {"n": 4.0}


PLUGIN = '''
import json
from slime.rollout import generate as default_generate


async def generate(args, sample, sampling_params, evaluation=False):
    sample = await default_generate(args, sample, sampling_params)
    sample.metadata["evaluation"] = evaluation
    return sample


def _write(args, record):
    with open(args.hook_log, "a") as f:
        f.write(json.dumps(record) + "\\n")


def log_rollout(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    _write(args, {"kind": "rollout", "rollout_id": rollout_id, "n": len(samples), "time": rollout_time,
                  "extra": sorted(rollout_extra_metrics or {}),
                  "evaluation": sorted({s.metadata["evaluation"] for s in samples})})
    return {"hook/n_samples": len(samples), "hook/note": "not a number"}


def log_eval(rollout_id, args, data, extra_metrics):
    _write(args, {"kind": "eval", "rollout_id": rollout_id,
                  "sets": {name: {"samples": len(d["samples"]), "rewards": len(d["rewards"]),
                                  "truncated": len(d["truncated"]),
                                  "evaluation": sorted({s.metadata["evaluation"] for s in d["samples"]})}
                           for name, d in data.items()}})
    return True


def first_token_advantage(args, samples):
    """0.25 on each sample's first response token, 0 elsewhere."""
    return [[0.25] + [0.0] * (s.response_length - 1) for s in samples]
'''


def test_log_hooks_and_custom_advantage_through_the_loop(toy, tmp_path):  # noqa: F811 - fixture
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "hook_plugin.py").write_text(PLUGIN)
    hook_log = tmp_path / "hooks.jsonl"
    config = tmp_path / "config.yaml"
    config.write_text(f"hook_log: {hook_log}\n")
    _run(_command(toy, tmp_path, "--custom-generate-function-path", "hook_plugin.generate",
                  "--custom-rollout-log-function-path", "hook_plugin.log_rollout",
                  "--custom-eval-rollout-log-function-path", "hook_plugin.log_eval",
                  "--custom-advantage-function-path", "hook_plugin.first_token_advantage",
                  "--calculate-per-token-loss", "--custom-config-path", str(config),
                  "--eval-prompt-data", "toy", str(toy / "eval.jsonl"), "--eval-interval", "2",
                  "--n-samples-per-eval-prompt", "2", steps=2), _env(plugins))
    calls = [json.loads(line) for line in hook_log.read_text().splitlines()]
    rollouts = [c for c in calls if c["kind"] == "rollout"]
    evals = [c for c in calls if c["kind"] == "eval"]
    assert [c["rollout_id"] for c in rollouts] == [0, 1]
    for c in rollouts:
        assert c["n"] == 16 and c["time"] > 0 and c["evaluation"] == [False]
        assert "rollout/raw_reward" in c["extra"]  # the rollout function's metrics
    assert [c["rollout_id"] for c in evals] == [0, 2]
    for c in evals:  # eval went through generate_and_rm_group with the plugin, evaluation=True
        assert c["sets"] == {"toy": {"samples": 8, "rewards": 8, "truncated": 8, "evaluation": [True]}}

    records = _train_records(tmp_path)
    for step, record in records.items():
        assert record["hook/n_samples"] == 16.0
        assert "hook/note" not in record
        assert "rollout/raw_reward" in record  # a dict return keeps the default metrics
        # ratio 1 (one optimizer step, old log-probs recomputed): token-mean loss = -0.25 x samples / tokens
        assert record["train/loss"] == pytest.approx(-0.25 * 16 / record["train/tokens"], abs=1e-5), step
    lines = (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()
    eval_records = [json.loads(line) for line in lines if '"kind": "eval"' in line]
    assert [e["step"] for e in eval_records] == [0, 2]
    for e in eval_records:  # True from the eval hook: the default eval/toy metrics are skipped
        assert "eval/toy" not in e and e["eval/time_s"] > 0
