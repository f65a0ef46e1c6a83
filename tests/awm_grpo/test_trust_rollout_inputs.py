"""Whatever the model writes, `generate` returns a sample: bad input is an observation or an infra error.

Issue 38's hostile tries through the real rollout (scripted engine, real runtime, bundled scenario) and the
real MCP server: a lone surrogate escape ("\\ud800") and 10,000 nested lists in a tool call's arguments
raised out of `generate` (WorkerRequestError from the worker frame's JSON, RecursionError in
`protocol.parse_reply`); each must reach the agent as an invalid tool call while the episode goes on.
"""

from __future__ import annotations

import ast
import asyncio
import os
import threading
from pathlib import Path

import pytest
from awm.episode import EnvRuntime
from rollout_helpers import awm_test_fixtures, make_args
from test_mcp_client import SCENARIO as MCP_SCENARIO
from test_mcp_client import awm_server, base_of

from awm_grpo import protocol
from awm_grpo.env_client import EnvInfraError, InProcessEnv, McpEnv
from awm_grpo.rollout import generate
from slime.rollout.sglang_rollout import sampling_params_from_args
from slime.utils.types import Sample

SCENARIO = "library_lending_1"
SURROGATE = r'"\ud800"'  # the JSON escape of a lone surrogate, as the model writes it (six ASCII characters)
DEEP = "[" * 10_000 + "]" * 10_000


def meta_call(arguments_json: str) -> str:
    return ('<tool_call>\n{"name": "call_tool", "arguments": {"tool_name": "search_books", "arguments": '
            + arguments_json + "}}\n</tool_call>")


@pytest.fixture
def engine(scripted):
    scripted.reset()
    return scripted


def play(args) -> Sample:
    sample = Sample(index=0, group_index=0, prompt="", metadata={"scenario": SCENARIO, "task_idx": 3, "task": "",
                                                                 "task_type": "state_mutating"})
    return asyncio.run(generate(args, sample, sampling_params_from_args(args)))


def test_a_lone_surrogate_or_deep_nesting_in_a_call_is_an_invalid_call_and_the_episode_goes_on(
        tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path, terminate_on_invalid_call=False, max_turns=8,
                     max_response_len=60_000)
    engine.reply(meta_call('{"query": ' + DEEP + "}"),                       # deeper than the JSON parser goes
                 meta_call('"' + DEEP + '"'),                                # the same, as a JSON string
                 meta_call('{"query": ' + SURROGATE + "}"),                  # an object's value
                 meta_call('"{\\"query\\": ' + SURROGATE.replace('"', '\\"') + '}"'),  # inside a JSON string
                 meta_call('{"query": "Dune"}'),                             # the episode still works
                 "Nothing to do.")
    s = play(args)
    awm = s.metadata["awm"]
    assert s.status == Sample.Status.COMPLETED and awm["infra_error"] is None, awm
    assert awm["stop_reason"] == "final_answer" and awm["invalid_calls"] == 4 and awm["tool_calls"] == 1
    turns = s.metadata["awm_trace"]["turns"]
    reasons = [t["calls"][0].get("invalid", "") for t in turns[:4]]
    assert all("nest" in r for r in reasons[:2]) and all("surrogate" in r for r in reasons[2:]), reasons
    assert turns[4]["calls"][0]["kind"] == "ok" and "Dune" in turns[4]["observations"][0]


def test_native_mode_parses_every_layer_without_raising(tiny_model_dir, engine, tmp_path):
    """Native mode sends the parsed arguments straight to the tool: the same checks apply there."""
    args = make_args(tiny_model_dir, engine.url, tmp_path, terminate_on_invalid_call=False, tool_mode="native",
                     max_response_len=60_000)
    engine.reply('<tool_call>{"name": "search_books", "arguments": {"query": ' + SURROGATE + "}}</tool_call>",
                 '<tool_call>{"name": ' + SURROGATE + ', "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "search_books", "arguments": ' + DEEP + "}</tool_call>",
                 "Nothing to do.")
    s = play(args)
    awm = s.metadata["awm"]
    assert s.status == Sample.Status.COMPLETED and awm["invalid_calls"] == 3 and awm["tool_calls"] == 0, awm


