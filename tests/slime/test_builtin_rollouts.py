"""slime's built-in rollout modules that run without a GPU, and `slime.utils.mask_utils`:

- loss masks from Qwen3's own chat template (read in place from ../shared/qwen3) with Qwen's vocabulary,
  and from the tiny model's template;
- `sft_rollout.generate_rollout`, `sleep_rollout.sleep`, `fully_async_rollout.generate_rollout_fully_async`
  (against the real CPU engine, and 2 steps of `python -m slime.train`), `on_policy_distillation`
  (the CPU engine as the teacher).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import threading
import time
from pathlib import Path

import pytest
from test_train_loop import _env, _run

from slime.arguments import parse_args
from slime.backends.torch_backend import TorchTrainer
from slime.models.qwen_vocab import build_qwen_tokenizer
from slime.models.tiny import build_tiny_model
from slime.rollout import fully_async_rollout, on_policy_distillation, sft_rollout, sleep_rollout
from slime.rollout.data_source import Prompt, RolloutDataSourceWithBuffer
from slime.rollout.sglang_rollout import GenerateState, generate
from slime.utils.async_utils import run
from slime.utils.mask_utils import MultiTurnLossMaskGenerator, get_response_lengths
from slime.utils.types import Sample

REPO = Path(__file__).resolve().parents[2]
QWEN3_TEMPLATE = REPO.parent / "shared" / "qwen3" / "chat_template.jinja"
TOY = REPO / "examples" / "toy_single_turn"

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "Add 1 and 2 with the tool."},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
    {"role": "tool", "content": "3"},
    {"role": "tool", "content": "done"},
    {"role": "assistant", "content": "It is 3."},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object", "properties": {}}}}]
# A Qwen2.5-style template: a lone non-system message gets a default system turn.
DEFAULT_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    if not QWEN3_TEMPLATE.is_file():
        pytest.fail(f"{QWEN3_TEMPLATE} is missing: these tests read the template Qwen3-4B ships from the shared "
                    "folder beside the repository (see ../shared/qwen3/README.md)")
    return build_qwen_tokenizer(QWEN3_TEMPLATE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny_model(path)
    return path


@pytest.fixture(scope="module")
def tiny_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(autouse=True)
def _fresh_state():
    GenerateState.clear_instances()
    yield
    fully_async_rollout.stop_worker()
    GenerateState.clear_instances()


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---- mask_utils ---------------------------------------------------------------------------------------------


def test_response_lengths_run_from_the_first_learned_token():
    assert get_response_lengths([[0, 0, 1, 0, 1], [0, 0], [1], []]) == [3, 0, 1, 0]


def test_qwen3_layout_with_qwen3s_template_learns_each_reply_with_its_think_block(qwen3_tokenizer):
    gen = MultiTurnLossMaskGenerator(qwen3_tokenizer, tokenizer_type="qwen3")
    assert (gen.system_message_length, gen.gen_token_length) == (0, len(ids_of(qwen3_tokenizer, "<|im_start|>assistant\n")))
    ids, mask = gen.get_loss_mask(CONVERSATION)
    assert len(ids) == len(mask)
    think = "<think>\n\n</think>\n\n"
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert gen.get_text_from_loss_mask(ids, mask) == [
        f"{think}4<|im_end|>\n", f"{think}{call}<|im_end|>\n", f"{think}It is 3.<|im_end|>\n"]
    # every assistant turn renders as Qwen3 renders a reply to a query; the two tool results share a user turn
    expected = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        f"<|im_start|>assistant\n{think}4<|im_end|>\n<|im_start|>user\nAdd 1 and 2 with the tool.<|im_end|>\n"
        f"<|im_start|>assistant\n{think}{call}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\ndone\n</tool_response><|im_end|>\n"
        f"<|im_start|>assistant\n{think}It is 3.<|im_end|>\n"
    )
    assert qwen3_tokenizer.decode(ids) == expected
    # the last reply is rendered exactly as the full template renders it
    full = qwen3_tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    tail = ids_of(qwen3_tokenizer, f"<|im_start|>assistant\n{think}It is 3.<|im_end|>\n")
    assert full[-len(tail):] == ids[-len(tail):] == tail


def test_qwen3_layout_puts_tools_in_the_system_turn_and_honours_step_loss_mask(qwen3_tokenizer):
    gen = MultiTurnLossMaskGenerator(qwen3_tokenizer, tokenizer_type="qwen3")
    messages = [dict(m) for m in CONVERSATION]
    messages[2]["step_loss_mask"] = 0
    ids, mask = gen.get_loss_mask(messages, tools=TOOLS)
    text = qwen3_tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools") and '"name": "add"' in text
    learned = gen.get_text_from_loss_mask(ids, mask)
    assert len(learned) == 2 and "4<|im_end|>" not in "".join(learned)


def test_qwen_layout_cuts_the_default_system_turn_of_every_later_message():
    tokenizer = build_qwen_tokenizer(DEFAULT_SYSTEM_TEMPLATE)
    gen = MultiTurnLossMaskGenerator(tokenizer, tokenizer_type="qwen")
    assert gen.system_message_length == len(ids_of(tokenizer, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye"}, {"role": "assistant", "content": "ciao"}]
    ids, mask = gen.get_loss_mask(messages)
    assert ids == tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert gen.get_text_from_loss_mask(ids, mask) == ["hello<|im_end|>\n", "ciao<|im_end|>\n"]


@pytest.mark.parametrize("kind", ["qwen", "qwen3", "qwen3_5"])
def test_every_layout_reproduces_the_tiny_templates_rendering(tiny_tokenizer, kind):
    gen = MultiTurnLossMaskGenerator(tiny_tokenizer, tokenizer_type=kind)
    messages = CONVERSATION[:4] + [{"role": "assistant", "content": "3"}]
    ids, mask = gen.get_loss_mask(messages)
    assert ids == tiny_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert gen.get_text_from_loss_mask(ids, mask) == ["4<|im_end|>\n", "3<|im_end|>\n"]


def test_qwen3_5_layout_learns_characters_of_replies(qwen3_tokenizer):
    gen = MultiTurnLossMaskGenerator(qwen3_tokenizer, tokenizer_type="qwen3_5")
    ids, mask = gen.get_loss_mask(CONVERSATION)
    assert ids == qwen3_tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    learned = gen.get_text_from_loss_mask(ids, mask)
    assert learned[0] == "4<|im_end|>\n"
    # the last reply opens with Qwen3's "<think>\n": what follows it is learned, the header and it are not
    assert learned[-1] == "\n\n</think>\n\nIt is 3.<|im_end|>\n"


def test_distill_layout_learns_only_the_last_content(qwen3_tokenizer):
    gen = MultiTurnLossMaskGenerator(qwen3_tokenizer, tokenizer_type="distill_qwen")
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "It is 4."}]
    ids, mask = gen.get_loss_mask(messages)
    prompt = qwen3_tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert ids == ids_of(qwen3_tokenizer, prompt) + ids_of(qwen3_tokenizer, "It is 4.")
    assert gen.get_text_from_loss_mask(ids, mask) == ["It is 4."]


def test_multimodal_alignment_pads_the_text_mask_on_the_left(tiny_tokenizer):
    gen = MultiTurnLossMaskGenerator(tiny_tokenizer, tokenizer_type="qwen3")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is it?"}]},
                {"role": "assistant", "content": "a cat"}]
    text_ids, text_mask = gen.get_loss_mask([{"role": "user", "content": "what is it?"}, messages[1]])
    input_ids = [7] * 5 + text_ids
    got_ids, got_mask = gen.get_loss_mask_with_multimodal_alignment(messages, input_ids)
    assert got_ids == input_ids and got_mask == [0] * 5 + text_mask
    with pytest.raises(ValueError, match="tokenize the conversation differently"):
        gen.get_loss_mask_with_multimodal_alignment(messages, text_ids[:-1])


def test_bad_inputs_say_what_to_do(tiny_tokenizer):
    with pytest.raises(ValueError, match="--loss-mask-type takes one of"):
        MultiTurnLossMaskGenerator(tiny_tokenizer, tokenizer_type="llama")
    gen = MultiTurnLossMaskGenerator(tiny_tokenizer, tokenizer_type="qwen")
    with pytest.raises(TypeError, match="list of chat messages"):
        gen.get_loss_mask("just text")


# ---- sft_rollout --------------------------------------------------------------------------------------------


def sft_args(model_dir: Path, **extra) -> argparse.Namespace:
    values = {"hf_checkpoint": str(model_dir), "loss_mask_type": "qwen3", "rollout_batch_size": 2,
              "rollout_global_dataset": True}
    return argparse.Namespace(**{**values, **extra})


def message_source(n: int = 3, per_prompt: int = 1) -> RolloutDataSourceWithBuffer:
    prompts = [Prompt(i, [{"role": "user", "content": f"{i}+{i}?"}, {"role": "assistant", "content": str(2 * i)}],
                      [], None, {}) for i in range(n)]
    return RolloutDataSourceWithBuffer(prompts, per_prompt, shuffle=False, seed=0)


def test_sft_rollout_builds_trainable_samples_from_conversations(model_dir, tiny_tokenizer):
    groups = sft_rollout.generate_rollout(sft_args(model_dir), 0, message_source())
    assert [len(g) for g in groups] == [1, 1]
    for i, (sample,) in enumerate(groups):
        ids, mask = MultiTurnLossMaskGenerator(tiny_tokenizer, "qwen3").get_loss_mask(sample.prompt)
        assert sample.tokens == ids and sample.reward == 0
        assert tiny_tokenizer.decode(sample.tokens[-sample.response_length:]) == f"{2 * i}<|im_end|>\n"
        assert sample.loss_mask == [1] * sample.response_length
        sample.validate()
    # what the trainer's sft_loss sees: the masked NLL of exactly the reply tokens
    trainer = TorchTrainer(str(model_dir))
    flat = [g[0] for g in groups]
    before = trainer.compute_log_probs(flat)
    metrics = trainer.train_step(flat, None, loss_type="sft_loss")
    nll = [-lp for lps in before for lp in lps]
    assert metrics["nll"] == pytest.approx(sum(nll) / len(nll), rel=1e-4)


def test_sft_rollout_refuses_what_it_cannot_train(model_dir):
    with pytest.raises(ValueError, match="--n-samples-per-prompt 1"):
        sft_rollout.generate_rollout(sft_args(model_dir), 0, message_source(per_prompt=2))
    text = RolloutDataSourceWithBuffer([Prompt(0, "rendered text", [1, 2], None, {})], 1, shuffle=False, seed=0)
    with pytest.raises(ValueError, match="leave --apply-chat-template off"):
        sft_rollout.generate_rollout(sft_args(model_dir, rollout_batch_size=1), 0, text)
    with pytest.raises(ValueError, match="no evaluation mode"):
        sft_rollout.generate_rollout(sft_args(model_dir), 0, message_source(), evaluation=True)


# ---- sleep_rollout --------------------------------------------------------------------------------------------


def test_sleep_never_returns(monkeypatch, caplog):
    monkeypatch.setattr(sleep_rollout, "_HOUR_S", 0.02)
    caplog.set_level(logging.INFO, logger=sleep_rollout.__name__)
    thread = threading.Thread(target=sleep_rollout.sleep, args=(None, 5, None), daemon=True)
    thread.start()
    thread.join(timeout=0.5)
    assert thread.is_alive()
    assert any("has slept" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(sleep_rollout, "_HOUR_S", 3600.0)  # the daemon thread sleeps out the test session


# ---- fully_async_rollout against the CPU engine -----------------------------------------------------------------

ABORT_ONCE: set[int] = set()


async def abort_first_try(args, sample, sampling_params):
    """A generate function in slime's style whose first attempt at each even-indexed group is aborted."""
    if sample.group_index % 2 == 0 and sample.group_index not in ABORT_ONCE:
        ABORT_ONCE.add(sample.group_index)
        sample.status = Sample.Status.ABORTED
        return sample
    return await generate(args, sample, sampling_params)


