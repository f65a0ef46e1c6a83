"""AWM episodes through our AgentGym-protocol server (awm.serve.agentgym_server), played by the recipe's
real rollout (`awm_grpo.rollout.generate`) with our AgentGym client (awm_grpo.agentgym.client).

The policy is the scripted SGLang-protocol engine of rollout_helpers (tokenised by the tiny model's
tokenizer): it replays a bundled task's reference solution as `act(action=...)` tool calls in the
AgentGym tool grammar, so the verdict the server's verifier gives must come back in the sample's
metadata and reward. Bundled fact used: project_tracker_1 task 4 adds the label 'regression' (id 6)
to issue 7.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from awm.data import AWMDataset, bundled_data_dir
from awm.episode import EnvRuntime
from awm.serve.agentgym_server import FINISH, serve
from awm.solutions import load_solutions
from rollout_helpers import awm_test_fixtures, make_args

from awm_grpo.agentgym.client import SCENARIO_PREFIX, open_agentgym, prompt_row
from awm_grpo.reward import reward
from awm_grpo.rollout import generate
from slime.rollout.sglang_rollout import sampling_params_from_args
from slime.utils.types import Sample

ENV = "awm"
FINISH_ACTION = f'Action: {FINISH} with Action Input: {{"answer": %s}}'
SCENARIO, TASK_IDX = "project_tracker_1", 4


def _serve_in_thread(runtime: EnvRuntime, **kwargs: Any) -> Iterator[str]:
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
        try:
            await serve(runtime, stop=box["stop"], ready=lambda url, *_: (box.setdefault("url", url), ready.set()),
                        **kwargs)
        finally:
            runtime.close()
            ready.set()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert ready.wait(60) and "url" in box, "the AgentGym server did not start"
    yield box["url"]
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(20)
    assert not thread.is_alive(), "the AgentGym server did not shut down"


@pytest.fixture(scope="module")
def awm_server() -> Iterator[str]:
    yield from _serve_in_thread(EnvRuntime(num_workers=1))


def act(text: str) -> str:
    """A native-mode reply calling the AgentGym client's one tool."""
    return "<tool_call>\n" + json.dumps({"name": "act", "arguments": {"action": text}}) + "\n</tool_call>"


def tool_action(tool: str, arguments: dict[str, Any]) -> str:
    return f"Action: {tool} with Action Input: {json.dumps(arguments)}"


def data_idx(scenario: str, task_idx: int) -> int:
    """The server's data_idx of a task: the bundled verified tasks by scenario name, then task_idx."""
    return AWMDataset(bundled_data_dir()).task_keys().index((scenario, task_idx))


def run(args: Any, index: int) -> Sample:
    row = prompt_row(ENV, index, "train")
    sample = Sample(index=0, group_index=0, prompt=row["text"], metadata=row["metadata"])

    async def go() -> Sample:
        out = await generate(args, sample, sampling_params_from_args(args))
        out.reward = await reward(args, out)
        return out

    return asyncio.run(go())


def agentgym_args(tiny_model_dir: Any, engine: Any, tmp_path: Any, url: str) -> Any:
    envs = {ENV: {"urls": [url], "finish_action": FINISH_ACTION,
                  "instruction": "Solve the task with the `act` tool; each action is one line of the grammar below."}}
    return make_args(tiny_model_dir, engine.url, tmp_path, agentgym_envs=envs, tool_mode="native", max_turns=8)


@pytest.fixture
def engine(scripted):
    scripted.reset()
    return scripted


