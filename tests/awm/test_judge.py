"""The chat client and the sql-mode judge, against a real local OpenAI-compatible HTTP server."""

import asyncio
import json
import socket
import sqlite3
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from awm.judge import (
    JudgeConfig,
    JudgeReplyError,
    SqlJudge,
    judge_messages,
    judge_task,
    parse_judgement,
    summarise_trajectory,
)
from awm.llm import ChatClient, LLMError
from awm.verifier import VerifierSandbox

EVIDENCE_CODE = """\
def verify_task(initial_db_path, final_db_path):
    def names(path):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = [name for (name,) in conn.execute("SELECT name FROM items ORDER BY id")]
        conn.close()
        return rows
    return {"before": names(initial_db_path), "after": names(final_db_path)}
"""
EVIDENCE = {"before": ["kettle"], "after": ["kettle", "toaster"]}
TASK = "Add a toaster to my list."
TRAJECTORY = [
    {"role": "user", "content": TASK},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "add_item", "arguments": '{"name": "toaster"}'}}],
    },
    {"role": "tool", "content": '{"id": 2, "name": "toaster"}'},
    {"role": "assistant", "content": "Added the toaster."},
]


def completion(text: str) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "model": "fake-judge",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
        }
    )


def judgement(classification: str, reasoning: str = "The toaster row was added.") -> str:
    return json.dumps(
        {
            "reasoning": reasoning,
            "confidence_score": [90, 5, 0, 5],
            "classification": classification,
            "evidence": {
                "status": "done",
                "iterations": 2,
                "error_signals": [],
                "last_actions": ["add_item"],
                "database_verification": "toaster added",
            },
        }
    )


