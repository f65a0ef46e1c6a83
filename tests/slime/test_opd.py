"""On-policy distillation (slime's --use-opd --opd-type sglang) on the CPU engine, end to end:

- the engine scores prompts as SGLang does (`logprob_start_len` + `return_logprob` ->
  `meta_info.input_token_logprobs`), also with generation and past the prefix cache, and the bodies it
  serves are what the pinned sglangs' own `GenerateReqInput` reads;
- the trainer's OPD term (advantage -= --opd-kl-coef x (student - teacher log-prob) per response token)
  on real teacher scores, against log-probs computed independently;
- 2 steps of `python -m slime.train` with upstream's OPD flags and a second CPU engine as the teacher.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
import torch
from test_train_loop import _env, _run

from slime.algorithms.estimators import build_train_batch
from slime.algorithms.losses import opd_token_advantages
from slime.arguments import ArgumentError, parse_args
from slime.backends.torch_backend import TorchTrainer
from slime.backends.train_worker import TrainWorker
from slime.engine.cpu_server import CPUEngine
from slime.models.tiny import build_tiny_model
from slime.rollout import on_policy_distillation
from slime.rollout.rm_hub import RewardError, check_reward, reward_number
from slime.utils.async_utils import run
from slime.utils.types import Sample

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "examples" / "toy_single_turn"
OPD_FLAGS = ["--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func",
             "--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards",
             "--use-opd", "--opd-type", "sglang"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("student") / "model", seed=0)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> Path:
    # larger initial weights than the student's: a peaked distribution, far from the near-uniform student
    return build_tiny_model(tmp_path_factory.mktemp("teacher") / "model", seed=1, initializer_range=0.2)


@pytest.fixture(scope="module")
def teacher(teacher_dir):
    engine = CPUEngine(teacher_dir, port=0, seed=0)
    engine.start()
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _post(engine: CPUEngine, body: dict) -> httpx.Response:
    return httpx.post(f"{engine.url}/generate", json=body, timeout=60)


def _reference(model: Path, tokens: list[int], temperature: float) -> list[float]:
    """log_softmax(logits[i-1] / T)[tokens[i]] for i >= 1 from a plain HF forward (no engine code)."""
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = net(input_ids=torch.tensor([tokens])).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens[1:]).view(-1, 1)).squeeze(1).tolist()


# ---- the engine's scoring -----------------------------------------------------------------------------------


def test_scoring_from_logprob_start_len_matches_a_plain_forward(teacher, teacher_dir, tokenizer):
    tokens = _ids(tokenizer, "<|im_start|>user\nwrite 7<|im_end|>\n<|im_start|>assistant\n777 and 7")
    ref = _reference(teacher_dir, tokens, 0.6)
    for start in (0, 3, len(tokens) - 1):
        reply = _post(teacher, {"input_ids": tokens, "return_logprob": True, "logprob_start_len": start,
                                "sampling_params": {"temperature": 0.6, "max_new_tokens": 0}}).json()
        entries = reply["meta_info"]["input_token_logprobs"]
        assert [e[1] for e in entries] == tokens[start:]  # one entry per token from logprob_start_len on
        assert entries[0][0] is None and all(e[2] is None for e in entries)  # SGLang leaves the first unscored
        assert [e[0] for e in entries[1:]] == pytest.approx(ref[start:], abs=1e-5)
        assert reply["output_ids"] == [] and reply["meta_info"]["output_token_logprobs"] == []
    # greedy counts as temperature 1, as for sampled tokens; text in the entries on request
    reply = _post(teacher, {"input_ids": tokens, "return_logprob": True, "logprob_start_len": 0,
                            "return_text_in_logprobs": True,
                            "sampling_params": {"temperature": 0, "max_new_tokens": 0}}).json()
    entries = reply["meta_info"]["input_token_logprobs"]
    assert [e[0] for e in entries[1:]] == pytest.approx(_reference(teacher_dir, tokens, 1.0), abs=1e-5)
    assert entries[1][2] == tokenizer.decode([tokens[1]])


def test_scoring_with_generation_and_a_cached_prefix(teacher, teacher_dir, tokenizer):
    prompt = _ids(tokenizer, "<|im_start|>user\ncount from one to nine in words, then back down to one, and "
                             "say which is the largest<|im_end|>\n<|im_start|>assistant\n")
    assert len(prompt) >= 16  # the prefix cache keeps no shorter match
    params = {"temperature": 0.8, "max_new_tokens": 5, "ignore_eos": True, "sampling_seed": 3}
    first = _post(teacher, {"input_ids": prompt, "sampling_params": params, "return_logprob": True}).json()
    assert first["meta_info"]["input_token_logprobs"] == []  # logprob_start_len defaults to -1: no prompt token
    # the next turn extends the first one's sequence, which the prefix cache holds; scoring must not use it
    longer = prompt + first["output_ids"] + _ids(tokenizer, " again")
    plain = _post(teacher, {"input_ids": longer, "sampling_params": params}).json()
    assert plain["meta_info"]["cached_tokens"] > 0
    scored = _post(teacher, {"input_ids": longer, "sampling_params": params, "return_logprob": True,
                             "logprob_start_len": 1}).json()
    assert scored["meta_info"]["cached_tokens"] == 0
    assert [e[0] for e in scored["meta_info"]["input_token_logprobs"][1:]] == pytest.approx(
        _reference(teacher_dir, longer, 0.8)[1:], abs=1e-5)
    # it generates on: the same tokens and log-probs as the same request without scoring
    assert scored["output_ids"] == plain["output_ids"] and len(scored["output_ids"]) == 5
    again = _post(teacher, {"input_ids": longer, "sampling_params": params, "return_logprob": True}).json()
    assert [e[0] for e in scored["meta_info"]["output_token_logprobs"]] == pytest.approx(
        [e[0] for e in again["meta_info"]["output_token_logprobs"]], abs=1e-5)


def test_scoring_batches_and_refusals(teacher, tokenizer):
    a, b = _ids(tokenizer, "one two three"), _ids(tokenizer, "four five")
    reply = _post(teacher, {"input_ids": [a, b], "return_logprob": True, "logprob_start_len": [0, 1],
                            "sampling_params": {"max_new_tokens": 0}}).json()
    assert [[e[1] for e in r["meta_info"]["input_token_logprobs"]] for r in reply] == [a, b[1:]]
    # without return_logprob, logprob_start_len is ignored (as sglang's scheduler does)
    reply = _post(teacher, {"input_ids": a, "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 0}}).json()
    assert "input_token_logprobs" not in reply["meta_info"]
    # logprob_start_len == prompt length: nothing to score
    reply = _post(teacher, {"input_ids": a, "return_logprob": True, "logprob_start_len": len(a),
                            "sampling_params": {"max_new_tokens": 0}}).json()
    assert reply["meta_info"]["input_token_logprobs"] == []
    for bad, says in (({"logprob_start_len": len(a) + 1}, "logprob_start_len"), ({"logprob_start_len": -2}, ">= -1"),
                      ({"logprob_start_len": "0"}, "int")):
        refused = _post(teacher, {"input_ids": a, "return_logprob": True, "sampling_params": {"max_new_tokens": 0},
                                  **bad})
        assert refused.status_code == 400 and says in refused.json()["error"]["message"], refused.text


_SGLANG_READER = textwrap.dedent("""
    import json, sys
    from sglang.srt.managers.io_struct import GenerateReqInput
    out = []
    for body in json.load(sys.stdin):
        req = GenerateReqInput(**body)
        req.normalize_batch_and_arguments()
        out.append({"logprob_start_len": req.logprob_start_len, "return_logprob": req.return_logprob})
    print("ANSWERS " + json.dumps(out))