def test_reference_solution_played_by_the_rollout_is_complete(tiny_model_dir, engine, tmp_path, awm_server):
    solution = load_solutions()[(SCENARIO, TASK_IDX)]
    engine.reply(*[act(tool_action(c["tool"], c["arguments"])) for c in solution.calls], solution.final_answer)
    s = run(agentgym_args(tiny_model_dir, engine, tmp_path, awm_server), data_idx(SCENARIO, TASK_IDX))
    awm = s.metadata["awm"]
    assert awm["verdict"] == "complete" and s.reward == 1.0, awm
    assert awm["scenario"] == f"{SCENARIO_PREFIX}{ENV}" and awm["tool_calls"] == len(solution.calls)
    assert not s.remove_sample and s.status == Sample.Status.COMPLETED
    # the model read the server's reset observation: the task, the catalogue and the grammar
    prompt = engine.tok.decode(engine.requests[0]["input_ids"])
    assert solution.calls[-1]["tool"] in prompt and "with Action Input:" in prompt
    trace = s.metadata["awm_trace"]
    observed = [o for t in trace["turns"] for o in t.get("observations", [])]
    assert any("regression" in o for o in observed), observed
    # the final answer went to the server as the finish action: its verifier's reward is the verdict
    result = awm["verifier_result"]
    assert result["finish_action"] == FINISH_ACTION % json.dumps(solution.final_answer)
    assert result["reward"] == 1.0 and result["done"] is True and result["steps"] == len(solution.calls) + 1


def test_wrong_answer_and_a_finish_action_from_the_model_score_zero(tiny_model_dir, engine, tmp_path, awm_server):
    solution = load_solutions()[(SCENARIO, TASK_IDX)]
    # the model ends the episode itself with the finish action; its wrong write fails the verifier
    engine.reply(*[act(tool_action(c["tool"], c["arguments"])) for c in solution.wrong_calls],
                 act(FINISH_ACTION % json.dumps(solution.wrong_final_answer)))
    s = run(agentgym_args(tiny_model_dir, engine, tmp_path, awm_server), data_idx(SCENARIO, TASK_IDX))
    awm = s.metadata["awm"]
    assert awm["verdict"] == "others" and s.reward == 0.0 and not s.remove_sample, awm


def test_malformed_action_is_an_observation_the_model_reads(tiny_model_dir, engine, tmp_path, awm_server):
    solution = load_solutions()[(SCENARIO, TASK_IDX)]
    engine.reply(act("add the label please"), act("Action: add_label_to_issue with Action Input: {issue_id: 7}"),
                 *[act(tool_action(c["tool"], c["arguments"])) for c in solution.calls], solution.final_answer)
    s = run(agentgym_args(tiny_model_dir, engine, tmp_path, awm_server), data_idx(SCENARIO, TASK_IDX))
    observed = [o for t in s.metadata["awm_trace"]["turns"] for o in t.get("observations", [])]
    assert "no action found" in observed[0] and "not valid JSON" in observed[1], observed[:2]
    assert s.metadata["awm"]["verdict"] == "complete" and s.reward == 1.0


def test_direct_client_sees_the_server_verdict(awm_server):
    """Our client alone (no rollout): open, act, finish through `verify`, close."""
    solution = load_solutions()[(SCENARIO, TASK_IDX)]

    async def story() -> Any:
        env = await open_agentgym(awm_server, ENV, data_idx(SCENARIO, TASK_IDX), timeout_s=60,
                                  finish_action=FINISH_ACTION)
        try:
            assert "Task: " in env.initial_observation
            actions = await env.available_actions()
            assert actions is not None and FINISH in actions and "add_label_to_issue" in actions
            for c in solution.calls:
                result = await env.call("act", {"action": tool_action(c["tool"], c["arguments"])})
                assert not result.is_error and not result.done, result
            verdict = await env.verify(solution.final_answer)
            seen = await env.observe()
        finally:
            await env.close()
        return verdict, seen

    verdict, seen = asyncio.run(story())
    assert verdict.verdict == "complete" and verdict.result["reward"] == 1.0 and seen.done


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory) -> Iterator[str]:
    data = awm_test_fixtures().write_scenarios(tmp_path_factory.mktemp("faults"),
                                               {"faults": awm_test_fixtures().FAULT_APP})
    yield from _serve_in_thread(EnvRuntime(data, num_workers=1, cache_dir=tmp_path_factory.mktemp("cache")))


def test_a_worker_crash_behind_the_server_drops_the_sample(tiny_model_dir, engine, tmp_path, fault_server):
    engine.reply(act(tool_action("crash", {})), "done")
    s = run(agentgym_args(tiny_model_dir, engine, tmp_path, fault_server), 0)
    awm = s.metadata["awm"]
    assert s.remove_sample and s.status == Sample.Status.FAILED, awm
    assert awm["stop_reason"] == "infra_error" and "502" in awm["infra_error"], awm
