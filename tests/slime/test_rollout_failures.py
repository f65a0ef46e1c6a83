"""How the default rollout function meets failing groups: engine trouble is retried after an engine check,
a bug in generate or reward code fails the step at once with the plugin's own exception."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys

import pytest

from slime.arguments import parse_args
from slime.models.tiny import build_tiny_model
from slime.rollout.data_source import RolloutDataSourceWithBuffer, load_prompts
from slime.rollout.sglang_rollout import GenerateState, RolloutFailedError, play_rollout

PLUGIN = '''
CALLS = {"generate": 0, "reward": 0}
FLAKY = {"left": 0}


async def generate(args, sample, sampling_params):
    """No engine: two fixed response tokens; raises ConnectionError while FLAKY["left"] > 0 (an engine blip)."""
    CALLS["generate"] += 1
    if FLAKY["left"] > 0:
        FLAKY["left"] -= 1
        raise ConnectionError("engine connection reset")
    sample.append_response_tokens(args, [5, 6], [-0.1, -0.2], meta_info={"finish_reason": {"type": "stop"}},
                                  text="ab")
    return sample


async def reward(args, sample):
    CALLS["reward"] += 1
    return float(sample.index % 2)


async def reward_with_a_typo(args, sample):
    CALLS["reward"] += 1
    return float(sample.metdata["prompt_index"])  # the typo a researcher makes


async def reward_missing_a_field(args, sample):
    """Fails on one prompt only (a record without the field the reward needs)."""
    CALLS["reward"] += 1
    return 1.0 if sample.metadata["prompt_index"] else {}["label"]
'''


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    module = f"failing_rollout_plugin_{tmp_path.name.replace('-', '_')}"  # plugins are loaded once per path
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    build_tiny_model(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"prompt {i}", "label": 1}) + "\n" for i in range(6)))

    def make(reward: str, *extra: str):
        GenerateState.clear_instances()
        args = parse_args(["--hf-checkpoint", str(tmp_path / "model"), "--prompt-data", str(data),
                           "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1",
                           "--custom-generate-function-path", f"{module}.generate",
                           "--custom-rm-path", f"{module}.{reward}", *extra])
        args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", 1  # never posted to
        source = RolloutDataSourceWithBuffer(load_prompts(args, data, GenerateState(args).tokenizer), 2,
                                             shuffle=False, seed=0, args=args)
        return args, source, importlib.import_module(module)

    yield make
    sys.modules.pop(module, None)


def _run(args, source):
    checks: list[list[BaseException]] = []

    async def on_failure(errors: list[BaseException]) -> None:
        checks.append(errors)

    return asyncio.run(play_rollout(args, 0, source, on_failure=on_failure)), checks


def test_an_engine_blip_is_retried_after_an_engine_check(setup):
    args, source, plugin = setup("reward")
    plugin.FLAKY["left"] = 1
    out, checks = _run(args, source)
    assert len(checks) == 1 and isinstance(checks[0][0], ConnectionError)
    assert len(out.samples) == 2 and all(len(g) == 2 for g in out.samples)


def test_a_bug_in_the_reward_fails_the_step_at_once(setup):
    args, source, plugin = setup("reward_with_a_typo")
    with pytest.raises(RolloutFailedError, match="AttributeError: 'Sample' object has no attribute 'metdata'") as info:
        _run(args, source)
    assert isinstance(info.value.__cause__, AttributeError)  # the plugin's traceback comes with it
    assert plugin.CALLS["generate"] == 4  # one round of 2 groups x 2 samples, no retry, no engine check


def test_a_record_the_reward_cannot_handle_is_retried_without_an_engine_check(setup):
    """One group of the round raises a code error, the other succeeds: not a bug in every call, so the step
    goes on (the group is retried, then replaced), and the engines are never suspected."""
    args, source, plugin = setup("reward_missing_a_field")
    out, checks = _run(args, source)
    assert checks == []
    assert out.metrics["rollout/prompt_indices"] == [1, 2]  # prompt 0 failed twice; prompt 2 filled its place