""")


def test_sglang_reads_the_scoring_bodies_as_the_engine_does(sglang, teacher):
    """The bodies the teacher is sent (reward_func's, and a batch) through the pinned sglangs' own request
    class: the same logprob_start_len per prompt as the engine applies."""
    from sglang_real import sglang_env

    args = parse_args(["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "1",
                       "--num-rollout", "1", "--rollout-temperature", "0.7"])
    bodies = [on_policy_distillation.teacher_payload(args, Sample(tokens=[5, 6, 7], response_length=1)),
              {"input_ids": [[5, 6, 7], [8, 9]], "return_logprob": True, "logprob_start_len": [0, 1],
               "sampling_params": {"max_new_tokens": 0}}]
    struct = sglang.body_struct("POST", "/generate")
    for body in bodies:
        assert sglang.validate_body(struct, body) is None, body
    proc = subprocess.run([sys.executable, "-c", _SGLANG_READER], input=json.dumps(bodies),
                          env=sglang_env(sglang.gpu_set), capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ANSWERS ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    read = json.loads(lines[-1][len("ANSWERS "):])
    assert read[0]["logprob_start_len"] == 0 and read[0]["return_logprob"] is True
    assert read[1]["logprob_start_len"] == [0, 1]
    for body in bodies:
        reply = _post(teacher, body)
        assert reply.status_code == 200, reply.text
        replies = reply.json() if isinstance(reply.json(), list) else [reply.json()]
        starts = body["logprob_start_len"] if isinstance(body["logprob_start_len"], list) else [0]
        ids = body["input_ids"] if isinstance(body["input_ids"][0], list) else [body["input_ids"]]
        for r, start, prompt in zip(replies, starts, ids, strict=True):
            assert [e[1] for e in r["meta_info"]["input_token_logprobs"]] == prompt[start:]


# ---- flags, reward checks, the advantage term ------------------------------------------------------------------


BASE = ["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "1", "--num-rollout", "1"]


@pytest.mark.parametrize(("extra", "says"), [
    (["--use-opd"], "--opd-type"),
    (["--use-opd", "--opd-type", "megatron"], "--opd-type sglang"),
    (["--opd-teacher-load", "/t"], "add --use-opd"),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-load", "/t"], "leave --opd-teacher-load out"),
    (["--use-opd", "--opd-type", "sglang", "--normalize-advantages"], "leave --normalize-advantages out"),
    (["--use-opd", "--opd-type", "sglang", "--advantage-estimator", "ppo"], "use grpo"),
])
def test_opd_flags_are_refused_with_what_to_do(extra, says):
    with pytest.raises(ArgumentError, match=says):
        parse_args(BASE + extra)


def test_opd_flags_parse_with_upstreams_names_and_defaults():
    args = parse_args(BASE + ["--use-opd", "--opd-type", "sglang"])
    assert (args.use_opd, args.opd_type, args.opd_kl_coef, args.opd_teacher_load) == (True, "sglang", 1.0, None)
    assert parse_args(BASE).use_opd is False


def test_a_teacher_reply_passes_the_reward_checks_only_with_a_post_process_hook():
    reply = {"meta_info": {"input_token_logprobs": [[None, 1, None]]}}
    sample = Sample(index=3, reward=reply)
    hooked = parse_args(BASE + OPD_FLAGS)
    assert check_reward(hooked, sample, reply) is reply and reward_number(hooked, sample) is None
    with pytest.raises(RewardError, match="sample 3"):  # a NaN is still refused
        check_reward(hooked, sample, math.nan)
    with pytest.raises(RewardError, match="--reward-key"):
        check_reward(parse_args(BASE), sample, reply)
    assert reward_number(hooked, Sample(reward=2)) == 2.0


def test_opd_token_advantages_is_the_formula():
    adv, gaps = opd_token_advantages([0.5, 0.5, -1.0], [-1.0, -2.0, -0.5], [-1.5, -1.0, -0.5], 0.5)
    assert gaps == [0.5, -1.0, 0.0]
    assert adv == [0.25, 1.0, -1.0]
    with pytest.raises(ValueError, match="one value per response token"):
        opd_token_advantages([0.0], [0.0, 0.0], [0.0], 1.0)


def test_the_trainer_applies_the_teachers_scores(teacher, teacher_dir, model_dir, tokenizer, tmp_path):
    """Real teacher scores (the teacher engine via reward_func and post_process_rewards), a real TrainWorker:
    the advantages its optimizer step receives are A - coef x (student - teacher), student and teacher
    log-probs recomputed here by plain trainers of each model."""
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", "p", "--rollout-batch-size", "1",
                       "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rollout-temperature", "0.9",
                       "--opd-kl-coef", "0.5", "--rm-url", f"{teacher.url}/generate", *OPD_FLAGS])
    prompt = _ids(tokenizer, "<|im_start|>user\nsay 3<|im_end|>\n<|im_start|>assistant\n")
    group = []
    for i, text in enumerate(("33 3", "three")):
        response = _ids(tokenizer, text)
        sample = Sample(index=i, group_index=0, tokens=prompt + response, response_length=len(response),
                        loss_mask=[1] * (len(response) - 1) + [0], status=Sample.Status.COMPLETED)
        sample.reward = check_reward(args, sample, run(on_policy_distillation.reward_func(args, sample)))
        group.append(sample)
    samples, base = build_train_batch(args, [group])
    assert base == [0.0, 0.0]  # pure distillation: post_process_rewards' 0.0 rewards give GRPO zeros
    worker = TrainWorker(args)
    seen = []
    real_step = worker.trainer.train_step

    def recording_step(batch, advantages, *a, **kw):
        seen.append([list(x) for x in advantages])
        return real_step(batch, advantages, *a, **kw)

    worker.trainer.train_step = recording_step
    metrics = worker.train(samples, base)
    student = TorchTrainer(str(model_dir)).compute_log_probs(samples, temperature=0.9)
    teacher_lp = TorchTrainer(str(teacher_dir)).compute_log_probs(samples, temperature=0.9)
    expected = [[-0.5 * (s - t) for s, t in zip(ss, tt, strict=True)] for ss, tt in zip(student, teacher_lp,
                                                                                          strict=True)]
    assert len(seen) == 1
    for got, want in zip(seen[0], expected, strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    assert any(abs(v) > 1e-3 for row in seen[0] for v in row)  # two different models: a real signal
    masked = [sum((s - t) * m for s, t, m in zip(ss, tt, x.loss_mask, strict=True)) / sum(x.loss_mask)
              for ss, tt, x in zip(student, teacher_lp, samples, strict=True)]
    assert metrics["train/opd_reverse_kl"] == pytest.approx(sum(masked) / len(masked), abs=1e-4)
    assert math.isfinite(metrics["train/loss"])


def test_the_trainer_says_what_is_missing_without_teacher_scores(model_dir):
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", "p", "--rollout-batch-size", "1",
                       "--num-rollout", "1", "--use-opd", "--opd-type", "sglang"])
    sample = Sample(index=0, group_index=0, tokens=[5, 6, 7], response_length=1, reward=0.0)
    with pytest.raises(ValueError, match="post_process_rewards"):
        TrainWorker(args).train([sample], [0.0])


# ---- through python -m slime.train ------------------------------------------------------------------------------


def test_opd_trains_two_steps_against_a_teacher_engine(tmp_path, model_dir, teacher):
    sys.path.insert(0, str(TOY))
    from make_data import rows

    sys.path.remove(str(TOY))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(8, 0)))
    work = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "slime.train", "--hf-checkpoint", str(model_dir), "--prompt-data", str(data),
           "--label-key", "label", "--apply-chat-template", "--num-rollout", "2", "--rollout-batch-size", "2",
           "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6", "--lr", "1e-3", "--save", str(work),
           "--ray-num-cpus", "4", "--rm-url", f"{teacher.url}/generate", *OPD_FLAGS]
    _run(cmd, _env(), timeout=300)
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [0, 1]
    for r in train:
        # the near-uniform student puts far more mass on its own draws than the peaked teacher does: the
        # sampled reverse KL is clearly positive, so the distillation term moved every advantage
        assert math.isfinite(r["train/opd_reverse_kl"]) and r["train/opd_reverse_kl"] > 0.1
        assert math.isfinite(r["train/loss"]) and r["train/tokens"] > 0
