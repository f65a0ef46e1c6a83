"""No silent zeros: what a generate function returns is checked against the contract before reward and training,
samples a plugin builds afresh keep their group, and upstream's per-process rollout state and hooks behave as
upstream's plugins expect (`GenerateState`, `generate_rollout` as a plain function, the reward post-process and
the rollout sample hooks)."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import re
import sys
from pathlib import Path

import pytest

from slime.algorithms.estimators import build_train_batch
from slime.arguments import parse_args
from slime.models.tiny import build_tiny_model
from slime.rollout.base_types import RolloutFnTrainOutput, call_rollout_fn
from slime.rollout.data_source import RolloutDataSourceWithBuffer, load_prompts
from slime.rollout.sglang_rollout import (
    GenerateState,
    PluginContractError,
    generate_and_rm_group,
    generate_rollout,
)
from slime.utils.async_utils import get_async_loop
from slime.utils.types import Sample

# Generate functions in upstream's style. `fresh` builds new Samples, as tau-bench's res_to_sample does: no
# group_index, no index. The broken ones each break one rule of the contract.
PLUGIN = '''
import asyncio

from slime.utils.types import Sample


async def fresh(args, sample, sampling_params):
    out = Sample(prompt=sample.prompt, tokens=list(sample.tokens) + [7, 8], response="xy", response_length=2,
                 loss_mask=[1, 1], rollout_log_probs=[-0.5, -0.5], status=Sample.Status.COMPLETED)
    out.metadata = dict(sample.metadata)
    return out


async def reward(args, sample):
    return float(sample.index % 2)


async def returns_a_dict(args, sample, sampling_params):
    return {"tokens": [1, 2]}


async def short_mask(args, sample, sampling_params):
    sample.append_response_tokens(args, [5, 6], [-0.1, -0.2], meta_info={"finish_reason": {"type": "stop"}})
    sample.loss_mask = [1]
    return sample


async def text_reward(args, sample, sampling_params):
    sample.append_response_tokens(args, [5], [-0.1], meta_info={"finish_reason": {"type": "stop"}})
    sample.reward = "1.0"
    return sample


async def plain(args, sample, sampling_params):
    args.loops_seen = getattr(args, "loops_seen", set()) | {id(asyncio.get_running_loop())}
    sample.append_response_tokens(args, [5, 6], [-0.1, -0.2], meta_info={"finish_reason": {"type": "stop"}},
                                  text="ab")
    return sample


def mark_last(args, groups):
    for group in groups:
        group[-1].remove_sample = True


def count_all(args, all_groups, data_source):
    args.all_groups_seen = [[s.index for s in g] for g in all_groups]


def tag(args, sample, rollout_id=None):
    sample.metadata["tagged_at"] = rollout_id  # changes in place, returns None


async def replace(args, sample, **kwargs):
    fresh = sample.__class__(**{**sample.__dict__, "metadata": {**sample.metadata, "seen": sorted(kwargs)}})
    fresh.reward = 0.5 if kwargs["evaluation"] else None
    return fresh


def not_a_sample(args, sample):
    return {"tokens": sample.tokens}


def plus_one(args, samples):
    raw = [s.reward for s in samples]
    return raw, [r + 1.0 for r in raw]
'''


@pytest.fixture()
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    module = f"contract_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    GenerateState.clear_instances()
    yield module
    GenerateState.clear_instances()
    sys.modules.pop(module, None)


def _args(*extra: str) -> argparse.Namespace:
    return parse_args(["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "2",
                       "--n-samples-per-prompt", "2", "--num-rollout", "1", *extra])


def _group(group_index: int, n: int = 2) -> list[Sample]:
    return [Sample(group_index=group_index, index=group_index * 10 + i, prompt=f"p{group_index}", tokens=[1, 2, 3],
                   metadata={"prompt_index": group_index}) for i in range(n)]


def test_fresh_samples_keep_their_group_so_grpo_sees_the_reward_difference(plugin):
    """Before: the fresh samples had group_index None, each was a group of one, and GRPO gave 0 to both."""
    args = _args("--custom-generate-function-path", f"{plugin}.fresh", "--custom-rm-path", f"{plugin}.reward")
    samples = asyncio.run(generate_and_rm_group(args, _group(3), {"max_new_tokens": 4}))
    assert [s.group_index for s in samples] == [3, 3] and [s.index for s in samples] == [30, 31]
    assert [s.reward for s in samples] == [0.0, 1.0]
    _, advantages = build_train_batch(args, [samples])
    assert advantages[0] < 0 < advantages[1]


def test_samples_without_a_group_are_grouped_by_their_list_or_prompt():
    def rollout(args, rollout_id, data_source, evaluation=False):
        groups = [[Sample(prompt="a", reward=r, tokens=[1, 2], response_length=1) for r in (0.0, 1.0)],
                  [Sample(prompt="b", reward=r, tokens=[1, 2], response_length=1) for r in (1.0, 1.0)]]
        return groups if rollout_id == 0 else [s for g in groups for s in g]  # nested, then flat

    for rollout_id in (0, 1):
        out = call_rollout_fn(rollout, None, rollout_id, None, evaluation=False)
        assert [[s.prompt for s in g] for g in out.samples] == [["a", "a"], ["b", "b"]]
        keys = [{s.group_index for s in g} for g in out.samples]
        assert all(len(k) == 1 and None not in k for k in keys) and keys[0] != keys[1]
        _, advantages = build_train_batch(_args(), out.samples)
        assert advantages[0] < 0 < advantages[1] and advantages[2:] == [0.0, 0.0]


@pytest.mark.parametrize(("name", "message"), [
    ("returns_a_dict", "returned dict; it must return a Sample or a non-empty list of Samples"),
    ("short_mask", "loss_mask must hold one entry per response token (2), got 1"),
    ("text_reward", "reward must be None, a number or a dict, got str"),
])
def test_a_contract_violation_names_the_plugin(plugin, name, message):
    args = _args("--custom-generate-function-path", f"{plugin}.{name}", "--custom-rm-path", f"{plugin}.reward")
    with pytest.raises(PluginContractError, match=f"generate function {plugin}.{name} .*{re.escape(message)}"):
        asyncio.run(generate_and_rm_group(args, _group(0), {"max_new_tokens": 4}))


def test_generate_state_is_upstreams_singleton(plugin):
    args = _args("--sglang-server-concurrency", "3")
    state = GenerateState(args)
    assert GenerateState(_args()) is state and state.semaphore._value == 3 and state.processor is None
    assert (state.aborted, state.remaining_batch_size, state.pendings) == (False, 0, set())
    with state.dp_rank_context() as rank:
        assert rank == 0 and state.dp_counts == [1]
    assert state.dp_counts == [0]
    state.aborted, state.remaining_batch_size = True, 5
    state.reset()  # upstream's meaning: clear the per-step fields, keep the object
    assert (state.aborted, state.remaining_batch_size) == (False, 0) and GenerateState(args) is state
    GenerateState.clear_instances()
    assert GenerateState(args) is not state


def test_an_aborting_step_ends_waiting_samples_without_a_request(plugin):
    args = _args("--custom-generate-function-path", f"{plugin}.returns_a_dict")  # would fail if called
    GenerateState(args).aborted = True
    group = _group(0)
    assert asyncio.run(generate_and_rm_group(args, group, {})) is group  # upstream: the group comes back as is
    from slime.rollout.sglang_rollout import generate_and_rm

    out = asyncio.run(generate_and_rm(args, _group(0)[0], {}))
    assert out.status == Sample.Status.ABORTED and out.response_length == 0


def test_generate_rollout_is_a_plain_function_with_upstreams_hooks(plugin, tmp_path):
    build_tiny_model(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"prompt {i}"}) + "\n" for i in range(4)))
    args = _args("--hf-checkpoint", str(tmp_path / "model"), "--prompt-data", str(data),
                 "--custom-generate-function-path", f"{plugin}.plain", "--custom-rm-path", f"{plugin}.reward",
                 "--rollout-sample-filter-path", f"{plugin}.mark_last",
                 "--rollout-all-samples-process-path", f"{plugin}.count_all")
    args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", 1  # never posted to
    source = RolloutDataSourceWithBuffer(load_prompts(args, data, GenerateState(args).tokenizer), 2,
                                         shuffle=False, seed=0, args=args)
    assert not inspect.iscoroutinefunction(generate_rollout)
    assert list(inspect.signature(generate_rollout).parameters) == ["args", "rollout_id", "data_source", "evaluation"]
    out = generate_rollout(args, 0, source)
    assert isinstance(out, RolloutFnTrainOutput) and len(out.samples) == 2
    assert [[s.remove_sample for s in g] for g in out.samples] == [[False, True], [False, True]]
    assert sorted(map(sorted, args.all_groups_seen)) == sorted(sorted(s.index for s in g) for g in out.samples)
    assert args.loops_seen == {id(get_async_loop().loop)}  # every generate ran on the one rollout loop
    samples, _ = build_train_batch(args, out.samples)
    assert [s.loss_mask for s in samples][1] == [0, 0]  # remove_sample: kept in the batch, not learnt


def test_reward_post_process_replaces_the_group_normalisation(plugin):
    samples = _group(0, n=3)
    for s, r in zip(samples, (0.0, 1.0, 2.0), strict=True):
        s.append_response_tokens(None, [5], [-0.1])
        s.reward = r
    _, plain = build_train_batch(_args(), [samples])
    assert plain == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)  # (r - mean) / std
    _, hooked = build_train_batch(_args("--custom-reward-post-process-path", f"{plugin}.plus_one"), [samples])
    assert hooked == [1.0, 2.0, 3.0]  # the hook's rewards, used as they are (upstream's meaning)


def test_sample_hooks_see_each_generated_sample_before_its_reward(plugin, tmp_path):
    build_tiny_model(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"prompt {i}"}) + "\n" for i in range(4)))
    args = _args("--hf-checkpoint", str(tmp_path / "model"), "--prompt-data", str(data),
                 "--custom-generate-function-path", f"{plugin}.plain", "--custom-rm-path", f"{plugin}.reward",
                 "--rollout-sample-hook-path", f"{plugin}.tag", "--rollout-sample-hook-path", f"{plugin}.replace")
    args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", 1  # never posted to
    source = RolloutDataSourceWithBuffer(load_prompts(args, data, GenerateState(args).tokenizer), 2,
                                         shuffle=False, seed=0, args=args)
    out = generate_rollout(args, 7, source)
    for s in (s for g in out.samples for s in g):
        assert s.metadata["tagged_at"] == 7 and s.metadata["seen"] == ["evaluation", "rollout_id"]
        assert s.reward == float(s.index % 2)  # the reward ran after the hooks (replace cleared it)
    args.rollout_sample_hook_path = [f"{plugin}.not_a_sample"]
    with pytest.raises(TypeError, match=f"rollout sample hook {plugin}.not_a_sample returned dict"):
        asyncio.run(generate_and_rm_group(args, _group(0), {"max_new_tokens": 4}))
