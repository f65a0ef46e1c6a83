"""The CPU engine against a real uvicorn server on 127.0.0.1 and the real tiny Qwen3."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slime.engine.cpu_server import CPUEngine
from slime.models.tiny import build_tiny_model
from slime.utils.http_utils import post

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("engine") / "tiny", seed=0)


@pytest.fixture(scope="module")
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"question {i}: " + "how many rows? " * i}], add_generation_prompt=True
        )["input_ids"]
        for i in range(8)
    ]


def _generate(engine, input_ids, **sampling):
    return httpx.post(f"{engine.url}/generate", json={
        "input_ids": input_ids, "return_logprob": True, "sampling_params": sampling,
    }, timeout=60).json()


def _ids(result):
    return [tok for _, tok, _ in result["meta_info"]["output_token_logprobs"]]


def _reference_logprobs(model, prompt, output, temperature):
    """log_softmax(logits / T) of one unpadded full forward pass over prompt + output."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(output).view(-1, 1)).squeeze(1)


def test_generate_answers_sglang_shapes(engine, prompts):
    result = _generate(engine, prompts[0], max_new_tokens=12, temperature=1.0, ignore_eos=True)

    meta = result["meta_info"]
    assert set(result) == {"text", "output_ids", "meta_info"}
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["prompt_tokens"] == len(prompts[0]) and meta["completion_tokens"] == 12
    assert meta["weight_version"] == "0" and meta["cached_tokens"] == 0
    triples = meta["output_token_logprobs"]
    assert len(triples) == 12 and all(len(t) == 3 and t[2] is None and t[0] <= 0 for t in triples)
    assert _ids(result) == result["output_ids"]


def test_stop_token_ends_with_stop_and_is_trimmed_from_text_only(engine, tokenizer, prompts):
    free = _generate(engine, prompts[1], max_new_tokens=16, temperature=0, ignore_eos=True)
    stop_id = free["output_ids"][5]
    cut = free["output_ids"].index(stop_id) + 1

    stopped = _generate(engine, prompts[1], max_new_tokens=16, temperature=0, ignore_eos=True,
                        stop_token_ids=[stop_id], skip_special_tokens=False)
    kept = _generate(engine, prompts[1], max_new_tokens=16, temperature=0, ignore_eos=True,
                     stop_token_ids=[stop_id], skip_special_tokens=False, no_stop_trim=True)

    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert stopped["output_ids"] == _ids(stopped) == free["output_ids"][:cut]
    assert stopped["text"] == tokenizer.decode(free["output_ids"][: cut - 1])
    assert kept["text"] == tokenizer.decode(free["output_ids"][:cut])


def test_greedy_equals_model_generate(engine, model, prompts):
    result = _generate(engine, prompts[2], max_new_tokens=24, temperature=0, ignore_eos=True)

    expected = model.generate(torch.tensor([prompts[2]]), max_new_tokens=24, min_new_tokens=24,
                              do_sample=False, eos_token_id=None)[0, len(prompts[2]):].tolist()
    assert result["output_ids"] == expected


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_equal_a_full_forward_at_the_request_temperature(engine, model, prompts, temperature):
    result = _generate(engine, prompts[3], max_new_tokens=20, temperature=temperature, top_p=0.9,
                       ignore_eos=True, sampling_seed=7)

    got = torch.tensor([lp for lp, _, _ in result["meta_info"]["output_token_logprobs"]])
    want = _reference_logprobs(model, prompts[3], result["output_ids"], temperature or 1.0)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_concurrent_requests_are_batched_and_match_solo_runs(engine, prompts):
    def payload(i):
        return {"input_ids": prompts[i], "return_logprob": True, "sampling_params": {
            "temperature": 0.9, "max_new_tokens": 24 + 4 * i, "ignore_eos": True, "sampling_seed": 100 + i}}

    solo = [httpx.post(f"{engine.url}/generate", json=payload(i), timeout=60).json() for i in range(8)]
    before = httpx.get(f"{engine.url}/get_server_info").json()["decode_steps"]

    async def together():
        return await asyncio.gather(*(post(f"{engine.url}/generate", payload(i)) for i in range(8)))

    batched = asyncio.run(together())
    info = httpx.get(f"{engine.url}/get_server_info").json()

    assert info["max_running_reqs"] == 8
    assert info["decode_steps"] - before < sum(24 + 4 * i for i in range(8)) / 4  # shared steps
    for one, many in zip(solo, batched, strict=True):
        assert many["output_ids"] == one["output_ids"]
        diffs = [abs(a[0] - b[0]) for a, b in zip(one["meta_info"]["output_token_logprobs"],
                                                  many["meta_info"]["output_token_logprobs"], strict=True)]
        assert max(diffs) < 1e-5


