"""awm.serve.agentgym_server through real components: uvicorn on 127.0.0.1, raw HTTP, the bundled scenarios.

One server (a thread with its own event loop and EnvRuntime) serves every bundled scenario. Facts used
below come from the bundled data: issue 7 of project_tracker_1 carries only the label 'bug'; its task 4
asks to add the label 'regression' (id 6). Reference and wrong solutions are the bundled
reference_solutions.jsonl, read with awm.solutions.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from awm.episode import EnvRuntime
from awm.serve.agentgym_server import FINISH, BadAction, parse_action, serve
from awm.serve.limits import ServerLimits
from awm.solutions import load_solutions
from conftest import FAULT_APP, write_scenarios

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 8
MAX_ENVS = 6


class AgentGymServer:
    """A real server in a thread (its own loop and runtime) until `shutdown`."""

    def __init__(self, runtime: EnvRuntime, **serve_kwargs: Any) -> None:
        self.runtime, self.serve_kwargs = runtime, serve_kwargs
        self.url, self.error = "", None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None
        self.listening = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> AgentGymServer:
        self.thread.start()
        assert self.listening.wait(60) and self.url, f"the server did not start: {self.error!r}"
        return self

    async def _main(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            await serve(self.runtime, stop=self.stop, ready=self._ready, **self.serve_kwargs)
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.runtime.close()
            self.listening.set()

    def _ready(self, url: str, tasks: int, scenarios: int) -> None:
        self.url = url
        self.listening.set()

    def shutdown(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(20)
        assert not self.thread.is_alive(), "the server did not shut down"


@pytest.fixture(scope="module")
def server() -> AgentGymServer:
    limits = ServerLimits(max_sessions=MAX_ENVS, unused_session_timeout_s=2.0)
    srv = AgentGymServer(EnvRuntime(num_workers=1), limits=limits, max_steps=MAX_STEPS).start()
    yield srv
    srv.shutdown()
    assert srv.runtime.closed and not srv.runtime.episodes, "an episode outlived the server"


@pytest.fixture
def http(server: AgentGymServer) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def create(http: httpx.Client) -> int:
    reply = http.post("/create")
    assert reply.status_code == 200, reply.text
    return reply.json()["id"]


def data_idx_of(http: httpx.Client, scenario: str, task_idx: int) -> int:
    tasks = http.get("/tasks").json()
    return next(t["data_idx"] for t in tasks if (t["scenario"], t["task_idx"]) == (scenario, task_idx))


def action(tool: str, arguments: dict[str, Any]) -> str:
    return f"Thought: next step.\nAction: {tool} with Action Input: {json.dumps(arguments)}"


def play(http: httpx.Client, env_id: int, calls: list[dict[str, Any]], answer: str | None) -> dict[str, Any]:
    """Replay tool calls as actions, then finish with `answer`; the finish payload."""
    for call in calls:
        step = http.post("/step", json={"id": env_id, "action": action(call["tool"], call.get("arguments") or {})})
        assert step.status_code == 200, step.text
        assert step.json()["done"] is False and step.json()["kind"] == "ok", step.json()
    done = http.post("/step", json={"id": env_id, "action": action(FINISH, {"answer": answer})})
    assert done.status_code == 200, done.text
    return done.json()


def test_parse_action_grammar() -> None:
    assert parse_action('Thought: x. Action: get_issue with Action Input: {"issue_id": 7}') == ("get_issue",
                                                                                               {"issue_id": 7})
    # the last Action counts; a fence and a bracketed name are read as the bare name and object
    assert parse_action('Action: a with Action Input: {}\nAction: [b] with Action Input: ```json\n{"x": 1}\n```') \
        == ("b", {"x": 1})
    for bad, says in [("just text", "no action found"), ("Action: t with Action Input: [1]", "not an object"),
                      ("Action: t with Action Input: {'a': 1}", "not valid JSON"),
                      ("Action: t with Action Input: {} and more", "text follows"),
                      ("Action: two words with Action Input: {}", "not a tool name"),
                      ("Action: t with Action Input:", "is empty"),
                      ("Action: t with Action Input: " + "[" * 100000, "over this server's cap")]:
        with pytest.raises(BadAction, match=says):
            parse_action(bad)
    # linear time: a reply of nothing but "Action:" heads (just under the cap) took seconds with one lazy regex
    started = time.perf_counter()
    with pytest.raises(BadAction, match="no action found"):
        parse_action("Action:" * 9000)
    assert time.perf_counter() - started < 0.5


def test_reset_shows_task_catalogue_and_grammar(server: AgentGymServer, http: httpx.Client) -> None:
    tasks = http.get("/tasks").json()
    keys = [(t["scenario"], t["task_idx"]) for t in tasks]
    assert keys == sorted(keys) and [t["data_idx"] for t in tasks] == list(range(len(tasks))) and len(tasks) == 60
    env_id = create(http)
    reset = http.post("/reset", json={"id": env_id, "data_idx": 44})
    assert reset.status_code == 200, reset.text
    payload = reset.json()
    assert (payload["scenario"], payload["task_idx"], payload["data_idx"]) == ("project_tracker_1", 4, 44)
    assert payload["reward"] == 0.0 and payload["score"] == 0.0 and payload["done"] is False
    tools = asyncio.run_coroutine_threadsafe(server.runtime.tools("project_tracker_1"), server.loop).result(60)
    text = payload["observation"]
    assert text.startswith("Task: " + tasks[44]["task"])
    for tool in tools:
        assert f"- {tool['name']}: " in text
        assert json.dumps(tool["inputSchema"], separators=(",", ":"), ensure_ascii=False) in text
    assert "Action: <tool name> with Action Input:" in text and f"Action: {FINISH} with Action Input:" in text
    assert http.get("/observation", params={"id": env_id}).json() == payload
    assert http.get("/available_actions", params={"id": env_id}).json() == [t["name"] for t in tools] + [FINISH]
    # the same task by name; a mismatched pair is refused
    by_name = http.post("/reset", json={"id": env_id, "scenario": "project_tracker_1", "task_idx": 4})
    assert by_name.status_code == 200 and by_name.json()["data_idx"] == 44
    clash = http.post("/reset", json={"id": env_id, "scenario": "project_tracker_1", "task_idx": 4, "data_idx": 3})
    assert clash.status_code == 400 and "not" in clash.json()["error"]
    assert http.post("/reset", json={"id": env_id, "data_idx": 60}).status_code == 400
    assert http.post("/close", json={"id": env_id}).json() == {"id": env_id, "closed": True, "was_open": True}


def test_reference_solution_reaches_reward_one_and_wrong_answer_zero(http: httpx.Client) -> None:
    solutions = load_solutions()
    for scenario, task_idx in [("project_tracker_1", 4), ("clinic_appointments_1", 0)]:
        solution = solutions[(scenario, task_idx)]
        idx = data_idx_of(http, scenario, task_idx)
        right, wrong = create(http), create(http)
        for env_id in (right, wrong):
            assert http.post("/reset", json={"id": env_id, "data_idx": idx}).status_code == 200
        good = play(http, right, solution.calls, solution.final_answer)
        bad = play(http, wrong, solution.wrong_calls, solution.wrong_final_answer)
        assert good["done"] and good["reward"] == 1.0 and good["score"] == 1.0, good
        assert good["verdict"]["verdict"] == "complete" and good["kind"] == FINISH
        assert good["final_answer"] == solution.final_answer
        assert good["steps"] == len(solution.calls) + 1
        assert bad["done"] and bad["reward"] == 0.0 and bad["verdict"]["verdict"] == "others", bad
        # after done: a step is refused (409), the observation stays, a reset starts over
        after = http.post("/step", json={"id": right, "action": action(FINISH, {"answer": "x"})})
        assert after.status_code == 409 and "/reset" in after.json()["error"]
        assert http.get("/observation", params={"id": right}).json()["reward"] == 1.0
        again = http.post("/reset", json={"id": right, "data_idx": idx}).json()
        assert again["done"] is False and again["steps"] == 0
        for env_id in (right, wrong):
            http.post("/close", json={"id": env_id})


def test_tool_usage_dialect_under_tool(http: httpx.Client) -> None:
    """The requests AgentGym's tool-usage clients send (env_idx; create takes the data index and returns a bare
    id; reset and observation return bare text), played to a verdict."""
    solution = load_solutions()[("project_tracker_1", 4)]
    idx = data_idx_of(http, "project_tracker_1", 4)
    env_id = http.post("/tool/create", json={"id": idx}).json()
    assert isinstance(env_id, int) and env_id in http.get("/tool/list_envs").json()
    shown = http.get("/tool/observation", params={"env_idx": env_id}).json()
    assert isinstance(shown, str) and shown.startswith("Task: ")
    assert http.post("/tool/reset", json={"env_idx": env_id, "id": None}).json() == shown  # the same task again
    for call in solution.calls:
        step = http.post("/tool/step", json={"env_idx": env_id, "action": action(call["tool"], call["arguments"])})
        assert step.status_code == 200 and step.json()["done"] is False, step.text
    done = http.post("/tool/step", json={"env_idx": env_id,
                                         "action": action(FINISH, {"answer": solution.final_answer})}).json()
    assert done["done"] is True and done["reward"] == 1.0 and done["verdict"]["verdict"] == "complete"
    assert http.post("/tool/reset", json={"env_idx": env_id, "id": idx}).json() == shown  # reset by data index
    assert http.post("/tool/close", json={"env_idx": env_id}).json()["was_open"] is True
    assert http.get("/tool/observation", params={"env_idx": env_id}).status_code == 404
    open_before = http.get("/tool/list_envs").json()
    assert env_id not in open_before
    assert http.post("/tool/create", json={"id": 10**6}).status_code == 400
    assert http.get("/tool/list_envs").json() == open_before  # the refused create left no id open


def test_malformed_actions_become_observations_and_count(http: httpx.Client) -> None:
    env_id = create(http)
    http.post("/reset", json={"id": env_id, "data_idx": data_idx_of(http, "project_tracker_1", 4)})
    cases = [("I think I am done.", "no action found"),
             ("Action: get_issue with Action Input: {issue_id: 7}", "not valid JSON"),
             ("Action: launch_rockets with Action Input: {}", "there is no tool 'launch_rockets'"),
             (f"Action: {FINISH} with Action Input: {{\"answer\": \"x\", \"extra\": 1}}", "takes only"),
             ("Action: get_issue with Action Input: " + json.dumps({"issue_id": "x" * 70000}), "over this server's"),
             ("Action: get_issue with Action Input: {\"issue_id\": \"seven\"}", "Input validation error")]
    for n, (text, says) in enumerate(cases, start=1):
        reply = http.post("/step", json={"id": env_id, "action": text})
        assert reply.status_code == 200, reply.text
        payload = reply.json()
        assert says in payload["observation"], (text[:80], payload["observation"][:300])
        assert payload["reward"] == 0.0 and payload["done"] is False and payload["steps"] == n
        assert payload["kind"] == {3: "unknown_tool", 6: "invalid_arguments"}.get(n, "bad_action"), payload["kind"]
    # the step limit ends the episode unverified
    for _ in range(MAX_STEPS - len(cases)):
        last = http.post("/step", json={"id": env_id, "action": "nothing"}).json()
    assert last["done"] is True and last["truncated"] is True and last["reward"] == 0.0 and "verdict" not in last
    assert last["kind"] == "step_limit" and f"step limit ({MAX_STEPS})" in last["observation"]
    # request bodies that are not the protocol get 4xx, never 500
    assert http.post("/step", json={"id": env_id, "action": 5}).status_code in (400, 409)
    assert http.post("/step", content=b"{not json").status_code == 400
    assert http.post("/step", json={"id": "zero", "action": "x"}).status_code == 400
    assert http.post("/step", content=b"x" * (2 << 20)).status_code == 413
    http.post("/close", json={"id": env_id})


def test_two_env_ids_are_isolated(http: httpx.Client) -> None:
    idx = data_idx_of(http, "project_tracker_1", 4)
    a, b = create(http), create(http)
    for env_id in (a, b):
        http.post("/reset", json={"id": env_id, "data_idx": idx})
    wrote = http.post("/step", json={"id": a, "action": action("add_label_to_issue", {"issue_id": 7, "label_id": 6})})
    assert wrote.json()["kind"] == "ok"

    def labels(env_id: int) -> list[str]:
        seen = http.post("/step", json={"id": env_id, "action": action("get_issue", {"issue_id": 7})}).json()
        return [label["name"] for label in json.loads(seen["observation"])["labels"]]

    assert labels(a) == ["bug", "regression"]
    assert labels(b) == ["bug"]
    for env_id in (a, b):
        http.post("/close", json={"id": env_id})


def test_id_cap_unknown_ids_close_and_reaping(http: httpx.Client) -> None:
    open_now = http.get("/health").json()["open_envs"]
    ids = [create(http) for _ in range(MAX_ENVS - open_now)]
    refused = http.post("/create")
    assert refused.status_code == 503 and "--max-sessions" in refused.json()["error"]
    assert refused.json()["infra_error"] is True and refused.headers.get("retry-after")
    assert http.post("/close", json={"id": ids[0]}).json()["was_open"] is True
    assert http.post("/close", json={"id": ids[0]}).json() == {"id": ids[0], "closed": True, "was_open": False}
    closed = http.post("/step", json={"id": ids[0], "action": "x"})
    assert closed.status_code == 404 and "closed by /close" in closed.json()["error"]
    never = http.post("/step", json={"id": 10**6, "action": "x"})
    assert never.status_code == 404 and "never created" in never.json()["error"]
    assert http.get("/observation", params={"id": 10**6}).status_code == 404
    assert http.post("/close", json={"id": 10**6}).status_code == 404
    # one more id fits now; ids never reset are closed after --unused-session-timeout (2 s here)
    ids.append(create(http))
    early = http.post("/step", json={"id": ids[-1], "action": "x"})
    assert early.status_code == 409 and "/reset" in early.json()["error"]
    deadline = time.monotonic() + 20
    while http.get("/health").json()["open_envs"] > open_now and time.monotonic() < deadline:
        time.sleep(0.5)
    gone = http.post("/reset", json={"id": ids[-1], "data_idx": 0})
    assert gone.status_code == 404 and "unused-session-timeout" in gone.json()["error"]
    assert http.get("/limits").json()["env_ids_reaped"] >= len(ids) - 1


def test_idle_env_ids_are_reaped_with_their_episodes(fault_data_dir: Path, cache_dir: Path) -> None:
    runtime = EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir)
    srv = AgentGymServer(runtime, scenarios=["faults"], limits=ServerLimits(session_idle_timeout_s=1.0)).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            env_id = create(http)
            assert http.post("/reset", json={"id": env_id, "data_idx": 0}).status_code == 200
            assert http.get("/health").json()["open_episodes"] == 1
            deadline = time.monotonic() + 20
            while http.get("/health").json()["open_envs"] and time.monotonic() < deadline:
                time.sleep(0.3)
            gone = http.post("/step", json={"id": env_id, "action": action("list_notes", {})})
            assert gone.status_code == 404 and "idle past --session-idle-timeout" in gone.json()["error"]
            assert not runtime.episodes, "the reaped id's episode is still open"
    finally:
        srv.shutdown()


def test_worker_crash_is_a_502_not_a_zero(fault_data_dir: Path, cache_dir: Path) -> None:
    runtime = EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir)
    srv = AgentGymServer(runtime, scenarios=["faults"]).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            env_id = create(http)
            assert http.post("/reset", json={"id": env_id, "data_idx": 0}).status_code == 200
            crashed = http.post("/step", json={"id": env_id, "action": action("crash", {})})
            assert crashed.status_code == 502, crashed.text
            assert crashed.json()["infra_error"] is True and "Infrastructure error" in crashed.json()["error"]
            lost = http.post("/step", json={"id": env_id, "action": action("list_notes", {})})
            assert lost.status_code == 503 and "/reset" in lost.json()["error"]
            # the id survives: a reset opens a fresh episode, which plays to a verdict
            assert http.post("/reset", json={"id": env_id, "data_idx": 0}).status_code == 200
            done = play(http, env_id, [{"tool": "add_note", "arguments": {"text": "buy milk"}}], None)
            assert done["reward"] == 1.0 and done["verdict"]["verdict"] == "complete"
    finally:
        srv.shutdown()


def test_verifier_crash_and_timeout_are_502s_not_zeros(tmp_path: Path, cache_dir: Path) -> None:
    data = write_scenarios(tmp_path / "data", {"raising_verifier": FAULT_APP, "hanging_verifier": FAULT_APP})
    codes = {"raising_verifier": "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"
                                 "    raise RuntimeError('the verifier is broken')\n",
             "hanging_verifier": "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"
                                 "    while True:\n        pass\n"}
    path = data / "gen_verifier.pure_code.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row["verification"]["code"] = codes[row["scenario"]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    srv = AgentGymServer(EnvRuntime(data, num_workers=1, cache_dir=cache_dir, verifier_timeout_s=1.0)).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            tasks = {t["scenario"]: t["data_idx"] for t in http.get("/tasks").json()}
            for scenario, verdict in [("raising_verifier", "judge_error"), ("hanging_verifier", "timeout")]:
                env_id = create(http)
                assert http.post("/reset", json={"id": env_id, "data_idx": tasks[scenario]}).status_code == 200
                finish = http.post("/step", json={"id": env_id, "action": action(FINISH, {"answer": "done"})})
                assert finish.status_code == 502, finish.text
                assert finish.json()["infra_error"] is True and f"({verdict}:" in finish.json()["error"]
                # the episode is still open: the agent's world is intact, the finish can be sent again
                again = http.post("/step", json={"id": env_id, "action": action("list_notes", {})})
                assert again.status_code == 200 and again.json()["done"] is False, again.text
    finally:
        srv.shutdown()


def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "awm.cli", "env", "agentgym", "--port", "0", "--workers", "1",
                             "--scenario", "clinic_appointments_1"], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    try:
        line = proc.stdout.readline()
        assert "AgentGym-protocol server at http://127.0.0.1:" in line and "10 tasks of 1 scenarios" in line, line
        url = line.split(" at ")[1].split()[0]
        assert httpx.get(f"{url}/health").json()["scenarios"] == ["clinic_appointments_1"]
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
