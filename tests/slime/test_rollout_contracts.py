"""slime's rollout import paths and plugin signatures (docs/trainer.md, slime's contracts), and the
behaviour of the pieces plugins call: pop_first, the sample buffer, call_rollout_fn, the filters."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect

import pytest

from slime.arguments import parse_args
from slime.rollout.base_types import (
    RolloutFnEvalOutput,
    RolloutFnTrainOutput,
    call_rollout_fn,
    expect_output,
    normalize_rollout_output,
)
from slime.rollout.data_source import (
    DataSource,
    Prompt,
    PromptDataSource,
    RolloutDataSource,
    RolloutDataSourceWithBuffer,
    pop_first,
)
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.filter_hub.dynamic_sampling_filters import (
    check_reward_nonzero_std,
    check_reward_nonzero_std_with_fallback,
)
from slime.rollout.sglang_rollout import GenerateState, engine_url, get_model_url
from slime.utils.async_utils import get_async_loop
from slime.utils.types import Sample

CONTRACT_PATHS = {
    "slime.rollout.sglang_rollout": ["GenerateState", "generate", "generate_and_rm", "generate_and_rm_group",
                                     "generate_rollout", "get_model_url"],
    "slime.rollout.base_types": ["RolloutFnTrainOutput", "RolloutFnEvalOutput", "call_rollout_fn"],
    "slime.rollout.data_source": ["DataSource", "RolloutDataSource", "RolloutDataSourceWithBuffer", "pop_first"],
    "slime.rollout.filter_hub.base_types": ["DynamicFilterOutput"],
    "slime.rollout.filter_hub.dynamic_sampling_filters": ["check_reward_nonzero_std",
                                                          "check_reward_nonzero_std_with_fallback"],
    "slime.rollout.rm_hub": ["async_rm", "batched_async_rm"],
}


def _args(*extra: str) -> argparse.Namespace:
    return parse_args(["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "2",
                       "--n-samples-per-prompt", "2", "--num-rollout", "1", *extra])


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _group(gi: int, *rewards: float) -> list[Sample]:
    return [Sample(group_index=gi, index=gi * 10 + i, reward=r) for i, r in enumerate(rewards)]


@pytest.fixture(autouse=True)
def _fresh_generate_state():
    GenerateState.clear_instances()
    yield
    GenerateState.clear_instances()


@pytest.mark.parametrize("module", sorted(CONTRACT_PATHS))
def test_contract_import_paths(module):
    mod = importlib.import_module(module)
    for name in CONTRACT_PATHS[module]:
        assert hasattr(mod, name), f"{module}.{name}"


def test_old_package_level_imports_still_work():
    from slime.rollout import Prompt as P
    from slime.rollout import PromptDataSource as PDS
    from slime.rollout import check_reward_nonzero_std as crns
    from slime.rollout import eval_rollout, generate, generate_rollout, load_prompts  # noqa: F401

    assert PDS is RolloutDataSource is PromptDataSource and P is Prompt and crns is check_reward_nonzero_std


def test_plugin_signatures():
    from slime.rollout import rm_hub, sglang_rollout

    assert _params(sglang_rollout.generate_rollout)[:4] == ["args", "rollout_id", "data_source", "evaluation"]
    assert inspect.signature(sglang_rollout.generate_rollout).parameters["evaluation"].default is False
    assert _params(sglang_rollout.generate)[:3] == ["args", "sample", "sampling_params"]
    assert inspect.iscoroutinefunction(sglang_rollout.generate)
    assert _params(sglang_rollout.generate_and_rm)[:4] == ["args", "sample", "sampling_params", "evaluation"]
    assert _params(sglang_rollout.generate_and_rm_group)[:4] == ["args", "group", "sampling_params", "evaluation"]
    assert _params(pop_first) == ["args", "rollout_id", "buffer", "num_samples"]
    for fn in (check_reward_nonzero_std, check_reward_nonzero_std_with_fallback):
        params = inspect.signature(fn).parameters
        assert list(params)[:2] == ["args", "samples"] and any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert inspect.iscoroutinefunction(rm_hub.async_rm) and inspect.iscoroutinefunction(rm_hub.batched_async_rm)
    assert _params(rm_hub.async_rm)[:2] == ["args", "sample"]
    assert _params(rm_hub.batched_async_rm) == ["args", "samples"]
    out = DynamicFilterOutput(keep=False)
    assert (out.reason, out.keep_when_insufficient) == (None, False)
    assert RolloutFnTrainOutput(samples=[]).metrics is None and RolloutFnEvalOutput(data={}).metrics is None
    assert {"get_samples", "add_samples", "save", "load", "__len__"} <= DataSource.__abstractmethods__
    assert issubclass(RolloutDataSourceWithBuffer, RolloutDataSource) and issubclass(RolloutDataSource, DataSource)
    assert _args().rollout_function_path == "slime.rollout.sglang_rollout.generate_rollout"


def test_generate_state_is_a_singleton_built_from_args():
    args = _args("--sglang-server-concurrency", "3", "--rollout-max-response-len", "7", "--rollout-stop", "x")
    args.rollout_engine_urls = ["http://a", "http://b"]
    state = GenerateState(args)
    assert GenerateState(_args()) is state
    assert state.semaphore._value == 6  # concurrency x engines
    assert state.processor is None
    p = state.sampling_params
    assert (p["max_new_tokens"], p["stop"], p["no_stop_trim"], p["spaces_between_special_tokens"]) == (7, ["x"], True, False)
    GenerateState.clear_instances()
    args = _args("--sglang-server-concurrency", "5", "--rollout-num-gpus", "4")
    assert GenerateState(args).semaphore._value == 20  # before the engines start: GPUs / GPUs per engine


def test_generate_state_tokenizer_from_hf_checkpoint(tmp_path):
    from slime.models.tiny import build_tiny_model

    build_tiny_model(tmp_path / "model")
    state = GenerateState(_args("--hf-checkpoint", str(tmp_path / "model")))
    assert state.tokenizer is state.tokenizer
    assert state.tokenizer("hi", add_special_tokens=False)["input_ids"]


def test_engine_url_spreads_groups_and_get_model_url_keeps_upstreams_meaning():
    args = _args("--sglang-router-ip", "10.0.0.1", "--sglang-router-port", "30000")
    assert engine_url(args) == "http://10.0.0.1:30000"
    args.rollout_engine_urls = ["http://e0", "http://e1"]
    assert engine_url(args, Sample(group_index=3)) == "http://e1"
    assert engine_url(args) == "http://10.0.0.1:30000"
    with pytest.raises(RuntimeError, match="no engine address"):
        engine_url(_args())
    # upstream: get_model_url(args, model_name, endpoint="/generate") -> a full URL; unknown names: the router
    assert get_model_url(args, "actor") == "http://10.0.0.1:30000/generate"
    args.sglang_model_routers = {"ref": ("10.0.0.2", 31000)}
    assert get_model_url(args, "ref", "/health") == "http://10.0.0.2:31000/health"
    assert list(inspect.signature(get_model_url).parameters) == ["args", "model_name", "endpoint"]


def test_pop_first_takes_the_oldest_groups_in_place():
    buffer = [_group(0, 1.0), _group(1, 0.0), _group(2, 1.0)]
    taken = pop_first(None, 5, buffer, 2)
    assert [g[0].group_index for g in taken] == [0, 1]
    assert [g[0].group_index for g in buffer] == [2]
    assert [g[0].group_index for g in pop_first(None, 5, buffer, 9)] == [2] and buffer == []
    assert pop_first(None, 5, buffer, 3) == []


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(i, f"p{i}", [i + 1], None, {}) for i in range(n)]


def test_buffer_groups_are_served_first_then_fresh_prompts():
    source = RolloutDataSourceWithBuffer(_prompts(4), 2, shuffle=False, seed=0)
    first = source.get_samples(2)
    assert [g[0].metadata["prompt_index"] for g in first] == [0, 1] and len(first[0]) == 2
    source.add_samples([first[1]])
    assert source.get_buffer_length() == 1
    groups = source.get_samples(2)
    assert groups[0] is first[1]  # the put-back group, unchanged
    assert groups[1][0].metadata["prompt_index"] == 2 and groups[1][0].group_index == 2
    assert source.get_buffer_length() == 0
    with pytest.raises(TypeError):
        source.add_samples([Sample()])  # groups, not samples


def test_buffer_filter_from_args_and_state_round_trip(tmp_path):
    calls = []

    def newest_first(args, rollout_id, buffer, num_samples):
        calls.append((args, rollout_id, num_samples))
        return [buffer.pop() for _ in range(min(num_samples, len(buffer)))]

    args = _args()
    source = RolloutDataSourceWithBuffer(_prompts(3), 1, shuffle=True, seed=3, args=args, buffer_filter=newest_first,
                                         save_dir=tmp_path)
    source.add_samples([_group(7, 1.0), _group(8, 0.5)])
    assert [g[0].group_index for g in source.get_samples(1)] == [8]
    assert calls == [(args, None, 1)]
    source.save(4)
    assert (tmp_path / "rollout" / "global_dataset_state_dict_4.pt").is_file()
    restored = RolloutDataSourceWithBuffer(_prompts(3), 1, shuffle=True, seed=3, save_dir=tmp_path)
    restored.load()
    assert restored.state() == source.state()
    assert restored.buffer[0][0].reward == 1.0
    assert [g[0].prompt for g in restored.get_samples(3)] == [g[0].prompt for g in source.get_samples(3)]


def test_plain_data_source_has_no_buffer():
    with pytest.raises(NotImplementedError):
        RolloutDataSource(_prompts(1), 1, shuffle=False, seed=0).add_samples([_group(0, 1.0)])
    with pytest.raises(ValueError, match="save_dir"):
        RolloutDataSource(_prompts(1), 1, shuffle=False, seed=0).save(0)


def test_call_rollout_fn_normalises_outputs():
    groups = [_group(0, 1.0, 0.0), _group(1, 1.0, 1.0)]

    def legacy_sync(args, rollout_id, data_source, evaluation=False):
        with pytest.raises(RuntimeError):
            asyncio.get_running_loop()  # a plain call (upstream's contract): no loop around it
        return groups

    async def modern(args, rollout_id, data_source, evaluation=False):  # ours: run on the rollout loop
        assert asyncio.get_running_loop() is get_async_loop().loop
        if evaluation:
            return RolloutFnEvalOutput(data={"toy": {"rewards": [1.0], "truncated": [False], "samples": []}})
        return RolloutFnTrainOutput(samples=groups, metrics={"m": 1.0})

    def flat(args, rollout_id, data_source, evaluation=False):
        return [s for g in groups for s in g]

    def legacy_eval(args, rollout_id, data_source, evaluation=False):
        return {"toy": {"rewards": [0.0], "truncated": [True], "samples": []}}

    out = call_rollout_fn(legacy_sync, None, 0, None, evaluation=False)
    assert isinstance(out, RolloutFnTrainOutput) and out.samples == groups and out.metrics is None
    out = call_rollout_fn(modern, None, 0, None, evaluation=False)
    assert out.samples == groups and out.metrics == {"m": 1.0}
    out = call_rollout_fn(flat, None, 0, None, evaluation=False)
    assert [[s.index for s in g] for g in out.samples] == [[0, 1], [10, 11]]
    out = call_rollout_fn(modern, None, 0, None, evaluation=True)
    assert isinstance(out, RolloutFnEvalOutput) and out.data["toy"]["rewards"] == [1.0]
    out = call_rollout_fn(legacy_eval, None, 0, None, evaluation=True)
    assert isinstance(out, RolloutFnEvalOutput) and out.data["toy"]["truncated"] == [True]
    with pytest.raises(TypeError):
        normalize_rollout_output([[1, 2]], evaluation=False)
    with pytest.raises(TypeError):
        normalize_rollout_output(groups, evaluation=True)
    mismatched = normalize_rollout_output(RolloutFnEvalOutput(data={}), evaluation=False)  # upstream: passed through
    with pytest.raises(TypeError, match="rollout function my.fn returned RolloutFnEvalOutput for a training call"):
        expect_output(mismatched, evaluation=False, path="my.fn")


def test_fallback_filter_keeps_zero_std_groups_when_insufficient():
    args = _args()
    varied, flat = _group(0, 1.0, 0.0), _group(1, 0.5, 0.5)
    assert check_reward_nonzero_std_with_fallback(args, varied) == DynamicFilterOutput(keep=True)
    out = check_reward_nonzero_std_with_fallback(args, flat)
    assert (out.keep, out.reason, out.keep_when_insufficient) == (False, "zero_std_0.5", True)
    plain = check_reward_nonzero_std(args, flat)
    assert (plain.keep, plain.keep_when_insufficient) == (False, False)
    keyed = _args("--reward-key", "acc")
    group = [Sample(reward={"acc": 1.0}), Sample(reward={"acc": 1.0})]
    assert check_reward_nonzero_std_with_fallback(keyed, group).reason == "zero_std_1.0"


FAKE_PLUGIN = '''
async def generate(args, sample, sampling_params):
    """No engine: two fixed response tokens."""
    sample.append_response_tokens(args, [5, 6], [-0.1, -0.2], meta_info={"finish_reason": {"type": "stop"}},
                                  text="ab")
    return sample


async def reward(args, sample):
    """Even prompts: rewards differ within the group; odd prompts: all 1.0 (zero std)."""
    return float(sample.index % 2) if sample.metadata["prompt_index"] % 2 == 0 else 1.0
'''


def test_generate_rollout_with_a_generate_plugin(tmp_path, monkeypatch):
    """The default rollout function end to end, no engine: filter, fallback, put-back, eval output."""
    import json

    from slime.models.tiny import build_tiny_model
    from slime.rollout.data_source import load_prompts
    from slime.rollout.sglang_rollout import generate_rollout

    GenerateState.clear_instances()
    (tmp_path / "fake_rollout_plugin.py").write_text(FAKE_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    build_tiny_model(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"prompt {i}"}) + "\n" for i in range(6)))
    args = _args("--hf-checkpoint", str(tmp_path / "model"), "--prompt-data", str(data),
                 "--over-sampling-batch-size", "3", "--eval-prompt-data", "toy", str(data),
                 "--custom-generate-function-path", "fake_rollout_plugin.generate",
                 "--custom-rm-path", "fake_rollout_plugin.reward",
                 "--dynamic-sampling-filter-path",
                 "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback")
    args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", 1  # never posted to
    source = RolloutDataSourceWithBuffer(load_prompts(args, data, GenerateState(args).tokenizer), 2,
                                         shuffle=False, seed=0, args=args)

    out = generate_rollout(args, 0, source)  # upstream's plain function: runs on the rollout loop
    assert isinstance(out, RolloutFnTrainOutput)
    # Round 1: prompts 0, 1, 2 -> 0 and 2 kept (1 has zero std); 2 groups were wanted.
    assert out.metrics["rollout/prompt_indices"] == [0, 2]
    assert out.metrics["rollout/dynamic_filter/drop_zero_std_1.0"] == 1.0
    assert all(s.response_length == 2 and s.status == Sample.Status.COMPLETED for g in out.samples for s in g)

    out = generate_rollout(args, 1, source)  # the same loop, the same GenerateState
    # Round 2: prompts 3, 4, 5 -> only 4 kept, 3 and 5 dropped but kept when insufficient.
    assert out.metrics["rollout/prompt_indices"] == [3, 4]

    ev = generate_rollout(args, 1, source, evaluation=True)
    GenerateState.clear_instances()
    assert isinstance(ev, RolloutFnEvalOutput) and set(ev.data) == {"toy"}
    assert len(ev.data["toy"]["samples"]) == 6 and ev.data["toy"]["truncated"] == [False] * 6