def test_list_of_prompts_returns_one_result_each(engine, prompts):
    results = httpx.post(f"{engine.url}/generate", json={
        "input_ids": prompts[:3], "sampling_params": {"max_new_tokens": 5, "temperature": 0},
    }, timeout=60).json()

    assert [len(r["output_ids"]) <= 5 for r in results] == [True] * 3
    assert results[1]["output_ids"] == _generate(engine, prompts[1], max_new_tokens=5, temperature=0)["output_ids"]


def test_unsupported_sampling_param_is_a_400(engine, prompts):
    reply = httpx.post(f"{engine.url}/generate", json={"input_ids": prompts[0],
                                                       "sampling_params": {"frequency_penaltyy": 1}})
    assert reply.status_code == 400 and "frequency_penaltyy" in reply.json()["error"]["message"]


def test_next_turn_reuses_the_previous_turns_kv_with_the_same_log_probs(engine, model, tokenizer, prompts):
    httpx.post(f"{engine.url}/flush_cache").raise_for_status()
    first = _generate(engine, prompts[4], max_new_tokens=16, temperature=1.0, ignore_eos=True, sampling_seed=3)
    observation = tokenizer("<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
                            "<|im_start|>assistant\n")["input_ids"]
    turn2 = prompts[4] + first["output_ids"] + observation
    second = _generate(engine, turn2, max_new_tokens=16, temperature=0.8, ignore_eos=True, sampling_seed=5)
    info = httpx.get(f"{engine.url}/get_server_info").json()

    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] == len(prompts[4]) + 16 - 1  # the last output token was never fed
    got = torch.tensor([lp for lp, _, _ in second["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(got, _reference_logprobs(model, turn2, second["output_ids"], 0.8), atol=1e-5, rtol=0)
    assert info["prefix_cache_hits"] >= 1
    httpx.post(f"{engine.url}/flush_cache").raise_for_status()
    again = _generate(engine, turn2, max_new_tokens=16, temperature=0.8, ignore_eos=True, sampling_seed=5)
    assert again["meta_info"]["cached_tokens"] == 0 and again["output_ids"] == second["output_ids"]


def test_control_endpoints(engine):
    assert engine.health()
    assert httpx.get(f"{engine.url}/health_generate", timeout=30).status_code == 200
    assert httpx.get(f"{engine.url}/flush_cache").status_code == 200
    info = httpx.get(f"{engine.url}/get_model_info").json()
    assert info["model_path"] == str(engine.model_path) and info["is_generation"] is True


def test_abort_request_ends_an_in_flight_request_with_abort(engine, prompts):
    replies = {}

    def long_request():
        replies["long"] = httpx.post(f"{engine.url}/generate", timeout=60, json={
            "input_ids": prompts[4], "rid": "long-one", "return_logprob": True,
            "sampling_params": {"max_new_tokens": 100_000, "ignore_eos": True}}).json()

    thread = threading.Thread(target=long_request)
    thread.start()
    deadline = time.monotonic() + 20
    while httpx.get(f"{engine.url}/get_server_info").json()["num_running_reqs"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)
    busy = httpx.post(f"{engine.url}/flush_cache")
    httpx.post(f"{engine.url}/abort_request", json={"rid": "long-one"})
    thread.join(30)

    meta = replies["long"]["meta_info"]
    assert busy.status_code == 503
    assert meta["finish_reason"]["type"] == "abort" and meta["id"] == "long-one"
    assert 0 < meta["completion_tokens"] < 100_000
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]


def test_update_weights_from_disk_changes_outputs(engine, model, model_dir, prompts, tmp_path):
    before = _generate(engine, prompts[5], max_new_tokens=16, temperature=0, ignore_eos=True)
    perturbed = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        torch.manual_seed(3)
        for p in perturbed.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    perturbed.save_pretrained(tmp_path / "step1")

    version = engine.update_weights_from_disk(str(tmp_path / "step1"), weight_version="step-1")
    after = _generate(engine, prompts[5], max_new_tokens=16, temperature=0, ignore_eos=True)
    bad = httpx.post(f"{engine.url}/update_weights_from_disk", json={"model_path": str(tmp_path / "none")})
    restored = engine.update_weights_from_disk(str(model_dir))

    assert version == "step-1" and after["meta_info"]["weight_version"] == "step-1"
    assert after["output_ids"] != before["output_ids"]
    got = torch.tensor([lp for lp, _, _ in after["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(got, _reference_logprobs(perturbed, prompts[5], after["output_ids"], 1.0), atol=1e-5)
    assert bad.status_code == 400 and bad.json()["success"] is False
    assert restored == "2"
    final = _generate(engine, prompts[5], max_new_tokens=16, temperature=0, ignore_eos=True)
    assert final["output_ids"] == before["output_ids"]
    assert after["meta_info"]["cached_tokens"] == final["meta_info"]["cached_tokens"] == 0  # updates empty it


def test_standalone_server_prints_url_serves_and_exits_on_sigterm(model_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime.engine.cpu_server", "--model-path", str(model_dir), "--port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        assert httpx.get(f"{url}/health").status_code == 200
        result = httpx.post(f"{url}/generate", json={"input_ids": [1, 2, 3],
                                                     "sampling_params": {"max_new_tokens": 3}}).json()
        assert result["meta_info"]["completion_tokens"] <= 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_top_k_draws_only_among_the_k_most_likely_tokens(engine, model, prompts):
    result = _generate(engine, prompts[6], max_new_tokens=20, temperature=1.5, top_k=3, ignore_eos=True,
                       sampling_seed=11)

    with torch.no_grad():
        logits = model(torch.tensor([prompts[6] + result["output_ids"]])).logits[0, len(prompts[6]) - 1 : -1]
    top3 = logits.topk(3, -1).indices.tolist()
    assert all(tok in allowed for tok, allowed in zip(result["output_ids"], top3, strict=True))
    again = _generate(engine, prompts[6], max_new_tokens=20, temperature=1.5, top_k=3, ignore_eos=True,
                      sampling_seed=11)
    assert again["output_ids"] == result["output_ids"]


def test_weights_update_while_paused_and_requests_resume_on_continue(engine, model_dir, prompts):
    replies = {}
    engine.pause_generation()
    thread = threading.Thread(target=lambda: replies.update(r=_generate(engine, prompts[7], max_new_tokens=4)))
    thread.start()
    time.sleep(0.2)
    assert "r" not in replies  # held while paused

    version = engine.update_weights_from_disk(str(model_dir), weight_version="paused-update")
    engine.continue_generation()
    thread.join(30)

    assert version == "paused-update"
    assert replies["r"]["meta_info"]["weight_version"] == "paused-update"


def test_released_memory_refuses_requests_until_resumed_and_weights_are_sent(model_dir, prompts):
    """SGLang's release/resume contract for a colocated trainer: while released, generation answers 503
    and weight updates are refused; resumed weights are uninitialised until the next update."""
    engine = CPUEngine(model_dir, port=0, seed=0)
    engine.start()
    try:
        before = _generate(engine, prompts[3], max_new_tokens=12, temperature=0, ignore_eos=True)
        engine.pause_generation()  # a waiting request blocks the release
        thread = threading.Thread(target=lambda: _generate(engine, prompts[1], max_new_tokens=2))
        thread.start()
        deadline = time.monotonic() + 20
        while httpx.get(f"{engine.url}/get_server_info").json()["num_waiting_reqs"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        busy = httpx.post(f"{engine.url}/release_memory_occupation", json={}, timeout=30)
        engine.continue_generation()
        thread.join(30)
        assert busy.status_code == 400 and "requests are running or waiting" in busy.json()["message"]

        engine.release_memory_occupation()
        refused = httpx.post(f"{engine.url}/generate", json={"input_ids": prompts[3]}, timeout=30)
        assert refused.status_code == 503 and "released" in refused.json()["error"]["message"]
        early = httpx.post(f"{engine.url}/update_weights_from_disk", json={"model_path": str(model_dir)}, timeout=30)
        assert early.status_code == 400 and "resume_memory_occupation" in early.json()["message"]
        bad_tag = httpx.post(f"{engine.url}/resume_memory_occupation", json={"tags": ["disk"]}, timeout=30)
        assert bad_tag.status_code == 400

        engine.resume_memory_occupation(["weights"])
        still = httpx.post(f"{engine.url}/generate", json={"input_ids": prompts[3]}, timeout=30)
        assert still.status_code == 503 and "kv_cache" in still.json()["error"]["message"]
        engine.update_weights_from_disk(str(model_dir), weight_version="resumed")
        engine.resume_memory_occupation(["kv_cache", "cuda_graph"])
        after = _generate(engine, prompts[3], max_new_tokens=12, temperature=0, ignore_eos=True)
        assert after["output_ids"] == before["output_ids"]
        assert after["meta_info"]["weight_version"] == "resumed"
    finally:
        engine.shutdown()


def test_stopping_an_in_process_engine_leaves_other_servers_event_streams_alone(model_dir):
    """sse_starlette (the MCP SDK's) makes any uvicorn `handle_exit` end every event stream of the process
    for good; an engine stopped in-process (eval, BFCL) must not, or a later SSE server answers nothing."""
    from sse_starlette.sse import AppStatus

    engine = CPUEngine(model_dir, port=0, seed=0)
    engine.start()
    engine.shutdown()
    assert AppStatus.should_exit is False