@pytest.mark.parametrize("text", [
    "<tool_call>" + "[" * 5000 + "</tool_call>",
    '<tool_call>{"name": "a", "arguments": {"k": ' + "[" * 65 + "]" * 65 + "}}</tool_call>",
    '<tool_call>{"name": "a", "arguments": "' + "[" * 3000 + '"}</tool_call>',
    '<tool_call>{"name": "\\udfff"}</tool_call>',
    '<tool_call>{"name": "a", "arguments": {"\\udc80": 1}}</tool_call>',
    "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": \"\ud800\"}}</tool_call>",  # a surrogate in the text itself
])
def test_parse_reply_never_raises(text):
    calls = protocol.parse_reply(text).calls
    assert len(calls) == 1 and isinstance(calls[0], protocol.InvalidCall), calls


def test_valid_nesting_surrogate_pairs_and_escaped_backslashes_still_parse():
    """Only what cannot be carried is refused: a pair of surrogate escapes is one character (an emoji), and a
    backslash escaped before "ud800" is plain text."""
    emoji, backslash = r'"\ud83d\ude00"', r'"\\ud800"'
    nested = '{"a": ' * 20 + "1" + "}" * 20
    reply = protocol.parse_reply(f'<tool_call>{{"name": "t", "arguments": {{"e": {emoji}, "b": {backslash}, '
                                 f'"n": {nested}}}}}</tool_call>')
    call = reply.calls[0]
    assert isinstance(call, protocol.ToolCall), call
    assert call.arguments["e"] == "\U0001f600" and call.arguments["b"] == "\\ud800"


