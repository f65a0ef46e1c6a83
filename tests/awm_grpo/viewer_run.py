"""A small real run directory for the viewer tests (a uniquely named module: `conftest` names clash).

Four episodes of the bundled library_lending_1 played by the real rollout (real runtime, real
verifier, real progress predicates) with the scripted engine as the model, written by the real
slime hook `log_rollout` as two steps:

    step 0  A  task 3: list tools, check out copy 1, return it, check out again, "Done."  (Phi 0,1,0,1)
            B  task 3: check out copy 1, answer                                           (success)
    step 1  C  task 3: check out copy 3 (the wrong copy), answer                          (failure)
            D  task 0 (info_seeking): list tools, a wrong count                           (failure)
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from awm.data import bundled_data_dir

from awm_grpo import env_client
from awm_grpo.data_prep import load_tasks
from awm_grpo.reward import reward
from awm_grpo.rollout import generate
from awm_grpo.traces import log_rollout
from slime.rollout.sglang_rollout import GenerateState, sampling_params_from_args
from slime.utils.types import Sample

SCENARIO = "library_lending_1"
LIST = '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>'


def call(tool: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": "call_tool", "arguments": {"tool_name": tool, "arguments": arguments}}) \
        + "\n</tool_call>"


def build_predicates(path: Path) -> str:
    from awm.predicates.build import build, write_predicates

    write_predicates(asyncio.run(build(None, scenarios=[SCENARIO])), path)
    return str(path)


def make_run(root: Path, model_dir: Path, engine: Any) -> Path:
    """Write `root/traces/rollout_00000{0,1}.jsonl`; returns `root`."""
    from rollout_helpers import make_args

    root.mkdir(parents=True, exist_ok=True)
    tasks = {(t.scenario, t.task_idx): t for t in load_tasks(bundled_data_dir())[0]}
    GenerateState.clear_instances()
    engine.reset()
    args = make_args(model_dir, engine.url, root, predicates=build_predicates(root / "predicates.jsonl"))

    def play(index: int, task_idx: int, *replies: str) -> Sample:
        engine.reply(*replies)
        task = tasks[(SCENARIO, task_idx)]
        meta = {"scenario": SCENARIO, "task_idx": task_idx, "task": task.task, "task_type": task.task_type}
        sample = Sample(index=index, group_index=index // 2, prompt="", metadata=meta)

        async def go() -> Sample:
            out = await generate(args, sample, sampling_params_from_args(args))
            out.reward = await reward(args, out)
            return out

        return asyncio.run(go())

    try:
        a = play(0, 3, LIST, call("checkout_copy", copy_id=1), call("return_loan", loan_id=14, return_branch_id=1),
                 call("checkout_copy", copy_id=1), "Done.")
        b = play(1, 3, call("checkout_copy", copy_id=1), "Checked out copy LIB-000101 of Project Hail Mary.")
        log_rollout(0, args, [a, b])
        c = play(2, 3, call("checkout_copy", copy_id=3), "Checked out.")
        d = play(3, 0, LIST, "There are 7 copies available.")
        log_rollout(1, args, [c, d])
    finally:
        GenerateState.clear_instances()
        env_client.close_runtimes()
    return root
