"""BFCL's own generation and checker, run inside the BFCL venv (.venv-bfcl) against an OpenAI endpoint.

    BFCL_PROJECT_ROOT=DIR OPENAI_BASE_URL=URL OPENAI_API_KEY=KEY \
        .venv-bfcl/bin/python awm_grpo/bfcl/harness.py --model-name NAME --categories simple_python ... \
        --summary DIR/summary.json [--limit N]

This file runs under bfcl-eval's interpreter, not the project's: it imports only the standard library
and bfcl_eval (never awm_grpo), and is started by path by `python -m awm_grpo.eval_bfcl`.
Nothing of BFCL is re-implemented. The target is registered in bfcl's model table as a
function-calling model served by bfcl's own `OpenAICompletionsHandler`; then bfcl's generation
(`_llm_response_generation.main`: its prompts, its tool conversion, its multi-turn loop that executes
each call on its stateful backends turn by turn) writes its result files, and bfcl's checker
(`eval_checker.eval_runner.main`: AST matching, state and response checks of multi-turn entries)
writes its score files. The summary repeats each category's score-file header.
`BFCL_PROJECT_ROOT` must be set before bfcl_eval is imported (bfcl reads it at import time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

REGISTRY_NAME = "stateful-rl-target"  # bfcl's key for the target: no "_" or "/" (bfcl maps them to paths)


def _select_ids(categories: list[str], limit: int) -> dict[str, list[str]]:
    """The first `limit` ids of each category in bfcl's own order (0: all of them)."""
    from bfcl_eval.utils import load_dataset_entry

    chosen = {}
    for category in categories:
        ids = [entry["id"] for entry in load_dataset_entry(category)]
        chosen[category] = ids[:limit] if limit > 0 else ids
    return chosen


def _generate(args: argparse.Namespace, ids: dict[str, list[str]]) -> None:
    """bfcl's generation over exactly `ids` (its --run-ids mode reads them from its id file)."""
    from bfcl_eval import _llm_response_generation as generation
    from bfcl_eval.constants.eval_config import TEST_IDS_TO_GENERATE_PATH

    TEST_IDS_TO_GENERATE_PATH.write_text(json.dumps(ids, indent=1))
    generation.main(argparse.Namespace(
        model=[REGISTRY_NAME], test_category=list(ids), temperature=args.temperature, include_input_log=False,
        exclude_state_log=False, num_threads=args.threads, num_gpus=1, backend="vllm",
        gpu_memory_utilization=0.9, result_dir=None, run_ids=True, allow_overwrite=True,
        skip_server_setup=True, local_model_path=None, lora_modules=None, enable_lora=False, max_lora_rank=None))


def _score_header(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return json.loads(f.readline())


def _summarise(categories: list[str], ids: dict[str, list[str]], limit: int) -> dict[str, Any]:
    """Each category's result and score files (bfcl's paths) and the score header bfcl's checker wrote."""
    from bfcl_eval.constants.eval_config import RESULT_PATH, SCORE_PATH
    from bfcl_eval.utils import get_directory_structure_by_category, get_file_name_by_category

    out: dict[str, Any] = {}
    for category in categories:
        group = get_directory_structure_by_category(category)
        result = RESULT_PATH / REGISTRY_NAME / group / get_file_name_by_category(category, is_result_file=True)
        score = SCORE_PATH / REGISTRY_NAME / group / get_file_name_by_category(category, is_score_file=True)
        if not score.is_file():
            raise SystemExit(f"bfcl's checker wrote no score file for {category} ({score}): see its log above")
        results = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
        header = _score_header(score)
        out[category] = {
            "accuracy": header["accuracy"], "correct": header["correct_count"], "total": header["total_count"],
            "requested": len(ids[category]), "partial": limit > 0,
            "inference_errors": sum(isinstance(r["result"], str) and r["result"].startswith("Error during inference")
                                    for r in results),
            "result_file": str(result), "score_file": str(score)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-name", required=True, help="the model name sent to the OpenAI endpoint")
    parser.add_argument("--categories", nargs="+", required=True, help="bfcl category names")
    parser.add_argument("--limit", type=int, default=0, help="first N entries per category (0: all)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1, help="entries in flight at once")
    parser.add_argument("--summary", required=True, help="write the per-category summary (JSON) here")
    args = parser.parse_args(argv)
    if "BFCL_PROJECT_ROOT" not in os.environ or "OPENAI_BASE_URL" not in os.environ:
        raise SystemExit("set BFCL_PROJECT_ROOT and OPENAI_BASE_URL (python -m awm_grpo.eval_bfcl does)")

    from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING, ModelConfig
    from bfcl_eval.eval_checker import eval_runner
    from bfcl_eval.model_handler.api_inference.openai_completion import OpenAICompletionsHandler
    from bfcl_eval.utils import parse_test_category_argument

    categories = parse_test_category_argument(args.categories)  # bfcl's own validation of the names
    # underscore_to_dot: OpenAI tool names cannot hold ".", bfcl's tool conversion writes "_" and its
    # checker maps them back, as for every OpenAI-style entry of its table.
    MODEL_CONFIG_MAPPING[REGISTRY_NAME] = ModelConfig(
        model_name=args.model_name, display_name=f"{args.model_name} (FC, stateful-rl)", url="", org="", license="",
        model_handler=OpenAICompletionsHandler, is_fc_model=True, underscore_to_dot=True)
    ids = _select_ids(categories, args.limit)
    _generate(args, ids)
    eval_runner.main([REGISTRY_NAME], categories, None, None, partial_eval=args.limit > 0)
    summary = {"bfcl_eval_version": version("bfcl-eval"), "model_name": args.model_name, "limit": args.limit,
               "categories": _summarise(categories, ids, args.limit)}
    Path(args.summary).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
