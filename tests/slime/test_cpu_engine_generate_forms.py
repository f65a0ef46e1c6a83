"""Every /generate body form SGLang takes, served by the CPU engine and read as SGLang reads it.

SGLang's GenerateReqInput takes `text` (one string or a list) or `input_ids` (one list of ids or a list
of lists), one `sampling_params` object for all prompts or a list with one per prompt, and `n` > 1
(parallel sampling) turns even one prompt into a batch. Upstream plugins send all of these (search-r1
posts one `text` string). The engine must answer each as SGLang does -- one object for a single
prompt, a list otherwise -- and refuse a malformed body with a 400 that says what to send, never a 500.

The agreement with SGLang is checked against the pinned sglangs' own `GenerateReqInput`
(`normalize_batch_and_arguments`) in a subprocess with their side install (tests/sglang_real.py):
every body the engine serves must be one SGLang accepts, with the same single/batch decision and the
same number of results.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from typing import Any

import httpx
import pytest
from sglang_real import sglang_env
from transformers import AutoTokenizer

from slime.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("forms") / "tiny", seed=0)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


TEXTS = ["question one: how many rows?", "question two: which table?", "three"]
GREEDY = {"max_new_tokens": 4, "temperature": 0.0}


def _post(engine, body: Any) -> httpx.Response:
    return httpx.post(f"{engine.url}/generate", json=body, timeout=60)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_single_text_string_is_answered_with_one_object(engine, tokenizer):
    reply = _post(engine, {"text": TEXTS[0], "sampling_params": GREEDY, "return_logprob": True})

    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert isinstance(result, dict) and set(result) == {"text", "output_ids", "meta_info"}
    assert result["meta_info"]["prompt_tokens"] == len(_ids(tokenizer, TEXTS[0]))
    same = _post(engine, {"input_ids": _ids(tokenizer, TEXTS[0]), "sampling_params": GREEDY}).json()
    assert result["output_ids"] == same["output_ids"]
    assert len(result["meta_info"]["output_token_logprobs"]) == len(result["output_ids"])


def test_a_list_of_texts_is_answered_with_one_result_per_prompt_in_order(engine, tokenizer):
    results = _post(engine, {"text": TEXTS, "sampling_params": GREEDY}).json()

    assert isinstance(results, list) and len(results) == 3
    for text, result in zip(TEXTS, results, strict=True):
        alone = _post(engine, {"text": text, "sampling_params": GREEDY}).json()
        assert result["output_ids"] == alone["output_ids"]
        assert result["meta_info"]["prompt_tokens"] == len(_ids(tokenizer, text))


def test_a_batch_takes_one_sampling_params_per_prompt(engine, tokenizer):
    ids = [_ids(tokenizer, t) for t in TEXTS[:2]]
    params = [{"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True},
              {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True}]

    results = _post(engine, {"input_ids": ids, "sampling_params": params, "return_logprob": [True, False]}).json()

    assert [r["meta_info"]["completion_tokens"] for r in results] == [2, 5]
    assert "output_token_logprobs" in results[0]["meta_info"]
    assert "output_token_logprobs" not in results[1]["meta_info"]


def test_n_samples_turn_one_prompt_into_a_batch_grouped_by_prompt(engine):
    one = _post(engine, {"text": TEXTS[2], "rid": "r", "sampling_params": {**GREEDY, "n": 3}}).json()
    assert isinstance(one, list) and len(one) == 3
    assert [r["meta_info"]["id"] for r in one] == ["r_0", "r_1", "r_2"]  # sglang's rid suffixes
    assert len({tuple(r["output_ids"]) for r in one}) == 1  # greedy: the same answer each time

    two = _post(engine, {"text": TEXTS[:2], "sampling_params": {**GREEDY, "n": 2}}).json()
    alone = [_post(engine, {"text": t, "sampling_params": GREEDY}).json()["output_ids"] for t in TEXTS[:2]]
    assert [r["output_ids"] for r in two] == [alone[0], alone[0], alone[1], alone[1]]


def test_a_rid_string_for_a_batch_gets_sglangs_suffixes(engine):
    results = _post(engine, {"text": TEXTS[:2], "rid": "job", "sampling_params": GREEDY}).json()
    assert [r["meta_info"]["id"] for r in results] == ["job_0", "job_1"]
    results = _post(engine, {"text": TEXTS[:2], "rid": ["a", "b"], "sampling_params": GREEDY}).json()
    assert [r["meta_info"]["id"] for r in results] == ["a", "b"]


BAD_BODIES = {
    "array body": ([{"text": "x"}], "JSON object"),
    "no prompt": ({"sampling_params": GREEDY}, "send text"),
    "both prompt kinds": ({"text": "x", "input_ids": [1, 2]}, "not both"),
    "text of numbers": ({"text": [1, 2]}, "text must be"),
    "empty text list": ({"text": []}, "text must be"),
    "float ids": ({"input_ids": [1.5, 2.0]}, "input_ids must be"),
    "empty ids": ({"input_ids": []}, "input_ids must be"),
    "ragged ids": ({"input_ids": [[1, 2], 3]}, "input_ids must be"),
    "params list for one prompt": ({"text": "x", "sampling_params": [GREEDY]}, "one prompt"),
    "params list too short": ({"text": ["x", "y"], "sampling_params": [GREEDY]}, "1 entries for 2"),
    "params not an object": ({"text": ["x", "y"], "sampling_params": [GREEDY, 3]}, "must be an object"),
    "mixed n": ({"text": ["x", "y"], "sampling_params": [{"n": 1}, {"n": 2}]}, "same for all"),
    "zero n": ({"text": "x", "sampling_params": {"n": 0}}, "n must be"),
    "rid list for one prompt": ({"text": "x", "rid": ["a"]}, "rid must be"),
    "rid list with n": ({"text": ["x"], "rid": ["a"], "sampling_params": {"n": 2}}, "n > 1"),
    "unknown sampling param": ({"text": "x", "sampling_params": {"temprature": 1}}, "temprature"),
    "id outside the vocabulary": ({"input_ids": [[1, 2], [10 ** 9]]}, "input_ids must lie"),
    "stream": ({"text": "x", "stream": True}, "stream"),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_a_bad_body_is_a_400_with_a_sentence(engine, name):
    body, words = BAD_BODIES[name]
    reply = _post(engine, body)
    assert reply.status_code == 400, (reply.status_code, reply.text)
    assert words in reply.json()["error"]["message"]


def test_a_body_that_is_not_json_is_a_400(engine):
    reply = httpx.post(f"{engine.url}/generate", content=b"{not json", timeout=30,
                       headers={"content-type": "application/json"})
    assert reply.status_code == 400 and "not JSON" in reply.json()["error"]["message"]


def test_a_refused_batch_leaves_no_request_running(engine, tokenizer):
    """The second prompt's ids are out of range: the first, already queued, must be aborted, not left to run."""
    long = {"max_new_tokens": 20000, "temperature": 1.0, "ignore_eos": True}
    reply = _post(engine, {"input_ids": [_ids(tokenizer, TEXTS[0]), [10 ** 9]], "sampling_params": long})
    assert reply.status_code == 400
    # /flush_cache answers 200 only when nothing runs; the aborted request leaves within a step or two
    deadline = time.monotonic() + 10
    while httpx.post(f"{engine.url}/flush_cache", timeout=30).status_code != 200:
        if time.monotonic() > deadline:
            pytest.fail("a request of the refused batch kept running (20000 tokens take far longer)")
        time.sleep(0.05)


