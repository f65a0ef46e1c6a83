"""Evaluate a policy on BFCL (Berkeley Function Calling Leaderboard) with bfcl-eval's own data and checker.

    python -m awm_grpo.eval_bfcl --model runs/awm_grpo/models/warmstart --categories simple multi_turn_base
    python -m awm_grpo.eval_bfcl --engine-url http://127.0.0.1:30000 --model TOKENIZER_DIR --limit 20
    python -m awm_grpo.eval_bfcl --openai-base-url http://127.0.0.1:8000/v1 --openai-model Qwen3-4B

Three targets, as in `awm_grpo.eval`: a checkpoint (served here by the CPU engine), a running
SGLang-protocol server (`--engine-url`), or any OpenAI-compatible endpoint. The first two are put
behind `awm_grpo.bfcl.chat_server` (the project's chat template in, its tool-call parser out), so
bfcl always talks OpenAI chat with tools. bfcl-eval itself runs in its own venv (`bash setup.sh
--bfcl`, .venv-bfcl; it pins numpy 1.26.4 and many SDKs) as a subprocess, `awm_grpo/bfcl/harness.py`:
bfcl's generation (multi-turn entries executed on its own stateful backends turn by turn) and bfcl's
checker. This module prints bfcl's per-category accuracy and writes `<out>/bfcl_results.json`;
bfcl's result and score files stay under `<out>/bfcl/`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HARNESS = Path(__file__).resolve().parent / "bfcl" / "harness.py"
DEFAULT_BFCL_PYTHON = ROOT / ".venv-bfcl" / "bin" / "python"

# bfcl's categories this harness runs (bfcl-eval 2026.3.23 names). Left out: memory_* (an embedding
# model download, sentence-transformers), web_search_* (SerpAPI key, internet) and format_sensitivity
# (prompting models only); bfcl validates the names again itself.
SINGLE_TURN = ["simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
               "irrelevance", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
               "live_irrelevance", "live_relevance"]
MULTI_TURN = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
GROUPS = {"simple": ["simple_python"], "single_turn": SINGLE_TURN, "multi_turn": MULTI_TURN,
          "non_live": SINGLE_TURN[:7], "live": SINGLE_TURN[7:], "all": SINGLE_TURN + MULTI_TURN}


def resolve_categories(names: list[str]) -> list[str]:
    """Category names and groups -> bfcl category names, in a stable order; `simple` is simple_python."""
    out: list[str] = []
    for name in names:
        if name in GROUPS:
            out += GROUPS[name]
        elif name in SINGLE_TURN or name in MULTI_TURN:
            out.append(name)
        else:
            raise SystemExit(f"unknown or unsupported BFCL category {name!r}: use one of "
                             f"{', '.join(SINGLE_TURN + MULTI_TURN)} or a group ({', '.join(GROUPS)})")
    return list(dict.fromkeys(out))


def bfcl_python(path: str | None) -> Path:
    """The BFCL venv's interpreter; a clear error when it is missing."""
    python = Path(path) if path else DEFAULT_BFCL_PYTHON
    if not python.exists():
        raise SystemExit(f"no BFCL venv at {python}: create it with `bash setup.sh --bfcl` "
                         "(or pass --bfcl-python .../bin/python of a venv with requirements-bfcl.txt)")
    return python


def run_harness(python: Path, base_url: str, model_name: str, categories: list[str], opts: argparse.Namespace,
                api_key: str | None = None) -> dict[str, Any]:
    """bfcl's generation + checker in the BFCL venv; returns the harness's summary (per category)."""
    out = Path(opts.out).resolve()
    work = out / "bfcl"
    if work.exists():
        shutil.rmtree(work)  # a fresh bfcl project root: bfcl would otherwise reuse old results
    work.mkdir(parents=True)
    summary = out / "bfcl_summary.json"
    summary.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(BFCL_PROJECT_ROOT=str(work), OPENAI_BASE_URL=base_url,
               OPENAI_API_KEY=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
               TOKENIZERS_PARALLELISM="false")
    cmd = [str(python), str(HARNESS), "--model-name", model_name, "--categories", *categories,
           "--limit", str(opts.limit), "--temperature", str(opts.temperature), "--threads", str(opts.concurrency),
           "--summary", str(summary)]
    log = out / "bfcl_harness.log"
    with log.open("w") as f:
        code = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=work).returncode
    if code != 0 or not summary.is_file():
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise SystemExit(f"the BFCL harness failed (exit {code}); last lines of {log}:\n{tail}")
    return json.loads(summary.read_text())


