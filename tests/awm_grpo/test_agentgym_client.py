"""The AgentGym-protocol client against AgentGym's own BabyAI server, and BabyAI episodes through the rollout.

The server is AgentGym's code, not ours (../shared/agentgym/agentenv-babyai), run from a side venv that
awm_grpo.agentgym.babyai builds once (pip, registry packages). Without the shared folder these tests skip;
if the venv cannot be built they fail. The one server we write here is a hostile one, for the replies
no honest server sends (oversized, malformed, mistyped).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from typing import Any

import pytest
from rollout_helpers import make_args

from awm_grpo.agentgym import babyai as agentgym_babyai
from awm_grpo.agentgym.client import (
    ACT_TOOL,
    MAX_REPLY_BYTES,
    AgentGymEnv,
    episode_target,
    main,
    open_agentgym,
    parse_agentgym_envs,
)
from awm_grpo.env_client import EnvInfraError
from awm_grpo.reward import reward
from awm_grpo.rollout import generate
from awm_grpo.traces import TRACE_KEY
from slime.rollout.sglang_rollout import sampling_params_from_args
from slime.utils.types import Sample

GOAL_ACTION = "go to red ball 1"  # BabyAI data_idx 0 (GoToRedBallGrey, seed 0): the red ball is in view


@pytest.fixture(scope="module")
def babyai() -> str:
    if not agentgym_babyai.have_source():
        pytest.skip(f"AgentGym's BabyAI server is not at {agentgym_babyai.source_dir()} (../shared/agentgym beside "
                    "the checkout): the AgentGym client tests need it")
    with agentgym_babyai.BabyAIServer() as server:  # a venv that cannot be built fails here, loudly
        yield server.url


def actions_of(observation: str) -> list[str]:
    """The action strings BabyAI lists at the end of an observation."""
    match = re.search(r"Available actions: (\[.*\])\s*$", observation)
    assert match, observation[-300:]
    return json.loads(match.group(1))


def test_an_episode_on_agentgyms_own_babyai_server(babyai):
    async def go():
        env = await open_agentgym(babyai, "babyai", 0, timeout_s=30.0)
        assert isinstance(env.env_id, int) and not env.done and env.reward == 0.0
        assert env.initial_observation.startswith("Your goal: go to the red ball")
        assert GOAL_ACTION in actions_of(env.initial_observation)
        assert [t["name"] for t in env.tools] == [ACT_TOOL]
        turned = await env.call(ACT_TOOL, {"action": "turn left"})
        assert (turned.is_error, turned.kind, turned.done) == (False, "ok", False) and "Available actions" in turned.text
        now = await env.observe()  # /observation: the same state, with the goal in front
        assert now.observation.endswith(turned.text.split("\n")[-1]) and now.done is False
        assert await env.available_actions() is None  # BabyAI has no /available_actions route
        state = await env.state()
        assert state["changes"] == {} and state["agentgym"]["steps"] == 1 and len(state["state_hash"]) == 64
        await env.close()
        await env.close()  # once only; a second close sends nothing
        # the id is gone on the server: a step on it is the server's error, which is infrastructure
        ghost = AgentGymEnv(babyai, "babyai", 0, timeout_s=10.0)
        ghost.env_id = env.env_id
        with pytest.raises(EnvInfraError, match="not valid"):
            await ghost.call(ACT_TOOL, {"action": "turn left"})

    asyncio.run(go())


def test_parallel_episodes_each_hold_their_own_env_id(babyai):
    async def go():
        envs = await asyncio.gather(*(open_agentgym(babyai, "babyai", i, timeout_s=30.0) for i in (0, 2, 0, 2, 3)))
        try:
            assert len({e.env_id for e in envs}) == 5
            results = await asyncio.gather(*(e.call(ACT_TOOL, {"action": GOAL_ACTION}) for e in envs[:2]))
            assert results[0].done and not envs[2].done  # the same task in another id is untouched
            assert (await envs[2].observe()).observation == envs[2].initial_observation
        finally:
            await asyncio.gather(*(e.close() for e in envs))

    asyncio.run(go())


def test_invalid_actions_and_calls(babyai):
    async def go():
        env = await open_agentgym(babyai, "babyai", 1, timeout_s=30.0)
        try:
            wrong = await env.call(ACT_TOOL, {"action": "fly to the moon"})  # BabyAI answers with an observation
            assert not wrong.is_error and "not recognized" in wrong.text and not env.done
            unknown = await env.call("teleport", {"action": "turn left"})
            assert (unknown.is_error, unknown.kind) == (True, "unknown_tool")
            for bad in ({}, {"action": 3}, {"action": "turn left", "speed": 2}, {"action": "x" * 5000}):
                result = await env.call(ACT_TOOL, bad)
                assert (result.is_error, result.kind) == (True, "invalid_arguments"), bad
            assert env.steps == 1  # only the action the server saw counts
        finally:
            await env.close()

    asyncio.run(go())


def test_done_ends_the_episode_and_verifies_complete(babyai):
    async def go():
        env = await open_agentgym(babyai, "babyai", 0, timeout_s=30.0, finish_action=None)
        try:
            result = await env.call(ACT_TOOL, {"action": GOAL_ACTION})
            assert result.done and env.done and env.reward > 0 and not result.is_error
            after = await env.call(ACT_TOOL, {"action": "turn left"})  # never reaches the server
            assert after.is_error and after.done and env.steps == 1
            verdict = await env.verify(None)
            assert (verdict.verdict, verdict.mode) == ("complete", "code")
            assert verdict.result["reward"] == env.reward and verdict.result["done"] is True
        finally:
            await env.close()
        unsolved = await open_agentgym(babyai, "babyai", 0, timeout_s=30.0)
        try:
            verdict = await unsolved.verify("I give up")
            assert verdict.verdict == "others" and verdict.result["reward"] == 0.0
        finally:
            await unsolved.close()

    asyncio.run(go())


def test_a_dead_server_is_an_infra_error_never_a_score(babyai):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(EnvInfraError, match="cannot connect"):
        asyncio.run(open_agentgym(dead, "babyai", 0, timeout_s=5.0))

    server = agentgym_babyai.BabyAIServer().start()  # a second server, killed in mid-episode

    async def go():
        env = await open_agentgym(server.url, "babyai", 0, timeout_s=5.0)
        server.stop()
        with pytest.raises(EnvInfraError):
            await env.call(ACT_TOOL, {"action": "turn left"})
        await env.close()  # best effort: no error when the server is gone

    try:
        asyncio.run(go())
    finally:
        server.stop()


# ---- a hostile server (ours, for the replies an honest one never sends) ----------------------------

def http_reply(status: int, body: bytes, headers: str = "") -> bytes:
    head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{headers}"
    if "content-length" not in headers and "transfer-encoding" not in headers and "connection: close" not in headers:
        head += f"content-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


OK_STEP = json.dumps({"observation": "a room", "reward": 0, "score": 0, "done": False}).encode()
BIG = b'{"observation": "' + b"x" * (MAX_REPLY_BYTES + 10) + b'", "reward": 0, "done": false}'
HOSTILE_RESETS = {
    "oversized with its length": (http_reply(200, BIG), "cap"),
    "oversized, length unsaid": (http_reply(200, BIG, "connection: close\r\n"), "cap"),
    "not JSON": (http_reply(200, b"<html>hello</html>"), "not JSON"),
    "a list": (http_reply(200, b"[1, 2]"), "not a JSON object"),
    "observation not text": (http_reply(200, b'{"observation": ["a"], "reward": 0, "done": false}'), "not text"),
    "done not a bool": (http_reply(200, b'{"observation": "a", "reward": 0, "done": "yes"}'), "true/false"),
    "reward a bool": (http_reply(200, b'{"observation": "a", "reward": true, "done": false}'), "finite number"),
    "reward huge": (http_reply(200, b'{"observation": "a", "reward": 1e999, "done": false}'), "not JSON|finite"),
    "fields missing": (http_reply(200, b'{"observation": "a"}'), "lacks"),
    "an error reply": (http_reply(200, b'{"error": "env exploded"}'), "env exploded"),
    "HTTP 500": (http_reply(500, b'{"detail": "boom"}'), "HTTP 500"),
    "HTTP 404": (http_reply(404, b'{"detail": "Not Found"}'), "HTTP 404"),
    "too slow": (None, "no reply within"),
}


class Hostile:
    """An HTTP/1.1 server on 127.0.0.1 answering each path with a raw reply (None: never; a function: of the
    request body); records the paths asked."""

    def __init__(self, replies: dict[str, Any]) -> None:
        self.replies, self.paths = replies, []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
                body = await reader.readexactly(int(length.group(1)) if length else 0)
                self.paths.append(path)
                reply = self.replies.get(path, http_reply(404, b"{}"))
                if callable(reply):
                    reply = reply(body)
                if reply is None:
                    await asyncio.sleep(30)
                writer.write(reply)
                await writer.drain()
                if b"connection: close" in reply.split(b"\r\n\r\n")[0]:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("case", list(HOSTILE_RESETS), ids=list(HOSTILE_RESETS))
def test_hostile_replies_are_infra_errors_and_the_id_is_closed(case):
    reply, message = HOSTILE_RESETS[case]

    async def go():
        hostile = Hostile({"/create": http_reply(200, b'{"id": 7}'), "/reset": reply,
                           "/close": http_reply(200, b"true")})
        async with hostile as url:
            with pytest.raises(EnvInfraError, match=message):
                await open_agentgym(url, "hostile", 0, timeout_s=1.0)
        assert hostile.paths == ["/create", "/reset", "/close"]  # the created id is released

    asyncio.run(go())


def test_hostile_create_and_step_replies():
    async def go():
        for body in (b'{"id": "seven"}', b'{"id": true}', b'{"ok": 1}', b'{"error": "full"}'):
            async with Hostile({"/create": http_reply(200, body)}) as url:
                with pytest.raises(EnvInfraError):
                    await open_agentgym(url, "hostile", 0, timeout_s=1.0)
        base = {"/create": http_reply(200, b"3"), "/reset": http_reply(200, OK_STEP),
                "/close": http_reply(200, b"true")}
        # a 4xx about the action: the model reads the server's words as an error observation
        async with Hostile({**base, "/step": http_reply(422, b'{"detail": "action must be a verb"}')}) as url:
            env = await open_agentgym(url, "hostile", 0, timeout_s=1.0)
            assert env.env_id == 3 and env.initial_observation == "a room" and env.score == 0.0
            result = await env.call(ACT_TOOL, {"action": "dance"})
            assert (result.is_error, result.kind, result.text) == (True, "http_error", "action must be a verb")
        # an error reply or a 5xx to a step is the server's failure, not the agent's
        for step in (http_reply(200, b'{"error": "crashed"}'), http_reply(503, b"{}")):
            async with Hostile({**base, "/step": step}) as url:
                env = await open_agentgym(url, "hostile", 0, timeout_s=1.0)
                with pytest.raises(EnvInfraError):
                    await env.call(ACT_TOOL, {"action": "dance"})

    asyncio.run(go())


def test_the_finish_action_is_sent_json_quoted_when_the_env_is_open():
    async def go():
        finish = 'Action: finish with Action Input: {"answer": %s}'
        steps: list[str] = []

        def step(body: bytes) -> bytes:
            steps.append(json.loads(body)["action"])
            return http_reply(200, b'{"observation": "ok", "reward": 1, "done": true}')

        async with Hostile({"/create": http_reply(200, b'{"id": 1}'), "/reset": http_reply(200, OK_STEP),
                            "/step": step, "/close": http_reply(200, b"true")}) as url:
            env = await open_agentgym(url, "hostile", 0, timeout_s=1.0, finish_action=finish)
            verdict = await env.verify('say "hi"')
            await env.close()
        assert steps == ['Action: finish with Action Input: {"answer": "say \\"hi\\""}']
        assert verdict.verdict == "complete" and verdict.result["finish_action"] == steps[0]

    asyncio.run(go())


# ---- configuration and prompt rows -----------------------------------------------------------------

def test_the_knob_and_the_metadata_are_checked_with_messages_that_say_what_to_write():
    specs = parse_agentgym_envs('{"babyai": {"urls": ["http://127.0.0.1:36001/"], "instruction": "Go."}}')
    assert specs[0].urls == ("http://127.0.0.1:36001",) and specs[0].task_text("OBS") == "Go.\n\nOBS"
    assert "`act` tool" in parse_agentgym_envs({"x": {"urls": "http://h:1"}})[0].task_text("OBS")
    assert parse_agentgym_envs(None) == parse_agentgym_envs("") == ()
    for bad, says in (("{nope", "not JSON"), ([1], "JSON object"), ({"a:b": {"urls": ["http://h:1"]}}, "without ':'"),
                      ({"x": {"urls": []}}, "base URLs"), ({"x": {"urls": ["ftp://h"]}}, "http"),
                      ({"x": {"urls": ["http://h:1"], "finish_action": "no slot"}}, "one %s"),
                      ({"x": {"urls": ["http://h:1"], "port": 1}}, "unknown keys")):
        with pytest.raises(ValueError, match=says):
            parse_agentgym_envs(bad)
    assert episode_target({"scenario": "s", "task_idx": 1}) is None
    assert episode_target({"agentgym": {"env": "babyai", "data_idx": 7}}) == ("babyai", 7)
    for bad in ({"env": "babyai"}, {"env": "", "data_idx": 1}, {"env": "b", "data_idx": -1},
                {"env": "b", "data_idx": True}, "babyai"):
        with pytest.raises(ValueError, match="agentgym.client prompts"):
            episode_target({"agentgym": bad})


def test_prompt_rows_for_babyai_only_and_mixed_sets(tmp_path, capsys):
    assert main(["prompts", "--env", "babyai", "--data-idx", "0:3,40", "--out", str(tmp_path / "train.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [r["metadata"]["agentgym"] for r in rows] == [{"env": "babyai", "data_idx": i} for i in (0, 1, 2, 40)]
    assert rows[0]["metadata"]["scenario"] == "agentgym:babyai" and rows[0]["metadata"]["split"] == "train"
    info = json.loads((tmp_path / "split_info.json").read_text())
    assert info["agentgym_only"] and info["agentgym"]["train"][0]["rows"] == 4
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "train.jsonl").write_text('{"text": [], "metadata": {"scenario": "s", "task_idx": 0}}\n')
    (mixed / "split_info.json").write_text('{"data_dir": "/d"}')
    main(["prompts", "--env", "babyai", "--data-idx", "5", "--out", str(mixed / "train.jsonl"), "--append"])
    lines = (mixed / "train.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["metadata"]["agentgym"]["data_idx"] == 5
    info = json.loads((mixed / "split_info.json").read_text())
    assert info["data_dir"] == "/d" and "agentgym_only" not in info
    with pytest.raises(SystemExit):
        main(["prompts", "--env", "babyai", "--data-idx", "3:x", "--out", str(tmp_path / "v.jsonl")])
    assert "START:STOP" in capsys.readouterr().err


# ---- BabyAI through the rollout ----------------------------------------------------------------------

def babyai_sample(data_idx: int, index: int = 0) -> Sample:
    return Sample(index=index, group_index=index, prompt="", metadata={
        "scenario": "agentgym:babyai", "task_idx": data_idx, "task": "",
        "agentgym": {"env": "babyai", "data_idx": data_idx}})


def play_one(args, sample: Sample) -> Sample:
    async def go():
        out = await generate(args, sample, sampling_params_from_args(args))
        out.reward = await reward(args, out)
        return out

    return asyncio.run(go())


def act(action: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "call_tool", "arguments": {"tool_name": ACT_TOOL,
                                                                          "arguments": {"action": action}}}) \
        + "\n</tool_call>"


def test_a_babyai_episode_through_the_rollout_ends_when_the_env_is_done(tiny_model_dir, scripted, babyai, tmp_path):
    scripted.reset()
    envs = {"babyai": {"urls": [babyai]}}
    args = make_args(tiny_model_dir, scripted.url, tmp_path, agentgym_envs=json.dumps(envs),
                     terminate_on_invalid_call=False)
    scripted.reply(act("fly to the moon"), act(GOAL_ACTION), "never asked")
    s = play_one(args, babyai_sample(0))
    awm = s.metadata["awm"]
    assert awm["infra_error"] is None and awm["stop_reason"] == "env_done", awm
    assert (awm["scenario"], awm["task_idx"], awm["turns"], awm["tool_calls"]) == ("agentgym:babyai", 0, 2, 2)
    assert awm["verdict"] == "complete" and s.reward == 1.0 and s.status == Sample.Status.COMPLETED
    assert awm["verifier_result"]["done"] is True and awm["verifier_result"]["reward"] > 0
    # the prompt is the instruction + BabyAI's first observation; the model's tokens are trained, the
    # environment's observation in between is not
    prompt = scripted.tok.decode(scripted.requests[0]["input_ids"])
    assert "`act` tool" in prompt and "Your goal: go to the red ball" in prompt and GOAL_ACTION in prompt
    prompt_len = len(s.tokens) - s.response_length
    first, second = scripted.outputs
    assert s.tokens[prompt_len:prompt_len + len(first)] == first and s.tokens[-len(second):] == second
    observed = len(s.tokens) - prompt_len - len(first) - len(second)
    assert s.loss_mask == [1] * len(first) + [0] * observed + [1] * len(second)
    assert "not recognized" in scripted.tok.decode(scripted.requests[1]["input_ids"][prompt_len + len(first):])
    assert len(scripted.requests) == 2  # "never asked": the episode ended at done
    trace = s.metadata[TRACE_KEY]
    assert trace["turns"][1]["state"]["agentgym"]["done"] is True
    assert (tmp_path / "traces").is_dir()


def test_awm_and_babyai_rows_in_one_run_and_an_unconfigured_env(tiny_model_dir, scripted, babyai, tmp_path):
    scripted.reset()
    args = make_args(tiny_model_dir, scripted.url, tmp_path, agentgym_envs={"babyai": {"urls": [babyai]}})
    scripted.reply("No idea.")  # the AWM row: a final answer at once, verified by AWM's verifier
    awm_row = Sample(index=1, group_index=1, prompt="", metadata={"scenario": "library_lending_1", "task_idx": 3,
                                                                  "task": "", "task_type": "state_mutating"})
    s = play_one(args, awm_row)
    assert s.metadata["awm"]["scenario"] == "library_lending_1" and s.metadata["awm"]["verdict"] == "others"
    assert "Your goal" not in scripted.tok.decode(scripted.requests[0]["input_ids"])
    scripted.reply("No idea.")  # the BabyAI row: a final answer ends it unsolved
    s = play_one(args, babyai_sample(2, index=2))
    assert (s.metadata["awm"]["verdict"], s.metadata["awm"]["stop_reason"], s.reward) == ("others", "final_answer", 0.0)
    other = make_args(tiny_model_dir, scripted.url, tmp_path, agentgym_envs={"textcraft": {"urls": [babyai]}})
    with pytest.raises(ValueError, match="AWM_AGENTGYM_ENVS"):
        play_one(other, babyai_sample(0))


def test_the_real_cpu_engine_plays_babyai(tiny_model_dir, babyai, tmp_path):
    from slime.engine.cpu_server import CPUEngine

    engine = CPUEngine(tiny_model_dir, port=0, seed=0)
    url = engine.start()
    try:
        args = make_args(tiny_model_dir, url, tmp_path, agentgym_envs={"babyai": {"urls": [babyai]}},
                         max_tokens_per_turn=24, max_turns=2, max_response_len=256)
        s = play_one(args, babyai_sample(3))
    finally:
        engine.shutdown()
    awm = s.metadata["awm"]
    assert awm["infra_error"] is None and awm["scenario"] == "agentgym:babyai" and awm["verdict"] in (
        "others", "complete", "format_error"), awm
    prompt_len = len(s.tokens) - s.response_length
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length > 0
    assert s.loss_mask[0] == 1 and all(lp <= 0 for lp in s.rollout_log_probs)
    assert prompt_len > 0 and s.reward in (1.0, 0.0, -1.0)


def test_the_launcher_takes_babyai_only_and_mixed_prompt_sets(tmp_path, monkeypatch):
    from awm_grpo.launch import config as launch_config
    from awm_grpo.launch.job import LaunchError, ensure_splits

    monkeypatch.setenv("AWM_CACHE_DIR", str(tmp_path / "cache"))
    envs = json.dumps({"babyai": {"urls": ["http://127.0.0.1:36001"]}})

    def resolved(splits, **env):
        return launch_config.resolve(None, gpus=[], env={"AWM_SPLITS_DIR": str(splits), **env})

    only = tmp_path / "babyai"
    for split, idx in (("train", "0:4"), ("val", "40:42"), ("test", "80:82")):
        main(["prompts", "--env", "babyai", "--data-idx", idx, "--out", str(only / f"{split}.jsonl")])
    assert "AgentGym prompts only" in ensure_splits(resolved(only, AWM_AGENTGYM_ENVS=envs), dry_run=False)
    with pytest.raises(LaunchError, match=r"\['babyai'\].*AWM_AGENTGYM_ENVS"):
        ensure_splits(resolved(only), dry_run=False)
    with pytest.raises(LaunchError, match="base URLs"):
        ensure_splits(resolved(only, AWM_AGENTGYM_ENVS='{"babyai": {"urls": []}}'), dry_run=False)
    mixed = tmp_path / "mixed"
    assert "wrote" in ensure_splits(resolved(mixed, AWM_SPLIT_BY="task"), dry_run=False)  # data_prep's AWM splits
    main(["prompts", "--env", "babyai", "--data-idx", "0:4", "--out", str(mixed / "train.jsonl"), "--append"])
    assert "existing" in ensure_splits(resolved(mixed, AWM_SPLIT_BY="task", AWM_AGENTGYM_ENVS=envs), dry_run=False)
    with pytest.raises(LaunchError, match="does not configure"):
        ensure_splits(resolved(mixed, AWM_SPLIT_BY="task"), dry_run=False)
    rows = [json.loads(line)["metadata"] for line in (mixed / "train.jsonl").read_text().splitlines()]
    assert sum("agentgym" in r for r in rows) == 4 and sum("agentgym" not in r for r in rows) > 4