# Bodies the engine serves, in every form; each must be read by SGLang with the same batch decision.
SERVED_BODIES: list[dict[str, Any]] = [
    {"text": TEXTS[0], "sampling_params": GREEDY},
    {"text": TEXTS[0], "sampling_params": GREEDY, "return_logprob": True, "rid": "one"},
    {"text": TEXTS, "sampling_params": GREEDY},
    {"text": TEXTS[:2], "sampling_params": [GREEDY, GREEDY], "return_logprob": [True, False]},
    {"text": TEXTS[:2], "rid": ["a", "b"], "sampling_params": GREEDY},
    {"text": TEXTS[:2], "rid": "job", "sampling_params": GREEDY},
    {"input_ids": [5, 6, 7], "sampling_params": GREEDY},
    {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": GREEDY},
    {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": [GREEDY, {**GREEDY, "max_new_tokens": 2}]},
    {"input_ids": [5, 6, 7]},
    {"text": TEXTS[2], "sampling_params": {**GREEDY, "n": 3}},
    {"text": TEXTS[:2], "sampling_params": {**GREEDY, "n": 2}, "rid": "p"},
    {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": [{**GREEDY, "n": 2}, {**GREEDY, "n": 2}]},
]

_SGLANG_READER = textwrap.dedent("""
    import json, sys
    from sglang.srt.managers.io_struct import GenerateReqInput
    answers = []
    for body in json.load(sys.stdin):
        try:
            req = GenerateReqInput(**body)
            req.normalize_batch_and_arguments()
        except Exception as exc:
            answers.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        answers.append({"is_single": bool(req.is_single), "batch_size": req.batch_size,
                        "n": req.parallel_sample_num})
    print("ANSWERS " + json.dumps(answers))
""")


def test_every_served_form_is_read_by_sglang_with_the_same_batch_size(engine, sglang):
    """`sglang` (tests/conftest.py) runs once per pinned sglang; its check_request is the struct and JSON
    contract check of /generate, and a subprocess of the same install runs normalize_batch_and_arguments."""
    struct = sglang.body_struct("POST", "/generate")
    for body in SERVED_BODIES:
        assert sglang.validate_body(struct, body) is None, body
        # check_request also runs each sampling_params through sglang's SamplingParams (a dict at a time)
        params = body.get("sampling_params")
        for one in params if isinstance(params, list) else [params]:
            single = {**body, "sampling_params": one} if one is not None else body
            assert sglang.check_request("POST", "/generate", single) == [], single
    run = subprocess.run([sys.executable, "-c", _SGLANG_READER], input=json.dumps(SERVED_BODIES),
                         env=sglang_env(sglang.gpu_set), capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("ANSWERS ")]
    assert run.returncode == 0 and lines, run.stderr[-4000:]
    answers = json.loads(lines[-1][len("ANSWERS "):])

    for body, sglang_reads in zip(SERVED_BODIES, answers, strict=True):
        assert "error" not in sglang_reads, (body, sglang_reads)
        reply = _post(engine, body)
        assert reply.status_code == 200, (body, reply.text)
        ours = reply.json()
        answers_one = isinstance(ours, dict)
        # sglang answers one object only for a single prompt without parallel sampling
        assert answers_one == (sglang_reads["is_single"] and sglang_reads["n"] == 1), (body, sglang_reads)
        count = 1 if answers_one else len(ours)
        assert count == sglang_reads["batch_size"] * sglang_reads["n"], (body, sglang_reads)