class FakeLLM:
    """A scripted OpenAI-compatible server on 127.0.0.1: each POST takes the next (status, body, delay_s)."""

    def __init__(self) -> None:
        self.replies: deque[tuple[int, str, float]] = deque()
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append(
                        {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                    )
                    status, text, delay_s = (
                        fake.replies.popleft() if fake.replies else (500, "no scripted reply", 0.0)
                    )
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                time.sleep(delay_s)
                with fake.lock:
                    fake.in_flight -= 1
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def script(self, *replies: tuple) -> None:
        self.requests.clear()
        self.replies.clear()
        for status, text, *delay_s in replies:
            self.replies.append((status, text, delay_s[0] if delay_s else 0.0))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fake_llm():
    server = FakeLLM()
    yield server
    server.close()


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("judge")
    paths = []
    for name, items in (("initial.db", EVIDENCE["before"]), ("final.db", EVIDENCE["after"])):
        conn = sqlite3.connect(root / name)
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        conn.executemany("INSERT INTO items (name) VALUES (?)", [(item,) for item in items])
        conn.commit()
        conn.close()
        paths.append(str(root / name))
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def sandbox():
    with VerifierSandbox() as box:
        yield box


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def config_for(base_url: str) -> JudgeConfig:
    return JudgeConfig(base_url=base_url, api_key="sk-fake", model="fake-judge", timeout_s=5.0, retries=2)


def fast_client(base_url: str, **kwargs) -> ChatClient:
    return ChatClient(base_url, "sk-fake", "fake-model", timeout_s=5.0, backoff_s=0.01, **kwargs)


def run_judge(sandbox, dbs, base_url: str, code: str = EVIDENCE_CODE, timeout_s: float = 10.0):
    async def scenario():
        config = config_for(base_url)
        judge = SqlJudge(sandbox, config, fast_client(base_url, retries=config.retries))
        try:
            return await judge.averify(code, TASK, TRAJECTORY, *dbs, timeout_s=timeout_s)
        finally:
            await judge.aclose()

    return asyncio.run(scenario())


def test_chat_client_sends_an_openai_request(fake_llm):
    fake_llm.script((200, completion("hello")))

    async def call():
        async with fast_client(fake_llm.base_url) as client:
            return await client.chat([{"role": "user", "content": "hi"}], temperature=0.2, max_tokens=16)

    reply = asyncio.run(call())
    assert (reply.text, reply.usage["total_tokens"], reply.finish_reason) == ("hello", 150, "stop")
    [request] = fake_llm.requests
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-fake"
    assert request["body"] == {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "max_tokens": 16,
    }


def test_chat_client_retries_server_errors_then_gives_up(fake_llm):
    fake_llm.script((500, "boom"), (200, "not json"), (200, completion("third time")))

    async def call(client_kwargs):
        async with fast_client(fake_llm.base_url, **client_kwargs) as client:
            return await client.chat([{"role": "user", "content": "hi"}])

    assert asyncio.run(call({"retries": 2})).text == "third time"
    assert len(fake_llm.requests) == 3
    fake_llm.script((503, "busy"), (503, "busy"), (503, "busy"))
    with pytest.raises(LLMError, match="3 attempts.*HTTP 503"):
        asyncio.run(call({"retries": 2}))
    fake_llm.script((400, '{"error": "unknown model"}'), (200, completion("never asked")))
    with pytest.raises(LLMError, match="refused the request with HTTP 400"):
        asyncio.run(call({"retries": 2}))
    assert len(fake_llm.requests) == 1  # a 4xx is not retried


def test_chat_client_unreachable_endpoint_raises(fake_llm):
    async def call():
        async with fast_client(closed_port_url(), retries=1) as client:
            return await client.chat([{"role": "user", "content": "hi"}])

    with pytest.raises(LLMError, match="ConnectError"):
        asyncio.run(call())


def test_chat_client_limits_concurrency(fake_llm):
    fake_llm.script(*[(200, completion(str(i)), 0.05) for i in range(6)])
    fake_llm.max_in_flight = 0

    async def call_all():
        async with fast_client(fake_llm.base_url, max_concurrency=2) as client:
            return await asyncio.gather(*(client.chat([{"role": "user", "content": "hi"}]) for _ in range(6)))

    assert len(asyncio.run(call_all())) == 6
    assert fake_llm.max_in_flight == 2


def test_parse_judgement_reads_strict_fenced_and_repairable_json():
    assert parse_judgement(judgement("complete"))["classification"] == "complete"
    fenced = "<think>check the rows</think>\n```json\n" + judgement("Server Error") + "\n```"
    assert parse_judgement(fenced)["classification"] == "server_error"
    broken = "{'reasoning': 'the agent stopped', 'classification': 'agent_error', 'confidence_score': [1, 2, 3, 94],"
    assert parse_judgement(broken) == {
        "reasoning": "the agent stopped",
        "classification": "agent_error",
        "confidence_score": [1, 2, 3, 94],
    }
    with pytest.raises(JudgeReplyError, match="no JSON object"):
        parse_judgement("I think the agent did fine.")
    with pytest.raises(JudgeReplyError, match="not one of"):
        parse_judgement(judgement("partially_complete"))


def test_judge_messages_carry_task_trajectory_and_evidence():
    long_tool_output = {"role": "tool", "content": "x" * 10000}
    trajectory = [TRAJECTORY[0], *[long_tool_output] * 100, TRAJECTORY[-1]]
    system, user = judge_messages(TASK, trajectory, EVIDENCE)
    assert "do not adopt" in system["content"] and '"classification"' in system["content"]
    assert TASK in user["content"] and json.dumps(EVIDENCE, indent=2) in user["content"]
    assert "(102 messages)" in user["content"] and "Added the toaster." in user["content"]
    summary = summarise_trajectory(trajectory, max_messages=10, max_chars=100)
    assert len(summary) == 11 and summary[2] == {"role": "note", "content": "92 messages omitted"}
    assert len(summary[3]["content"]) < 200 and "characters cut" in summary[3]["content"]


def test_sql_judge_end_to_end(fake_llm, sandbox, dbs):
    fake_llm.script((200, completion(judgement("complete"))))
    verdict = run_judge(sandbox, dbs, fake_llm.base_url)
    assert (verdict.verdict, verdict.mode, verdict.infra_failure) == ("complete", "sql", False)
    assert verdict.result["evidence"] == EVIDENCE and verdict.detail == "The toaster row was added."
    [request] = fake_llm.requests
    body = request["body"]
    assert (body["model"], body["temperature"], body["max_tokens"]) == ("fake-judge", 1.0, 4096)
    assert json.dumps(EVIDENCE, indent=2) in body["messages"][1]["content"]


def test_sql_judge_repairs_malformed_reply(fake_llm, sandbox, dbs):
    fake_llm.script(
        (200, completion("Here you go:\n{'classification': 'agent_error', 'reasoning': 'wrong item',}"))
    )
    verdict = run_judge(sandbox, dbs, fake_llm.base_url)
    assert (verdict.verdict, verdict.detail) == ("agent_error", "wrong item")


def test_sql_judge_garbage_or_unknown_label_is_judge_error(fake_llm, sandbox, dbs):
    fake_llm.script((200, completion("The task looks done to me.")))
    garbage = run_judge(sandbox, dbs, fake_llm.base_url)
    assert (garbage.verdict, garbage.infra_failure) == ("judge_error", True)
    assert garbage.result["reply"] == "The task looks done to me."
    fake_llm.script((200, completion(judgement("mostly_done"))))
    assert run_judge(sandbox, dbs, fake_llm.base_url).verdict == "judge_error"


def test_sql_judge_retries_http_500(fake_llm, sandbox, dbs):
    fake_llm.script((500, "internal error"), (200, completion(judgement("incomplete"))))
    assert run_judge(sandbox, dbs, fake_llm.base_url).verdict == "incomplete"
    assert len(fake_llm.requests) == 2


def test_sql_judge_unreachable_endpoint_is_judge_error(sandbox, dbs):
    verdict = run_judge(sandbox, dbs, closed_port_url())
    assert verdict.verdict == "judge_error" and "judge endpoint failed" in verdict.detail
    assert verdict.result == {"evidence": EVIDENCE}


def test_sql_evidence_failures_skip_the_judge(fake_llm, sandbox, dbs):
    fake_llm.script((200, completion(judgement("complete"))))
    not_dict = run_judge(
        sandbox,
        dbs,
        fake_llm.base_url,
        "def verify_task(initial_db_path, final_db_path):\n    return [1, 2]\n",
    )
    assert not_dict.verdict == "judge_error" and "list" in not_dict.detail
    hangs = run_judge(
        sandbox,
        dbs,
        fake_llm.base_url,
        "def verify_task(a, b):\n    while True:\n        pass\n",
        timeout_s=0.3,
    )
    assert hangs.verdict == "timeout"
    assert fake_llm.requests == []


def test_judge_task_for_the_cli(fake_llm, dbs):
    fake_llm.script((200, completion(judgement("complete"))))
    config = JudgeConfig(base_url=fake_llm.base_url, model="fake-judge", retries=0)
    verdict = asyncio.run(
        judge_task(
            EVIDENCE_CODE,
            *dbs,
            task=TASK,
            trajectory=[],
            config=config,
            final_answer="<think>hm</think>Done.",
        )
    )
    assert verdict.verdict == "complete"
    assert '"content": "Done."' in fake_llm.requests[0]["body"]["messages"][1]["content"]


def test_judge_config_from_env(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://judge.local/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("AWM_JUDGE_MODEL", "judge-model")
    config = JudgeConfig.from_env(retries=5)
    assert (config.base_url, config.api_key, config.model, config.retries) == (
        "http://judge.local/v1",
        "sk-env",
        "judge-model",
        5,
    )
    assert (config.temperature, config.max_tokens) == (1.0, 4096)
    client = config.client(max_concurrency=4)
    assert (client.base_url, client.model, client.max_concurrency) == (
        "http://judge.local/v1",
        "judge-model",
        4,
    )
    monkeypatch.delenv("AWM_JUDGE_MODEL")
    with pytest.raises(ValueError, match="AWM_JUDGE_MODEL"):
        JudgeConfig.from_env()
