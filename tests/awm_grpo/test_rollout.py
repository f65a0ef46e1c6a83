"""The multi-turn rollout against the real runtime (bundled scenarios) and a scripted engine.

Covers the token/mask/log-prob layout across turns, the engine seeing exactly prompt + earlier
tokens, the drift check, every stop condition, infra-failure marking, meta and native tool modes,
the reward, and traces.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from rollout_helpers import ABORT, LOGPROB, NO_END, awm_test_fixtures, make_args

from awm_grpo import protocol
from awm_grpo.reward import reward
from awm_grpo.rollout import generate
from awm_grpo.traces import log_rollout
from slime.rollout.sglang_rollout import sampling_params_from_args
from slime.utils.types import Sample

SCENARIO = "library_lending_1"


def call(tool: str, **arguments) -> str:
    """A meta-mode call_tool reply."""
    return "<tool_call>\n" + json.dumps({"name": "call_tool", "arguments": {"tool_name": tool, "arguments": arguments}}) \
        + "\n</tool_call>"


def native(tool: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": tool, "arguments": arguments}) + "\n</tool_call>"


LIST = '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>'


def run(args, task_idx: int = 3, scenario: str = SCENARIO, evaluation: bool = False) -> Sample:
    sample = Sample(index=0, group_index=0, prompt="", metadata={"scenario": scenario, "task_idx": task_idx,
                                                                 "task": "", "task_type": "state_mutating"})

    async def go() -> Sample:
        out = await generate(args, sample, sampling_params_from_args(args), evaluation=evaluation)
        out.reward = await reward(args, out)
        return out

    return asyncio.run(go())


@pytest.fixture
def engine(scripted):
    scripted.reset()
    return scripted


def test_solving_a_task_lays_out_tokens_masks_and_logprobs_turn_by_turn(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path)
    engine.reply(LIST, call("search_books", query="Project Hail Mary"), call("checkout_copy", copy_id=1),
                 "Checked out copy LIB-000101 of Project Hail Mary.")
    s = run(args)
    awm = s.metadata["awm"]
    assert awm["verdict"] == "complete" and s.reward == 1.0, awm
    assert s.status == Sample.Status.COMPLETED and awm["stop_reason"] == "final_answer"
    assert awm["turns"] == 4 and awm["tool_calls"] == 2 and awm["invalid_calls"] == 0
    # every request = prompt + everything before it; every output appended with mask 1 and its log-probs
    prompt_len = len(engine.requests[0]["input_ids"])
    assert s.tokens[:prompt_len] == engine.requests[0]["input_ids"]
    assert len(s.tokens) == prompt_len + s.response_length == prompt_len + len(s.loss_mask)
    pos = prompt_len
    for i, out in enumerate(engine.outputs):
        assert engine.requests[i]["input_ids"] == s.tokens[:pos]
        assert s.tokens[pos:pos + len(out)] == out
        assert s.loss_mask[pos - prompt_len:pos - prompt_len + len(out)] == [1] * len(out)
        assert s.rollout_log_probs[pos - prompt_len:pos - prompt_len + len(out)] == [LOGPROB] * len(out)
        pos += len(out)
        if i + 1 < len(engine.outputs):  # then the observation delta, masked, log-prob 0
            nxt = len(engine.requests[i + 1]["input_ids"])
            assert set(s.loss_mask[pos - prompt_len:nxt - prompt_len]) == {0}
            assert set(s.rollout_log_probs[pos - prompt_len:nxt - prompt_len]) == {0.0}
            pos = nxt
    assert pos == len(s.tokens)
    # observations arrive as tool responses in the chat template's layout
    text = engine.tok.decode(engine.requests[1]["input_ids"])
    assert "<tool_response>\n" in text and "search_books" in text and text.endswith("<|im_start|>assistant\n")
    assert awm["drift_tokens"] == 0  # scripted replies tokenise canonically: no drift


def test_every_turn_has_a_sampling_seed_fixed_by_the_run_the_sample_and_the_turn(tiny_model_dir, engine, tmp_path):
    """Seeds that do not depend on arrival order: the same sample replays with the same seeds, another sample or
    turn gets another, and a seed the caller set is kept (the CPU engine samples each request from its own
    generator: tests/slime/test_cpu_engine.py)."""
    args = make_args(tiny_model_dir, engine.url, tmp_path)

    def seeds(index: int, **params) -> list[int]:
        engine.reset()
        engine.reply(LIST, "done")
        sample = Sample(index=index, group_index=0, prompt="", metadata={"scenario": SCENARIO, "task_idx": 3,
                                                                         "task": "", "task_type": "state_mutating"})
        asyncio.run(generate(args, sample, {**sampling_params_from_args(args), **params}))
        return [r["sampling_params"].get("sampling_seed") for r in engine.requests]

    first = seeds(0)
    assert len(first) == 2 and len(set(first)) == 2 and all(isinstance(s, int) and 0 <= s < 2**63 for s in first)
    assert seeds(0) == first  # a rerun
    assert not set(seeds(1)) & set(first)  # another sample of the group
    assert seeds(0, sampling_seed=5) == [5, 5]
    args.rollout_seed += 1
    assert not set(seeds(0)) & set(first)  # another run seed


def test_drift_check_reports_a_non_canonical_tokenisation(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path)
    engine.reply(LIST, "done")
    # make the engine emit "done" as single characters, a split the tokenizer would never produce
    chars = [engine.tok.convert_tokens_to_ids(c) for c in "done"]
    original = engine.tok.encode

    def split_done(text, **kw):
        return chars if text == "done" else original(text, **kw)

    engine.tok.encode = split_done
    try:
        s = run(args)
    finally:
        engine.tok.encode = original
    assert len(chars) > 1 and s.metadata["awm"]["drift_tokens"] > 0


def test_wrong_write_is_scored_zero_and_traced_with_state_hashes(tiny_model_dir, engine, tmp_path, caplog):
    args = make_args(tiny_model_dir, engine.url, tmp_path)
    engine.reply(call("checkout_copy", copy_id=3), "Checked out.")
    s = run(args)
    assert s.metadata["awm"]["verdict"] == "others" and s.reward == 0.0
    trace = s.metadata["awm_trace"]
    state = trace["turns"][0]["state"]
    assert len(state["state_hash"]) >= 16 and state["changes"], "a write must show up in the change summary"
    with caplog.at_level("INFO", logger="awm_grpo"):
        metrics = log_rollout(0, args, [s])
    assert metrics["awm/success_rate"] == 0.0 and metrics["awm/episodes"] == 1.0
    # the console gets one short line a step; the hundred metrics go to files
    assert [r.getMessage() for r in caplog.records] == [
        "step 1 rollout   episodes    1 | success   0.0% | reward +0.000 | turns  2.0 | invalid calls   0.0% | "
        "infra failures   0"]
    lines = (tmp_path / "traces" / "rollout_000000.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert record["reward"] == 0.0 and record["turns"][0]["calls"][0]["name"] == "checkout_copy"
    assert "awm_trace" not in s.metadata  # detached: never shipped to the trainer


@pytest.mark.parametrize("bad, reason", [
    ("<tool_call>\n{\"name\": \"call_tool\", \"arguments\": {\"tool_name\": \"x\"\n</tool_call>", "not valid JSON"),
    ("<tool_call>\n[1, 2]\n</tool_call>", "must be a JSON object"),
    ("<tool_call>\n{\"arguments\": {}}\n</tool_call>", "needs a \"name\""),
    ("<tool_call>\n{\"name\": \"drop_tables\", \"arguments\": {}}\n</tool_call>", "unknown function"),
    ("<tool_call>\n{\"name\": \"call_tool\", \"arguments\": {\"tool_name\": \"checkout_copy\", "
     "\"arguments\": \"{oops\"}}\n</tool_call>", "not valid JSON"),
    ("<tool_call>\n{\"name\": \"list_tools\"", "not closed"),
])
def test_invalid_call_terminates_with_the_penalty(tiny_model_dir, engine, tmp_path, bad, reason):
    args = make_args(tiny_model_dir, engine.url, tmp_path, invalid_call_penalty=-1.0)
    engine.reply(bad)
    s = run(args)
    awm = s.metadata["awm"]
    assert awm["stop_reason"] == "invalid_call" and awm["verdict"] == "format_error" and s.reward == -1.0
    assert reason in s.metadata["awm_trace"]["turns"][0]["observations"][0]


def test_invalid_call_without_termination_is_an_observation_the_agent_sees(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path, terminate_on_invalid_call=False,
                     invalid_call_penalty=-0.5)
    engine.reply(call("checkout_copy", copy_id="not-a-number"), call("checkout_copy", copy_id=1), "Done.")
    s = run(args)
    awm = s.metadata["awm"]
    second_prompt = engine.tok.decode(engine.requests[1]["input_ids"])
    assert "Error" in second_prompt.split("<tool_response>")[-1]
    assert awm["invalid_calls"] == 1 and awm["verdict"] == "complete" and s.reward == pytest.approx(0.5)


def test_repeated_identical_calls_stop_the_episode(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path, max_repeated_calls=3)
    same = call("search_books", query="Dune")
    engine.reply(same, call("search_books", query="Dune "), same, same, same, "never reached")
    s = run(args)
    awm = s.metadata["awm"]
    # whitespace inside a string argument makes a different call; the next three identical ones stop it
    assert awm["stop_reason"] == "repeated_call" and awm["turns"] == 5


def test_max_turns_and_the_turn_schedule(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path, max_turns=2)
    engine.reply(LIST, LIST, LIST, LIST)
    s = run(args)
    assert s.metadata["awm"]["stop_reason"] == "max_turns" and s.metadata["awm"]["turns"] == 2
    engine.reset()
    # schedule: 3 turns from step 0 (weight version "0" reported by the engine)
    args = make_args(tiny_model_dir, engine.url, tmp_path, max_turns=2, turn_schedule={"rounds": [3, 5], "every": 10})
    engine.reply(LIST, LIST, LIST, LIST)
    s = run(args)
    assert s.metadata["awm"]["turns"] == 3


def test_context_budget_truncates(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path, max_response_len=60)
    engine.reply(LIST, LIST)
    s = run(args)
    assert s.status == Sample.Status.TRUNCATED and s.metadata["awm"]["stop_reason"] == "context_budget"
    assert s.response_length <= 60
    engine.reset()
    engine.reply("a very long reply that will not fit " * 20 + NO_END)
    s = run(make_args(tiny_model_dir, engine.url, tmp_path, max_response_len=30))
    assert s.status == Sample.Status.TRUNCATED and s.response_length == 30


def test_tool_results_are_capped_and_the_catalogue_is_not(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path, max_observation_tokens=20)
    engine.reply(LIST, call("list_branches"), "done")
    s = run(args)
    after_list = engine.tok.decode(engine.requests[1]["input_ids"])
    after_call = engine.tok.decode(engine.requests[2]["input_ids"])[len(after_list):]
    assert "observation truncated" not in after_list and "checkout_copy" in after_list  # the whole catalogue
    assert "observation truncated" in after_call and s.metadata["awm"]["verdict"] == "others"


def test_all_calls_per_turn_runs_each_in_order(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path, calls_per_turn="all")
    engine.reply(call("search_books", query="Project Hail Mary") + "\n" + call("checkout_copy", copy_id=1), "ok")
    s = run(args)
    turn = s.metadata["awm_trace"]["turns"][0]
    assert [c["name"] for c in turn["calls"]] == ["search_books", "checkout_copy"]
    assert s.metadata["awm"]["verdict"] == "complete"
    assert engine.tok.decode(engine.requests[1]["input_ids"]).count("<tool_response>") == 2


def test_native_mode_puts_schemas_in_the_prompt_and_calls_tools_by_name(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path, tool_mode="native")
    engine.reply(native("checkout_copy", copy_id=1), "Checked out.")
    s = run(args)
    prompt = engine.tok.decode(engine.requests[0]["input_ids"])
    assert "<tools>" in prompt and '"checkout_copy"' in prompt and protocol.CALL_TOOL not in prompt
    assert s.metadata["awm"]["verdict"] == "complete"


@pytest.fixture(scope="module")
def fault_dir(tmp_path_factory):
    fx = awm_test_fixtures()
    return fx.write_scenarios(tmp_path_factory.mktemp("faults"), {
        "faults": fx.FAULT_APP, "broken_import": "raise RuntimeError('generated code is broken at import')\n"})


def test_broken_environment_code_is_an_infra_failure_not_a_zero(tiny_model_dir, engine, tmp_path, fault_dir):
    args = make_args(tiny_model_dir, engine.url, tmp_path, data_dir=str(fault_dir))
    engine.reply(LIST)
    s = run(args, scenario="broken_import", task_idx=0)
    awm = s.metadata["awm"]
    assert s.status == Sample.Status.FAILED and s.remove_sample and "broken at import" in awm["infra_error"]
    assert asyncio.run(reward(args, s)) == 0.0
    metrics = log_rollout(0, args, [s])
    assert metrics["awm/infra_failures"] == 1.0 and "awm/success_rate" not in metrics


def test_tool_timeout_and_worker_crash_are_infra_failures(tiny_model_dir, engine, tmp_path, fault_dir):
    args = make_args(tiny_model_dir, engine.url, tmp_path, data_dir=str(fault_dir), tool_timeout=1.0)
    for tool, arguments in (("slow", {"seconds": 5}), ("crash", {})):
        engine.reset()
        engine.reply(call(tool, **arguments), "done")
        s = run(args, scenario="faults", task_idx=0)
        assert s.status == Sample.Status.FAILED and s.remove_sample, (tool, s.metadata["awm"])


def test_faulty_route_is_an_error_observation_and_the_task_still_verifies(tiny_model_dir, engine, tmp_path, fault_dir):
    args = make_args(tiny_model_dir, engine.url, tmp_path, data_dir=str(fault_dir))
    engine.reply(call("boom"), call("add_note", text="buy milk"), "Added.")
    s = run(args, scenario="faults", task_idx=0)
    obs = s.metadata["awm_trace"]["turns"][0]["observations"][0]
    assert obs.startswith("Error") and "500" in obs and "Traceback" not in obs
    assert s.metadata["awm"]["verdict"] == "complete" and s.reward == 1.0


def test_engine_abort_returns_an_aborted_sample(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path)
    engine.reply(LIST, ABORT)
    s = run(args)
    assert s.status == Sample.Status.ABORTED and s.metadata["awm"]["stop_reason"] == "engine_abort"


def _serve_in_thread(**serve_kwargs):
    """A real `awm env start` server (MCP streamable HTTP + control plane) in a thread: yields its base URL."""
    import threading

    from awm.episode import EnvRuntime
    from awm.serve.mcp_server import serve

    box: dict = {}
    ready = threading.Event()

    async def main():
        box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
        runtime = EnvRuntime(num_workers=1)
        try:
            await serve(runtime, SCENARIO, stop=box["stop"],
                        ready=lambda scenario, url: (box.setdefault("url", url), ready.set()), **serve_kwargs)
        finally:
            runtime.close()
            ready.set()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert ready.wait(60) and "url" in box, "the MCP server did not start"
    yield box["url"].removesuffix("/mcp")
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(15)


@pytest.fixture(scope="module")
def mcp_server():
    yield from _serve_in_thread()


def test_mcp_transport_gives_the_same_episode_as_in_process(tiny_model_dir, engine, tmp_path, mcp_server):
    script = (LIST, call("search_books", query="Project Hail Mary"), call("checkout_copy", copy_id=1),
              call("checkout_copy", copy_id="x"), "Checked out copy LIB-000101.")
    results = {}
    for transport in ("inprocess", "mcp"):
        engine.reset()
        engine.reply(*script)
        args = make_args(tiny_model_dir, engine.url, tmp_path, transport=transport, mcp_urls=[mcp_server],
                         terminate_on_invalid_call=False)
        s = run(args)
        trace = s.metadata["awm_trace"]
        # the environment code stamps checkouts with Python's wall clock: mask it to compare the runs
        observations = [re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+", "<time>", o) for t in trace["turns"]
                        for o in t.get("observations", [])]
        results[transport] = (observations, s.metadata["awm"]["verdict"], s.metadata["awm"]["invalid_calls"],
                              [t.get("state", {}).get("state_hash") for t in trace["turns"][:2]],
                              [list(t.get("state", {}).get("changes", {})) for t in trace["turns"]])
    assert results["mcp"] == results["inprocess"]
    assert results["mcp"][1] == "complete" and results["mcp"][2] == 1


def test_a_server_off_loopback_is_reached_with_its_token(tiny_model_dir, engine, tmp_path, monkeypatch):
    """A server bound to 0.0.0.0 wants its bearer token (awm.serve.limits.TOKEN_ENV) on every request: the
    rollout sends it from the environment, and without it the episode is an infra failure that says so."""
    from awm.serve.limits import TOKEN_ENV

    for base in _serve_in_thread(host="0.0.0.0", token="s3cret-token"):
        url = base.replace("0.0.0.0", "127.0.0.1")
        engine.reset()
        engine.reply(call("search_books", query="Dune"), "Found it.")
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        s = run(make_args(tiny_model_dir, engine.url, tmp_path, transport="mcp", mcp_urls=[url]))
        assert s.status == Sample.Status.FAILED and TOKEN_ENV in s.metadata["awm"]["infra_error"]
        engine.reset()
        engine.reply(call("search_books", query="Dune"), "Found it.")
        monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
        s = run(make_args(tiny_model_dir, engine.url, tmp_path, transport="mcp", mcp_urls=[url]))
        assert s.metadata["awm"]["infra_error"] is None and s.metadata["awm"]["tool_calls"] == 1


def test_unreachable_mcp_server_is_an_infra_failure(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path, transport="mcp", mcp_urls=["http://127.0.0.1:9"],
                     tool_timeout=2.0, verifier_timeout=2.0)
    s = run(args)
    assert s.status == Sample.Status.FAILED and s.remove_sample and "MCP server" in s.metadata["awm"]["infra_error"]
