"""B2+: an LLM judge scores each tool call, over a real OpenAI-compatible HTTP server on 127.0.0.1.

The judge server (aiohttp) answers /v1/chat/completions with a reply chosen by the tool named in the
graded step; it can answer malformed text or stall past the client's timeout. The rollout part uses
the real runtime (bundled library_lending_1, task 3), real predicates and the scripted engine.
"""

from __future__ import annotations

import argparse
import asyncio
import threading

import pytest
from aiohttp import web
from rollout_helpers import make_args

from awm_grpo.recovery.judge import JudgeConfig, JudgeError, judge_messages, parse_score, score_turns
from awm_grpo.recovery.plugin import advantages
from awm_grpo.reward import reward
from awm_grpo.rollout import generate
from slime.rollout.sglang_rollout import sampling_params_from_args
from slime.utils.types import Sample

SCENARIO = "library_lending_1"
LIST = '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>'
CHECKOUT = ('<tool_call>\n{"name": "call_tool", "arguments": {"tool_name": "checkout_copy", '
            '"arguments": {"copy_id": 1}}}\n</tool_call>')


class JudgeServer:
    """A scripted OpenAI-compatible chat endpoint: `replies[tool]` is the text for a step calling `tool`."""

    def __init__(self) -> None:
        self.replies: dict[str, str] = {}
        self.stall_s = 0.0
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.stall_s or 0.05)
        finally:
            self.in_flight -= 1
        step = body["messages"][-1]["content"].split("Step to grade", 1)[1]
        tool = next((t for t in self.replies if f"{t}(" in step or f'"{t}"' in step), None)
        text = self.replies.get(tool, "SCORE: 0.5")
        return web.json_response({"model": body["model"], "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}})

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def judge_server():
    server = JudgeServer()
    yield server
    server.stop()


@pytest.fixture
def judge(judge_server, monkeypatch):
    judge_server.replies, judge_server.stall_s = {}, 0.0
    judge_server.requests.clear()
    judge_server.max_in_flight = 0
    judge_server.headers.clear()
    monkeypatch.setenv("AWM_JUDGE_API_KEY", "sk-test")
    return judge_server


def config(url: str, **kw) -> JudgeConfig:
    args = argparse.Namespace(awm_judge_url=url, awm_judge_model="judge-8b", **{f"awm_judge_{k}": v
                                                                                   for k, v in kw.items()})
    return JudgeConfig.from_args(args)


TURNS = [
    {"assistant": "x", "calls": [{"name": "search_books", "arguments": {"q": "Hail Mary"}, "is_error": False}],
     "observations": ["[{\"copy_id\": 1}]"]},
    {"assistant": "y", "calls": [{"name": "checkout_copy", "arguments": {"copy_id": 1}, "is_error": False}],
     "observations": ["{\"loan_id\": 15}"]},
    {"assistant": "Checked out."},  # a final answer: nothing to judge
]


def test_parse_score_accepts_the_asked_format_and_refuses_the_rest():
    assert parse_score("SCORE: 0.75") == 0.75
    assert parse_score("<think>maybe SCORE: 0.1</think>\nReasoning... score = 1") == 1.0
    assert parse_score("0.3") == 0.3
    assert parse_score("score: 0.2 ... final SCORE: 0.9") == 0.9  # the last one wins
    for bad in ("", "very helpful", "SCORE: 7", "SCORE: -0.5", "<think>SCORE: 0.5</think>"):
        with pytest.raises(JudgeError):
            parse_score(bad)


def test_prompt_holds_task_history_and_the_graded_step():
    messages = judge_messages("Check out Project Hail Mary", TURNS, 1)
    user = messages[-1]["content"]
    assert "Check out Project Hail Mary" in user
    history, step = user.split("Step to grade", 1)
    assert 'search_books({"q": "Hail Mary"})' in history and "copy_id" in history
    assert 'checkout_copy({"copy_id": 1})' in step and "loan_id" in step and "search_books" not in step
    assert "first step" in judge_messages("t", TURNS, 0)[-1]["content"]


def test_scores_every_call_turn_through_the_endpoint(judge):
    judge.replies = {"search_books": "SCORE: 0.4", "checkout_copy": "The call is right.\nSCORE: 1"}
    cfg = config(judge.url, concurrency=2)
    scores = asyncio.run(score_turns(cfg.client(), "Check out Project Hail Mary", TURNS))
    assert scores == [0.4, 1.0, None]
    assert len(judge.requests) == 2 and {r["model"] for r in judge.requests} == {"judge-8b"}
    assert {h.get("Authorization") for h in judge.headers} == {"Bearer sk-test"}  # from awm_judge_api_key_env


def test_concurrency_bounds_the_requests_in_flight(judge):
    turns = [TURNS[0]] * 6
    asyncio.run(score_turns(config(judge.url, concurrency=2).client(), "task", turns))
    assert len(judge.requests) == 6 and judge.max_in_flight == 2
    judge.max_in_flight = 0
    asyncio.run(score_turns(config(judge.url, concurrency=6).client(), "task", turns))
    assert judge.max_in_flight == 6


def test_malformed_reply_and_timeout_are_judge_errors(judge):
    judge.replies = {"checkout_copy": "I would say it is quite helpful."}
    with pytest.raises(JudgeError, match="turn 2: judge reply has no 'SCORE"):
        asyncio.run(score_turns(config(judge.url, retries=0).client(), "task", TURNS))
    judge.replies, judge.stall_s = {}, 2.0
    with pytest.raises(JudgeError, match="judge request for turn .* failed"):
        asyncio.run(score_turns(config(judge.url, retries=0, timeout=0.3).client(), "task", TURNS))


def test_config_needs_a_model_and_sane_limits():
    assert JudgeConfig.from_args(argparse.Namespace()) is None  # no URL: no judge
    with pytest.raises(ValueError, match="AWM_JUDGE_MODEL"):
        JudgeConfig.from_args(argparse.Namespace(awm_judge_url="http://x/v1"))
    with pytest.raises(ValueError, match="concurrency >= 1"):
        config("http://x/v1", concurrency=0)


# ---- in the rollout and the advantage function ----------------------------------------------------
@pytest.fixture(scope="module")
def predicates(tmp_path_factory):
    from awm.predicates.build import build, write_predicates

    path = tmp_path_factory.mktemp("preds") / "predicates.jsonl"
    write_predicates(asyncio.run(build(None, scenarios=[SCENARIO])), path)
    return str(path)


def play(args, index: int) -> Sample:
    meta = {"scenario": SCENARIO, "task_idx": 3, "task": "", "task_type": "state_mutating"}
    sample = Sample(index=index, group_index=0, prompt="", metadata=meta)

    async def go() -> Sample:
        out = await generate(args, sample, sampling_params_from_args(args))
        out.reward = await reward(args, out)
        return out

    return asyncio.run(go())


def test_b2plus_puts_judge_step_rewards_on_each_turn_and_a_bad_judge_fails_the_episode(
        tiny_model_dir, scripted, tmp_path, predicates, judge):
    scripted.reset()
    judge.replies = {"checkout_copy": "SCORE: 0.9", "list_tools": "SCORE: 0.2"}
    args = make_args(tiny_model_dir, scripted.url, tmp_path, predicates=predicates, judge_url=judge.url,
                     judge_model="judge-8b", judge_retries=0)
    scripted.reply(CHECKOUT, "Checked out copy LIB-000101 of Project Hail Mary.")
    a = play(args, 0)
    scripted.reply(LIST, "Done.")
    b = play(args, 1)
    assert a.metadata["awm"]["judge"] == [0.9, None] and b.metadata["awm"]["judge"] == [0.2, None]
    assert a.metadata["awm"]["verdict"] == "complete" and b.metadata["awm"]["verdict"] != "complete"
    assert [t.get("judge_score") for t in a.metadata["awm_trace"]["turns"]] == [0.9, None]  # the trace record
    # max_turns 6, eta 0.95: r_A = [0.1 x 0.8 / 6, 1], r_B = [0.1 x -0.6 / 6, 0]
    args.awm_credit_method, args.awm_credit_eta = "b2plus", 0.95
    g_a = [0.08 / 6 + 0.95, 1.0]
    g_b = [-0.06 / 6, 0.0]
    adv_a, adv_b = advantages(args, [a, b])
    for sample, adv, expected in ((a, adv_a, [g_a[0] - g_b[0], g_a[1] - g_b[1]]),
                                  (b, adv_b, [g_b[0] - g_a[0], g_b[1] - g_a[1]])):
        for (start, end), value in zip(sample.metadata["awm"]["credit"]["span"], expected, strict=True):
            assert adv[start:end] == pytest.approx([value] * (end - start), abs=1e-5)
    # a malformed judge answer: an infrastructure failure, out of the group, never a silent 0
    judge.replies = {"checkout_copy": "helpful!"}
    scripted.reply(CHECKOUT, "Checked out copy LIB-000101 of Project Hail Mary.")
    c = play(args, 2)
    assert c.status == Sample.Status.FAILED and c.remove_sample
    assert c.metadata["awm"]["infra_error"].startswith("judge: turn 1: judge reply has no 'SCORE")
    adv = advantages(args, [a, b, c])
    assert adv[2] == [0.0] * c.response_length and adv[0] == adv_a  # c stays out of a and b's baselines
    # evaluation episodes are not judged (the score is a training reward)
    scripted.reply(CHECKOUT, "Checked out copy LIB-000101 of Project Hail Mary.")
    sample = Sample(index=3, group_index=1, prompt="", metadata={"scenario": SCENARIO, "task_idx": 3, "task": ""})
    asked = len(judge.requests)
    ev = asyncio.run(generate(args, sample, sampling_params_from_args(args), evaluation=True))
    assert ev.metadata["awm"]["judge"] is None and len(judge.requests) == asked
    # b2plus without a judge says what to set
    b.metadata["awm"]["judge"] = None
    with pytest.raises(ValueError, match="AWM_JUDGE_URL"):
        advantages(args, [a, b])