def _hostile_app() -> str:
    """tests/awm/test_trust_inputs.py's hostile scenario code (read, not imported: its `conftest` is not ours)."""
    tree = ast.parse((Path(__file__).resolve().parents[1] / "awm" / "test_trust_inputs.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "HOSTILE_APP")


def test_a_fifo_in_place_of_the_db_is_an_infra_error_not_a_hang(tmp_path):
    """The rollout reads the episode DB after each tool turn (`InProcessEnv.state`); a FIFO there blocked
    that read for ever, in the event loop's thread. (Landlock refuses FIFOs in the worker's dir: this runs
    without the lockdown, as on kernels without Landlock.)"""
    data = awm_test_fixtures().write_scenarios(tmp_path / "data", {"hostile": _hostile_app()})
    outcome: dict[str, object] = {}

    async def main():
        with EnvRuntime(data, num_workers=1, cache_dir=tmp_path / "cache", sandbox_workers=False) as rt:
            env = InProcessEnv(await rt.open("hostile", 0))
            outcome["db"] = env.db_path
            await env.call("vandalize", {"kind": "fifo"})
            try:
                await env.state()
            except EnvInfraError as exc:
                outcome["error"] = exc
            await env.close()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # blocked opening the FIFO: a writer lets it go, so the test can end
        os.close(os.open(outcome["db"], os.O_WRONLY | os.O_NONBLOCK))
        thread.join(20)
        pytest.fail("reading the episode's state blocked on a FIFO env code put in place of its DB")
    assert "not a regular file" in str(outcome.get("error")), outcome


def test_mcp_arguments_the_client_cannot_encode_are_an_observation():
    """Over MCP the client's JSON encoder (orjson) refuses a lone surrogate and nesting past 255 levels: that
    raised TypeError out of `McpEnv.call`. It is the agent's mistake, so an invalid_arguments result."""
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    srv = awm_server()

    async def story():
        env = await McpEnv(base_of(srv), MCP_SCENARIO, 4, 10.0).start()
        try:
            results = [await env.call("get_issue", {"issue_id": "\ud800"}),
                       await env.call("get_issue", {"issue_id": deep}),
                       await env.call("get_issue", {"issue_id": 7})]
        finally:
            await env.close()
        return results

    try:
        surrogate, nested, ok = asyncio.run(story())
    finally:
        srv.stop()
    assert (surrogate.kind, nested.kind) == ("invalid_arguments", "invalid_arguments") and surrogate.is_error
    assert ok.kind == "ok" and not ok.is_error


def test_a_db_grown_past_the_cap_is_an_infra_error_not_seconds_of_trainer_cpu(tmp_path, monkeypatch):
    """Env code can grow its DB without bound, and the rollout reads it whole after every changed turn (a
    143 MB DB cost the trainer seconds a turn): past `MAX_STATE_DB_BYTES` the read is refused as an infra
    error. The cap is lowered below the bundled DB's size here, so a real episode's DB is over it."""
    from awm_grpo import env_client

    async def main():
        with EnvRuntime(None, num_workers=1, cache_dir=tmp_path / "cache") as rt:
            env = InProcessEnv(await rt.open(SCENARIO, 3))
            try:
                await env.state()  # under the cap: read as usual
                monkeypatch.setattr(env_client, "MAX_STATE_DB_BYTES", os.path.getsize(env.db_path) - 1)
                with pytest.raises(EnvInfraError, match="over the 0 MiB the trainer reads"):
                    await env.state()
            finally:
                await env.close()

    asyncio.run(main())


def _state_after(tmp_path, sqls: list[str]) -> tuple[dict | EnvInfraError, float, str]:
    """Run `sqls` through the fault scenario's run_sql tool (env code's own SQL on its episode DB), then time
    one rollout state read (`InProcessEnv.state`): (state or the infra error, seconds, the DB's path)."""
    import time

    data = awm_test_fixtures().write_scenarios(tmp_path / "data", {"gen": awm_test_fixtures().FAULT_APP})
    out: dict = {}

    async def main():
        with EnvRuntime(data, num_workers=1, cache_dir=tmp_path / "cache") as rt:
            env = InProcessEnv(await rt.open("gen"))
            try:
                for sql in sqls:
                    result = await env.call("run_sql", {"sql": sql})
                    assert not result.is_error, result
                start = time.monotonic()
                try:
                    out["state"] = await env.state()
                except EnvInfraError as exc:
                    out["state"] = exc
                out["s"], out["db"] = time.monotonic() - start, env.db_path
                if not isinstance(out["state"], EnvInfraError):
                    from awm.database import state_hash
                    out["reference"] = state_hash(env.db_path)
            finally:
                await env.close()

    asyncio.run(main())
    return out["state"], out["s"], out.get("reference", "")


def test_a_virtual_column_env_code_adds_costs_the_trainers_state_read_nothing(tmp_path):
    """Red team t04: a VIRTUAL generated column `AS (zeroblob(200000000))` keeps the file at 20 KB (under
    MAX_STATE_DB_BYTES) but made each state read compute 200 MB a row (3 rows: 11 s, 2.3 GB in the trainer).
    The read takes stored columns only; its hash still matches awm.database.state_hash."""
    state, seconds, reference = _state_after(tmp_path, [
        "CREATE TABLE g (id INTEGER PRIMARY KEY, b BLOB AS (zeroblob(200000000)) VIRTUAL)",
        "INSERT INTO g (id) VALUES (1), (2), (3)"])
    assert not isinstance(state, EnvInfraError), state
    assert state["changes"]["g"] == {"table": "added"} and state["state_hash"] == reference
    assert seconds < 1.0, f"the state read took {seconds:.2f} s"


def test_a_value_past_the_read_limit_is_an_infra_error(tmp_path, monkeypatch):
    """Every trainer-side read of an episode DB has SQLITE_LIMIT_LENGTH (MAX_VALUE_BYTES, lowered here): a
    value past it (a virtual table's, or one stored) fails the read as an infra error, never a score."""
    from awm import database

    monkeypatch.setattr(database, "MAX_VALUE_BYTES", 1000, raising=False)
    state, _, _ = _state_after(tmp_path, ["INSERT INTO notes (text) VALUES (hex(zeroblob(600)))"])
    assert isinstance(state, EnvInfraError) and "too big" in str(state), state


def test_a_read_past_its_wall_clock_budget_is_an_infra_error(tmp_path, monkeypatch):
    """A state read is interrupted past READ_BUDGET_S (lowered here below what 200,000 rows take to sort)."""
    from awm import database

    monkeypatch.setattr(database, "READ_BUDGET_S", 0.01, raising=False)
    state, seconds, _ = _state_after(tmp_path, [
        "INSERT INTO notes (text) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) "
        "SELECT printf('%08d', 200000 - x) FROM c"])
    assert isinstance(state, EnvInfraError) and "READ_BUDGET_S" in str(state), state
    assert seconds < 2.0, seconds
