"""`awm gen ...`: the command line of the synthesis pipeline (registered by `awm.cli.build_parser`).

The endpoint comes from flags or the environment: --base-url / OPENAI_BASE_URL, --api-key /
OPENAI_API_KEY, --model / AWM_GEN_MODEL / OPENAI_MODEL. A local SGLang or vLLM server works
the same as a hosted API (`--base-url http://127.0.0.1:30000/v1`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from awm.gen.config import STAGE_ORDER


def cmd_gen(args: argparse.Namespace) -> int:
    from awm.gen.config import GenConfig
    from awm.gen.runner import format_summary, run_stages
    from awm.llm import ChatClient

    model = args.model or os.environ.get("AWM_GEN_MODEL") or os.environ.get("OPENAI_MODEL") or ""
    if not model:
        raise ValueError("no model: pass --model or set AWM_GEN_MODEL (or OPENAI_MODEL)")
    cfg = GenConfig(
        output_dir=Path(args.output_dir), model=model, temperature=args.temperature, max_tokens=args.max_tokens,
        retries=args.retries, concurrency=args.concurrency, env_concurrency=args.env_concurrency,
        scenarios=tuple(args.scenarios or ()), count=args.count, batch=args.batch, max_rounds=args.max_rounds,
        seeds=Path(args.seeds) if args.seeds else None, embedding_model=args.embedding_model or "",
        embed_threshold=args.embed_threshold, insert_failure_threshold=args.insert_failure_threshold,
        tool_timeout_s=args.tool_timeout, verifier_timeout_s=args.verifier_timeout, verifier_mode=args.verifier_mode,
        retry_rejected=args.retry_rejected, progress=not args.no_progress,
    )
    stages = list(STAGE_ORDER) if args.stage == "all" else [args.stage]

    async def main() -> dict[str, Any]:
        async with ChatClient(args.base_url, args.api_key, model, timeout_s=args.timeout,
                              retries=args.http_retries, max_concurrency=args.concurrency) as client:
            return await run_stages(cfg, stages, client)

    summary = asyncio.run(main())
    print(format_summary(summary), file=sys.stderr)
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if not summary["endpoint_failures"] else 4


def add_gen_parser(sub: Any) -> None:
    """Register `awm gen STAGE` on the top-level subparsers."""
    sp = sub.add_parser("gen", help="synthesise AWM-1K environments with an OpenAI-compatible model",
                        description="Run one synthesis stage, or all in order, into --output-dir. Reruns skip "
                        "finished records; records failing validation after their retries go to rejects.jsonl.")
    sp.add_argument("stage", choices=[*STAGE_ORDER, "all"])
    sp.add_argument("--output-dir", required=True, help="where the gen_*.jsonl files are read and written")
    sp.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL)")
    sp.add_argument("--api-key", default=None, help="default: $OPENAI_API_KEY")
    sp.add_argument("--model", default=None, help="default: $AWM_GEN_MODEL, else $OPENAI_MODEL")
    sp.add_argument("--temperature", type=float, default=1.0)
    sp.add_argument("--max-tokens", type=int, default=16384)
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds per LLM request")
    sp.add_argument("--http-retries", type=int, default=3, help="retries of a failed HTTP request (with backoff)")
    sp.add_argument("--retries", type=int, default=3, help="regenerations of a record that fails validation")
    sp.add_argument("--concurrency", type=int, default=8, help="records and LLM requests in flight")
    sp.add_argument("--env-concurrency", type=int, default=2, help="environment validations at once")
    sp.add_argument("--scenarios", nargs="*", help="only these scenarios")
    sp.add_argument("--retry-rejected", action="store_true", help="try again the keys already in rejects.jsonl")
    sp.add_argument("--count", type=int, default=10, help="scenario: how many gen_scenario.jsonl should hold")
    sp.add_argument("--batch", type=int, default=5, help="scenario: proposals asked for per call")
    sp.add_argument("--max-rounds", type=int, default=0, help="scenario: call limit (0: 3 x what --count needs)")
    sp.add_argument("--seeds", help="scenario: JSONL of {name, description} shown as examples")
    sp.add_argument("--embedding-model", help="scenario: also de-duplicate by embeddings from the same endpoint")
    sp.add_argument("--embed-threshold", type=float, default=0.85, help="scenario: max cosine similarity")
    sp.add_argument("--insert-failure-threshold", type=float, default=0.1, help="sample: max failed/total INSERTs")
    sp.add_argument("--tool-timeout", type=float, default=10.0, help="env: seconds per probing tool call")
    sp.add_argument("--verifier-mode", choices=["code", "sql"], default="code",
                    help="verifier: code -> gen_verifier.pure_code.jsonl (binary reward); sql -> gen_verifier.jsonl "
                    "(evidence for the LLM judge)")
    sp.add_argument("--verifier-timeout", type=float, default=10.0, help="verifier: seconds per sandboxed run")
    sp.add_argument("--no-progress", action="store_true", help="no progress bars")
    sp.set_defaults(func=cmd_gen)
