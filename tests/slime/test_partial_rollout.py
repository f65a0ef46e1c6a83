"""`--partial-rollout` (upstream slime's): requests aborted when a step's batch is full keep their tokens and
are continued next step, their earlier tokens marked off-policy. Through the real rollout and CPU engine,
then through `python -m slime.train`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_train_loop import _command, _env, _run, _train_records, toy  # noqa: F401 - toy is a fixture

from slime.arguments import parse_args
from slime.engine.cpu_server import CPUEngine
from slime.models.tiny import build_tiny_model
from slime.rollout.data_source import RolloutDataSourceWithBuffer, load_prompts
from slime.rollout.sglang_rollout import GenerateState, generate_rollout
from slime.utils.types import Sample

# Odd prompts would decode 4,000 tokens on their first try, even ones 3; a sample that already has a response
# (a continued partial one) gets 1 token more. So in a step of one group, the even prompt fills the batch while
# the odd one is mid-reply, and next step the continued odd one finishes first.
PLUGIN = '''
from slime.rollout import sglang_rollout


async def generate(args, sample, sampling_params):
    if sample.response_length:
        budget = sample.response_length + 1
    else:
        budget = 4000 if sample.metadata["prompt_index"] % 2 == 1 else 3
    return await sglang_rollout.generate(args, sample, dict(sampling_params, ignore_eos=True, max_new_tokens=budget))


async def reward(args, sample):
    return float(sample.index % 2)
'''


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("partial") / "tiny", seed=0)


@pytest.fixture()
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    module = f"partial_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module
    sys.modules.pop(module, None)


def test_aborted_requests_keep_their_tokens_and_continue_next_step(model_dir, tmp_path, plugin):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"prompt {i}"}) + "\n" for i in range(4)))
    GenerateState.clear_instances()
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", str(data), "--num-rollout", "2",
                       "--n-samples-per-prompt", "2", "--rollout-batch-size", "1", "--over-sampling-batch-size", "2",
                       "--rollout-max-response-len", "4096", "--partial-rollout",
                       "--mask-offpolicy-in-partial-rollout", "--custom-generate-function-path", f"{plugin}.generate",
                       "--custom-rm-path", f"{plugin}.reward"])
    source = RolloutDataSourceWithBuffer(load_prompts(args, data, GenerateState(args).tokenizer), 2,
                                         shuffle=False, seed=0, args=args)
    engine = CPUEngine(str(model_dir), port=0, seed=0)
    args.rollout_engine_urls = [engine.start()]
    try:
        first = generate_rollout(args, 0, source)  # upstream's plain call: runs on the rollout loop
        assert first.metrics["rollout/prompt_indices"] == [0]
        assert first.metrics["rollout/partial_samples_carried"] == 2.0
        assert first.metrics["rollout/partial_samples_trained"] == 0.0
        (carried,) = source.buffer  # prompt 1's group, half generated, waits in the buffer
        assert [s.metadata["prompt_index"] for s in carried] == [1, 1]
        before = [(list(s.tokens), list(s.rollout_log_probs or []), s.response_length) for s in carried]
        for s in carried:
            assert s.status == Sample.Status.ABORTED and s.reward is None
            assert s.response_length > 0  # decoded beside prompt 0 until the abort
            assert s.metadata["start_rollout_id"] == 0 and s.metadata["partial_tokens"] == s.response_length

        second = generate_rollout(args, 1, source)
    finally:
        engine.shutdown()
        GenerateState.clear_instances()
    assert second.metrics["rollout/prompt_indices"][0] == 1  # the carried group is served first
    group = next(g for g in second.samples if g[0].metadata["prompt_index"] == 1)
    assert second.metrics["rollout/partial_samples_trained"] == 2.0
    old_tokens = sum(n for *_, n in before)
    trained_tokens = sum(s.response_length for g in second.samples for s in g)
    assert second.metrics["rollout/offpolicy_token_ratio"] == pytest.approx(old_tokens / trained_tokens)
    for s, (tokens, log_probs, k) in zip(group, before, strict=True):
        assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and s.reward is not None
        assert s.response_length == k + 1  # continued where it stopped, not restarted
        assert s.tokens[: len(tokens)] == tokens and s.rollout_log_probs[:k] == log_probs
        assert s.loss_mask == [0] * k + [1]  # --mask-offpolicy-in-partial-rollout: old tokens not learnt
        assert s.metadata["start_rollout_id"] == 0


def test_without_the_flag_aborted_groups_are_dropped_and_their_prompts_come_back(model_dir, tmp_path, plugin):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"prompt {i}"}) + "\n" for i in range(4)))
    GenerateState.clear_instances()
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", str(data), "--num-rollout", "1",
                       "--n-samples-per-prompt", "2", "--rollout-batch-size", "1", "--over-sampling-batch-size", "2",
                       "--rollout-max-response-len", "4096", "--custom-generate-function-path", f"{plugin}.generate",
                       "--custom-rm-path", f"{plugin}.reward"])
    source = RolloutDataSourceWithBuffer(load_prompts(args, data, GenerateState(args).tokenizer), 2,
                                         shuffle=False, seed=0, args=args)
    engine = CPUEngine(str(model_dir), port=0, seed=0)
    args.rollout_engine_urls = [engine.start()]
    try:
        out = generate_rollout(args, 0, source)
    finally:
        engine.shutdown()
        GenerateState.clear_instances()
    assert out.metrics["rollout/partial_samples_carried"] == 0.0 and source.buffer == []
    assert source.pending == [1]


def test_partial_rollout_through_the_trainer(toy, tmp_path):  # noqa: F811 - fixture
    """Two steps of `python -m slime.train --partial-rollout`: step 0 carries the odd prompts' groups, step 1
    trains them with their earlier tokens masked out, and the log-prob gate holds on what is learnt."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "partial_train_plugin.py").write_text(PLUGIN)
    _run(_command(toy, tmp_path, "--custom-generate-function-path", "partial_train_plugin.generate",
                  "--rollout-max-response-len", "4096", "--rollout-batch-size", "1", "--n-samples-per-prompt", "2",
                  "--over-sampling-batch-size", "2", "--partial-rollout", "--mask-offpolicy-in-partial-rollout",
                  "--custom-rm-path", "partial_train_plugin.reward", steps=2), _env(plugins), timeout=240)
    records = _train_records(tmp_path)
    assert records[0]["rollout/partial_samples_carried"] == 2.0
    assert records[1]["rollout/partial_samples_trained"] == 2.0
    assert 0 < records[1]["rollout/offpolicy_token_ratio"] < 1
    assert records[1]["train/train_rollout_logprob_abs_diff"] < 1e-5
