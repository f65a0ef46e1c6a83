"""Plugins written the way upstream slime's examples write them, trained 2 steps by `python -m slime.train`.

Upstream's own example files stay out of this repository (tests/upstream/run_upstream_examples.py runs them
from a checkout); these plugins are ours but lean on the same surface, so CI checks that contract:
`GenerateState(args).tokenizer`, `post(url, payload)` to
`http://{sglang_router_ip}:{sglang_router_port}/generate` with `text` or `input_ids`,
`Sample.append_response_tokens` for model and observation tokens, a dict label read as
`label["ground_truth"]`, rewards from `slime.rollout.rm_hub` helpers (a dict reward picked by
`--reward-key`), and fresh `Sample`s built by the generate function as tau-bench's `res_to_sample` does
(status given as a string, no group, reward already set, no reward function).
Each run is a real subprocess on the CPU engine with the tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from slime.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, SAMPLES = 2, 2, 2

# Search-R1's shape: text-form /generate, two turns, a retrieval between them (loss mask 0), dict label.
SEARCH_PLUGIN = '''
import json

from slime.rollout.rm_hub.f1 import f1_score
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

MAX_TURNS = 2


async def retrieve(args, query):
    reply = await post(args.search_url, {"queries": [query], "topk": 2, "return_scores": False})
    return "".join(f"Doc {i + 1}: {doc['contents']}\\n" for i, doc in enumerate(reply["result"][0]))


async def generate(args, sample, sampling_params):
    assert not args.partial_rollout, "this generate does not resume partial samples"
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_text = sample.prompt
    sample.tokens = list(state.tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    sample.loss_mask = []
    response = ""
    for turn in range(MAX_TURNS):
        output = await post(url, {"text": prompt_text + response, "sampling_params": sampling_params,
                                  "return_logprob": True})
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        pairs = output["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                      trainable=True, meta_info=output["meta_info"])
        response += output["text"]
        if turn == MAX_TURNS - 1:
            break
        observation = f"\\n<information>{await retrieve(args, output['text'])}</information>\\n"
        obs_ids = state.tokenizer(observation, add_special_tokens=False)["input_ids"]
        sample.append_response_tokens(args, tokens=obs_ids, trainable=False)
        response += observation
    sample.response = response
    return sample


async def reward_func(args, sample, **kwargs):
    answer = sample.response.split("<answer>")[-1].split("</answer>")[0]
    score = max(f1_score(answer, target)[0] for target in sample.label["ground_truth"]["target"])
    with open(args.sample_log, "a") as f:
        f.write(json.dumps({"label": sample.label, "response_length": sample.response_length,
                            "loss_mask": sample.loss_mask, "log_probs": len(sample.rollout_log_probs),
                            "status": sample.status.name}) + "\\n")
    return score
'''

# tau-bench's shape: the task index is the prompt (`--input-key index`, no chat template); the generate
# function returns a NEW Sample built from the episode, status as a string, reward already set.
FRESH_SAMPLE_PLUGIN = '''
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

EPISODES = {}


async def generate(args, sample, sampling_params):
    assert not args.partial_rollout, "episodes cannot be resumed"
    task_index = int(sample.prompt)
    state = GenerateState(args)
    messages = [{"role": "user", "content": f"Task {task_index}: reply with a number."}]
    prompt_text = state.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = state.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    payload = {"input_ids": prompt_ids, "sampling_params": sampling_params, "return_logprob": True}
    output = await post(url, payload)
    response_ids = [p[1] for p in output["meta_info"]["output_token_logprobs"]]
    # The n-th episode of a task scores n % 2: the two episodes of a group always differ, so only a group
    # lost on the way (each sample alone) can give zero advantages.
    episode = EPISODES.get(task_index, 0)
    EPISODES[task_index] = episode + 1
    status = {"stop": "completed", "length": "truncated"}[output["meta_info"]["finish_reason"]["type"]]
    result = Sample(index=task_index, prompt=prompt_text, tokens=prompt_ids + response_ids,
                    response=output["text"], reward=float(episode % 2), loss_mask=[1] * len(response_ids),
                    status=status, metadata={"task_index": task_index, "episode": episode})
    result.response_length = len(response_ids)
    return result
'''

# retool's shape: input_ids-form /generate, per-turn budget clamped to the context, tokens decoded by the
# tokenizer, tool output from a sandboxed interpreter (loss mask 0), DAPO's dict reward + --reward-key score.
RETOOL_PLUGIN = '''
import asyncio
import json
import re
import sys

from slime.rollout.rm_hub.math_dapo_utils import compute_score
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

MAX_TURNS = 2


async def run_code(code):
    pipe = asyncio.subprocess.PIPE
    proc = await asyncio.create_subprocess_exec(sys.executable, "-I", "-c", code, stdout=pipe,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
    return out.decode().strip()


async def generate(args, sample, sampling_params):
    assert not args.partial_rollout, "this generate does not resume partial samples"
    sample.rollout_log_probs = None
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = []
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    messages = [{"role": "system", "content": "Run Python between <code> and </code>."},
                {"role": "user", "content": sample.prompt}]
    prompt = state.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = state.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    sample.tokens = list(prompt_ids)
    max_context = args.rollout_max_context_len or args.context_parallel_size * args.max_tokens_per_gpu
    response, response_ids, tool_calls = "", [], 0
    for turn in range(MAX_TURNS):
        params = dict(sampling_params)
        left = max_context - len(prompt_ids) - len(response_ids)
        params["max_new_tokens"] = min(params["max_new_tokens"], left)
        output = await post(url, {"input_ids": prompt_ids + response_ids, "sampling_params": params,
                                  "return_logprob": True})
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        pairs = output["meta_info"]["output_token_logprobs"]
        ids = [p[1] for p in pairs]
        text = state.tokenizer.decode(ids)
        sample.append_response_tokens(args, tokens=ids, log_probs=[p[0] for p in pairs], trainable=True,
                                      meta_info=output["meta_info"])
        response += text
        response_ids += ids
        if turn == MAX_TURNS - 1:
            break
        found = re.search(r"<code>(.*?)</code>", text, re.DOTALL)
        # A random tiny model never writes code: run a fixed probe then, so the tool path runs every time.
        result = await run_code(found.group(1) if found else "print(6 * 7)")
        tool_calls += 1
        observation = f"\\n<interpreter>\\n{result}\\n</interpreter>\\n"
        obs_ids = state.tokenizer(observation, add_special_tokens=False)["input_ids"]
        sample.append_response_tokens(args, tokens=obs_ids, trainable=False)
        response += observation
        response_ids += obs_ids
    sample.response = response
    sample.tool_call_count = tool_calls
    return sample


async def reward_func(args, sample, **kwargs):
    result = compute_score(sample.prompt + sample.response, sample.label, strict_box_verify=True)
    if result["pred"] is None:
        result["pred"] = ""
    with open(args.sample_log, "a") as f:
        f.write(json.dumps({"reward": result, "tool_calls": sample.tool_call_count,
                            "response": sample.response, "response_length": sample.response_length,
                            "loss_mask": sample.loss_mask,
                            "log_probs": len(sample.rollout_log_probs)}) + "\\n")
    return result
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny_model(path)
    return path


class _Retrieval:
    """A retrieval server with Search-R1's protocol on a free port; counts the queries it answered."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.queries.extend(body["queries"])
                docs = [[{"id": "0", "contents": '"Paris"\nParis is the capital of France.'}] * body["topk"]
                        for _ in body["queries"]]
                data = json.dumps({"result": docs}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def retrieval() -> Iterator[_Retrieval]:
    server = _Retrieval()
    yield server
    server.close()


def _train(model: Path, work: Path, plugin: str, rows: list[dict[str, Any]], *flags: str,
           config: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    """Write the plugin and prompts, run `python -m slime.train` for STEPS steps; return the train records
    by step."""
    (work / "plugins").mkdir()
    (work / "plugins" / "plugin.py").write_text(plugin)
    (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "slime.train", "--hf-checkpoint", str(model),
           "--prompt-data", str(work / "data.jsonl"), "--rollout-batch-size", str(PROMPTS),
           "--n-samples-per-prompt", str(SAMPLES), "--num-rollout", str(STEPS),
           "--rollout-max-response-len", "8", "--advantage-estimator", "grpo", "--lr", "1e-4",
           "--custom-generate-function-path", "plugin.generate", "--save", str(work / "ckpt"),
           "--ray-num-cpus", "2", *flags]
    if config:
        (work / "config.yaml").write_text(json.dumps(config))
        cmd += ["--custom-config-path", str(work / "config.yaml")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(work / "plugins"), str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # Ray's processes of the run
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, out[-4000:]
    records = {}
    for line in (work / "ckpt" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            records[record["step"]] = record
    assert sorted(records) == list(range(STEPS)), out[-2000:]
    return records


def _sample_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_search_style_text_generate_with_dict_label_and_retrieval(model, tmp_path, retrieval):
    rows = [{"prompt": [{"role": "user", "content": f"Question {i}: what is the capital of France?"}],
             "reward_model": {"ground_truth": {"target": ["Paris", f"paris {i}"]}, "style": "rule"}}
            for i in range(STEPS * PROMPTS)]
    records = _train(model, tmp_path, SEARCH_PLUGIN, rows, "--input-key", "prompt",
                     "--label-key", "reward_model", "--apply-chat-template",
                     "--custom-rm-path", "plugin.reward_func",
                     config={"search_url": retrieval.url, "sample_log": str(tmp_path / "samples.jsonl")})
    samples = _sample_log(tmp_path / "samples.jsonl")
    played = STEPS * PROMPTS * SAMPLES
    assert len(samples) == played and len(retrieval.queries) == played  # one retrieval per episode
    targets = sorted(s["label"]["ground_truth"]["target"][1] for s in samples)  # the label arrived as a dict
    assert targets == sorted(f"paris {i}" for i in range(STEPS * PROMPTS) for _ in range(SAMPLES))
    for s in samples:
        observed = s["loss_mask"].count(0)
        assert observed > 0 and s["loss_mask"][0] == 1  # model tokens, then the retrieved text
        assert len(s["loss_mask"]) == s["response_length"] == s["log_probs"]
    assert all(r["rollout/episodes_trained"] == PROMPTS * SAMPLES for r in records.values())


def test_fresh_samples_like_tau_bench_keep_their_groups(model, tmp_path):
    rows = [{"index": i} for i in range(STEPS * PROMPTS)]
    records = _train(model, tmp_path, FRESH_SAMPLE_PLUGIN, rows, "--input-key", "index",
                     "--dynamic-sampling-filter-path",
                     "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std")
    for record in records.values():
        assert record["rollout/episodes_trained"] == PROMPTS * SAMPLES
        assert record["rollout/raw_reward"] == pytest.approx(0.5)  # one 0 and one 1 in every group
        # Grouped by prompt, every group has rewards {0, 1}: no sample may get a zero advantage.
        assert record["train/zero_advantage_samples"] == 0


def test_retool_style_input_ids_generate_with_sandbox_and_dict_reward(model, tmp_path):
    rows = [{"prompt": f"What is {i} + 40? Answer with \\boxed{{}}.", "label": str(i + 40)}
            for i in range(STEPS * PROMPTS)]
    records = _train(model, tmp_path, RETOOL_PLUGIN, rows, "--input-key", "prompt", "--label-key", "label",
                     "--custom-rm-path", "plugin.reward_func", "--reward-key", "score",
                     "--max-tokens-per-gpu", "512",
                     config={"sample_log": str(tmp_path / "samples.jsonl")})
    samples = _sample_log(tmp_path / "samples.jsonl")
    assert len(samples) == STEPS * PROMPTS * SAMPLES
    for s in samples:
        assert s["tool_calls"] == 1
        assert "<interpreter>\n42\n</interpreter>" in s["response"]  # the sandbox ran the probe
        assert s["reward"]["score"] in (-1.0, 1.0) and set(s["reward"]) >= {"score", "acc", "pred"}
        assert s["loss_mask"].count(0) > 0 and len(s["loss_mask"]) == s["response_length"] == s["log_probs"]
    # --reward-key score: the scalar trained on is the dict's "score" (every step plays as many samples)
    mean_logged = sum(s["reward"]["score"] for s in samples) / len(samples)
    assert sum(r["rollout/raw_reward"] for r in records.values()) / STEPS == pytest.approx(mean_logged)
