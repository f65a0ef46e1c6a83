"""The tool catalogue reaches the model whole, whatever the observation cap.

AWM-1K scenarios have 16-87 tools; meta mode's `list_tools` observation was cut at
`max_observation_tokens` (2,048 on the GPU profiles), so every scenario above about 41 tools hid part
of its catalogue from the model. Here a real AWM-1K scenario (code_hosting_2, 61 tools, read in place
from ../shared/awm_1k_excerpt) is played through the recipe's rollout with Qwen3's real vocabulary and
chat template under the h100 profile's settings, and the tokens the engine receives are checked.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from rollout_helpers import ScriptedEngine, make_args, qwen3_template

from awm_grpo import protocol
from awm_grpo.chat import ChatEncoder
from awm_grpo.launch import config as C
from awm_grpo.rollout import TRUNCATION_MARKER, cap_observations, engine_policy, play
from awm_grpo.traces import TRACE_KEY
from slime.models.tiny import build_tiny_model
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample

EXCERPT = Path(__file__).resolve().parents[2].parent / "shared" / "awm_1k_excerpt"
H100 = "81559 MiB, NVIDIA H100 80GB HBM3\n" * 4
LIST_TOOLS = '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory) -> Path:
    """A tiny model under Qwen3-4B's real vocabulary and chat template (its weights are never used)."""
    return build_tiny_model(tmp_path_factory.mktemp("qwen3") / "model", vocab="qwen", chat_template=qwen3_template())


def code_hosting_2_tools(cache: Path) -> list[dict]:
    from awm.episode import EnvRuntime

    async def main() -> list[dict]:
        with EnvRuntime(EXCERPT, num_workers=1, cache_dir=cache) as runtime:
            return await runtime.tools("code_hosting_2")

    return asyncio.run(main())


def test_list_tools_reaches_the_model_whole_under_the_h100_profile(qwen3_model, tmp_path, monkeypatch) -> None:
    from transformers import AutoTokenizer

    if not EXCERPT.is_dir():
        pytest.fail(f"the AWM-1K excerpt is not at {EXCERPT}: the shared folder beside the repository holds it")
    monkeypatch.setenv("AWM_CACHE_DIR", str(tmp_path / "cache"))
    h100 = C.resolve(None, env={}, gpus=C.parse_nvidia_smi(H100))
    assert h100.profile == "h100" and h100["environment.tool_mode"] == "meta"
    cap = h100["environment.max_observation_tokens"]
    tokenizer = AutoTokenizer.from_pretrained(qwen3_model)
    catalogue = protocol.tool_catalogue(code_hosting_2_tools(tmp_path / "cache"))
    catalogue_tokens = len(tokenizer.encode(catalogue, add_special_tokens=False))
    assert catalogue.startswith("61 tools:") and catalogue_tokens > cap  # the catalogue the cap used to cut

    engine = ScriptedEngine(tokenizer)
    engine.reply(LIST_TOOLS, "I have read the catalogue.")
    args = make_args(qwen3_model, engine.url, tmp_path, data_dir=str(EXCERPT), tool_mode="meta",
                     max_observation_tokens=cap, max_response_len=h100["inference.max_response_len"],
                     enable_thinking=h100["environment.enable_thinking"])
    task = json.loads((EXCERPT / "gen_tasks.jsonl").read_text().splitlines()[2])
    assert task["scenario"] == "code_hosting_2"
    sample = Sample(index=0, group_index=0, prompt="", metadata={
        "scenario": "code_hosting_2", "task_idx": 0, "task": task["tasks"][0], "task_type": None})
    GenerateState.clear_instances()
    try:
        asyncio.run(play(args, sample, {"max_new_tokens": 1024, "temperature": 1.0}, engine_policy(args, sample)))
    finally:
        GenerateState.clear_instances()
        engine.server.stop()

    seen = tokenizer.decode(engine.requests[1]["input_ids"])  # what the model reads after list_tools
    assert catalogue in seen and "observation truncated" not in seen
    first = sample.metadata[TRACE_KEY]["turns"][0]
    assert first["calls"] == [{"name": "list_tools", "arguments": {}, "is_error": False, "kind": "ok",
                               "catalogue": True}]
    assert first["observations"] == [catalogue]


def test_other_tool_results_are_still_capped(qwen3_model) -> None:
    from transformers import AutoTokenizer

    encoder = ChatEncoder(AutoTokenizer.from_pretrained(qwen3_model), protocol.META_SYSTEM_PROMPT)
    long = "row " * 500
    capped, whole = cap_observations(encoder, [long, long], [{"name": "get_rows"},
                                                             {"name": "list_tools", "catalogue": True}], 100)
    assert capped.endswith(TRUNCATION_MARKER.format(n=len(encoder.encode(long)) - 100)) and whole == long