def evaluate(opts: argparse.Namespace) -> dict[str, Any]:
    """Start what the target needs, run the harness, return the result record."""
    from awm_grpo.bfcl.chat_server import ChatServer

    categories = resolve_categories(opts.categories)
    python = bfcl_python(opts.bfcl_python)
    engine = server = None
    started = time.perf_counter()
    try:
        if opts.openai_base_url:
            base_url, model_name = opts.openai_base_url, opts.openai_model or os.environ.get("OPENAI_MODEL")
            if not model_name:
                raise SystemExit("--openai-model (or $OPENAI_MODEL) is required with --openai-base-url")
            target = {"kind": "openai", "base_url": base_url, "model": model_name}
        else:
            if not opts.model:
                raise SystemExit("--model is required with a checkpoint or --engine-url (its tokenizer and chat "
                                 "template are used)")
            url = opts.engine_url
            if url is None:
                from slime.engine.cpu_server import CPUEngine

                engine = CPUEngine(opts.model, port=0, seed=opts.seed)
                url = engine.start()
            server = ChatServer(url, opts.model, max_new_tokens=opts.max_tokens_per_turn,
                                enable_thinking=opts.enable_thinking)
            base_url, model_name = server.start(), Path(opts.model).name
            target = {"kind": "engine_url" if opts.engine_url else "checkpoint", "model": str(opts.model),
                      "engine_url": opts.engine_url}
        summary = run_harness(python, base_url, model_name, categories, opts)
    finally:
        if server is not None:
            server.shutdown()
        if engine is not None:
            engine.shutdown()
    return {"target": target, "limit": opts.limit, "temperature": opts.temperature,
            "wall_s": round(time.perf_counter() - started, 1), **summary}


def print_table(record: dict[str, Any]) -> None:
    print(f"{'category':<26} {'accuracy':>9} {'correct':>8} {'total':>6}")
    for name, row in record["categories"].items():
        print(f"{name:<26} {row['accuracy']:>9.3f} {row['correct']:>8d} {row['total']:>6d}")
    partial = " (first N entries per category: not comparable with the leaderboard)" if record["limit"] else ""
    print(f"bfcl-eval {record['bfcl_eval_version']}, {record['wall_s']} s{partial}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.eval_bfcl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--categories", nargs="+", default=["simple", "multiple", "parallel", "multi_turn_base"],
                        help=f"bfcl categories or groups ({', '.join(GROUPS)}); `simple` = simple_python")
    parser.add_argument("--model", help="HF checkpoint folder (served by a CPU engine here) or, with --engine-url, "
                        "the tokenizer folder")
    parser.add_argument("--engine-url", help="a running SGLang-protocol server (/generate) to use instead")
    parser.add_argument("--openai-base-url", help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--openai-model", help="model name for --openai-base-url (default: $OPENAI_MODEL)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N entries of each category (0: all)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens-per-turn", type=int, default=512, help="checkpoint / --engine-url only")
    parser.add_argument("--enable-thinking", action="store_true", help="Qwen3 thinking in the chat template")
    parser.add_argument("--concurrency", type=int, default=4, help="bfcl entries in flight at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bfcl", help="bfcl_results.json, the harness log and bfcl's files")
    parser.add_argument("--bfcl-python", help=f"the BFCL venv's python (default: {DEFAULT_BFCL_PYTHON})")
    opts = parser.parse_args(argv)
    if opts.limit < 0:
        parser.error("--limit must be >= 0")
    record = evaluate(opts)
    out = Path(opts.out) / "bfcl_results.json"
    out.write_text(json.dumps(record, indent=1))
    print_table(record)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