async def digit_reward(args, sample, **kwargs):
    return float(sum(c.isdigit() for c in sample.response))


def engine_args(engine, model_dir: Path, *extra: str) -> argparse.Namespace:
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    return parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", "unused.jsonl", "--rollout-batch-size", "2",
                       "--n-samples-per-prompt", "2", "--num-rollout", "2", "--rollout-max-response-len", "4",
                       "--sglang-router-ip", host, "--sglang-router-port", port, "--sglang-server-concurrency", "3",
                       "--custom-rm-path", "test_builtin_rollouts.digit_reward", *extra])


def text_source(tokenizer, n: int = 40) -> RolloutDataSourceWithBuffer:
    prompts = []
    for i in range(n):
        text = tokenizer.apply_chat_template([{"role": "user", "content": f"count to {i}"}], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(Prompt(i, text, ids_of(tokenizer, text), str(i), {}))
    return RolloutDataSourceWithBuffer(prompts, 2, shuffle=False, seed=0)


def wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_fully_async_keeps_generating_between_steps_and_requeues_aborted_groups(engine, model_dir, tiny_tokenizer,
                                                                                monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    ABORT_ONCE.clear()
    args = engine_args(engine, model_dir, "--custom-generate-function-path", "test_builtin_rollouts.abort_first_try")
    source = text_source(tiny_tokenizer)
    first = fully_async_rollout.generate_rollout_fully_async(args, 0, source)
    worker = fully_async_rollout._WORKER
    assert worker is not None and worker.concurrency == 3
    # between steps the worker keeps 3 groups going: finished ones wait for the next step
    wait_for(lambda: worker.queue_size() >= 2)
    second = fully_async_rollout.generate_rollout_fully_async(args, 1, source)
    assert fully_async_rollout._WORKER is worker  # one worker across steps

    for groups in (first, second):
        assert len(groups) == 2 and all(len(g) == 2 for g in groups)
        assert [g[0].index for g in groups] == sorted(g[0].index for g in groups)
        for group in groups:
            assert len({s.group_index for s in group}) == 1
            for s in group:
                assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and s.response_length > 0
                assert s.reward == float(sum(c.isdigit() for c in s.response))
                assert len(s.rollout_log_probs) == s.response_length
    seen = [g[0].group_index for g in first + second]
    assert len(set(seen)) == 4
    # even groups were aborted on their first try: they went back to the data source and came out generated
    assert worker.requeued >= 1 and any(g % 2 == 0 for g in seen)
    with pytest.raises(ValueError, match="no evaluation mode"):
        fully_async_rollout.generate_rollout_fully_async(args, 2, source, evaluation=True)


def test_fully_async_raises_when_every_group_fails(model_dir, tiny_tokenizer, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", "unused.jsonl", "--rollout-batch-size", "1",
                       "--n-samples-per-prompt", "1", "--num-rollout", "1", "--sglang-router-ip", "127.0.0.1",
                       "--sglang-router-port", "9", "--sglang-server-concurrency", "2"])
    args.custom_generate_function_path = "test_builtin_rollouts.broken_generate"
    with pytest.raises(RuntimeError, match="every recent group failed"):
        fully_async_rollout.generate_rollout_fully_async(args, 0, text_source(tiny_tokenizer, 4))


async def broken_generate(args, sample, sampling_params):
    raise ConnectionError("engine gone")


# ---- on-policy distillation with the CPU engine as the teacher ---------------------------------------------------


def test_opd_post_process_takes_the_teachers_response_log_probs():
    sample = Sample(index=0, tokens=[5, 6, 7, 8, 9], response_length=2)
    sample.reward = {"meta_info": {"input_token_logprobs": [[None, 5, None], [-1.0, 6, None], [-2.0, 7, None],
                                                           [-3.0, 8, None], [-4.0, 9, None]]}}
    raw, processed = on_policy_distillation.post_process_rewards(argparse.Namespace(reward_key=None), [[sample]])
    assert raw == processed == [0.0]
    assert sample.teacher_log_probs == [-3.0, -4.0]
    sample.reward = {"meta_info": {}}
    with pytest.raises(ValueError, match="input_token_logprobs"):
        on_policy_distillation.post_process_rewards(argparse.Namespace(reward_key=None), [sample])


def test_opd_teacher_scores_the_students_response_on_the_cpu_engine(engine, model_dir, tiny_tokenizer):
    args = engine_args(engine, model_dir, "--rollout-temperature", "0.7")
    args.rm_url = f"{engine.url}/generate"
    prompt = ids_of(tiny_tokenizer, "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    sample = Sample(index=0, tokens=prompt + ids_of(tiny_tokenizer, "hi there"), response_length=2)
    sample.response_length = len(sample.tokens) - len(prompt)
    reply = run(on_policy_distillation.reward_func(args, sample))
    assert reply["meta_info"]["completion_tokens"] == 0 and reply["output_ids"] == []
    assert [e[1] for e in reply["meta_info"]["input_token_logprobs"]] == sample.tokens
    sample.reward = reply
    on_policy_distillation.post_process_rewards(args, [sample])
    # the teacher is the same tiny model: its scores are the trainer's log-probs at the rollout temperature
    expected = TorchTrainer(str(model_dir)).compute_log_probs([sample], temperature=0.7)[0]
    assert sample.teacher_log_probs == pytest.approx(expected, abs=1e-4)


def test_opd_reward_needs_a_teacher_url(model_dir):
    args = argparse.Namespace(rm_url=None, rollout_temperature=1.0)
    with pytest.raises(ValueError, match="--rm-url"):
        run(on_policy_distillation.reward_func(args, Sample(tokens=[1, 2], response_length=1)))


# ---- through python -m slime.train ------------------------------------------------------------------------------


def _train(tmp_path: Path, model_dir: Path, data: Path, *extra: str, steps: int = 2) -> tuple[list[dict], str]:
    work = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "slime.train", "--hf-checkpoint", str(model_dir), "--prompt-data", str(data),
           "--num-rollout", str(steps), "--rollout-max-response-len", "6", "--lr", "1e-3", "--save", str(work),
           "--ray-num-cpus", "4", *extra]
    out = _run(cmd, _env(), timeout=240).stdout
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"], out


def test_fully_async_trains_two_steps(tmp_path, model_dir):
    sys.path.insert(0, str(TOY))
    from make_data import rows

    sys.path.remove(str(TOY))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(16, 0)))
    records, out = _train(tmp_path, model_dir, data, "--label-key", "label", "--apply-chat-template",
                     "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--custom-rm-path", "reward.reward",
                     "--sglang-server-concurrency", "2",
                     "--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async")
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        assert math.isfinite(r["train/loss"]) and r["train/tokens"] > 0
    assert out.count("starting the background worker") == 1


def test_sft_trains_two_steps(tmp_path, model_dir):
    data = tmp_path / "sft.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{i}+{i}?"}, {"role": "assistant", "content": str(2 * i)}]}
            for i in range(8)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records, _ = _train(tmp_path, model_dir, data, "--input-key", "messages", "--rollout-batch-size", "4",
                     "--n-samples-per-prompt", "1", "--loss-type", "sft_loss", "--loss-mask-type", "qwen3",
                     "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout")
    assert [r["step"] for r in records] == [0, 1]
    assert all(math.isfinite(r["train/sft_loss"]) and r["train/nll"] > 0 for r in records)
    assert records[1]["train/nll"] < records[0]["train/nll"]  # the same kind of data, learned
