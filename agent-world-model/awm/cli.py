"""The `awm` command line: data, environments, verifiers and a demo of the runtime.

Every command reads an AWM-1K data directory (`--data-dir`, or $AWM_DATA_DIR, or the bundled
scenarios when neither is given). Results that other programs consume go to stdout as JSON;
progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from awm.serve.limits import add_limit_arguments, limits_from

log = logging.getLogger("awm")


def _data_dir(args: argparse.Namespace) -> str | None:
    return args.data_dir or os.environ.get("AWM_DATA_DIR") or None


def _dataset(args: argparse.Namespace):
    from awm.data import AWMDataset, bundled_data_dir
    return AWMDataset(_data_dir(args) or bundled_data_dir())


def _message(exc: BaseException) -> str:
    """An exception as a sentence (KeyError's str() adds quotes)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


# ---- data ---------------------------------------------------------------------------------
def cmd_data_download(args: argparse.Namespace) -> int:
    from awm.download import download_awm1k
    result = download_awm1k(args.dest, repo_id=args.repo_id, revision=args.revision, endpoint=args.endpoint,
                            include_sql_verifiers=not args.no_sql_verifiers)
    _print_json({"dest": str(result.dest), "files": result.files})
    return 0


def cmd_data_info(args: argparse.Namespace) -> int:
    _print_json(_dataset(args).summary())
    return 0


# ---- env ----------------------------------------------------------------------------------
def cmd_env_start(args: argparse.Namespace) -> int:
    from awm.serve.mcp_server import run_server
    run_server(_data_dir(args), args.scenario, args.host, args.port, args.workers,
               scenarios=args.also or None, limits=limits_from(args))
    return 0


def cmd_env_agentgym(args: argparse.Namespace) -> int:
    from awm.serve.agentgym_server import run_server
    run_server(_data_dir(args), args.host, args.port, args.workers, scenarios=args.scenario or None,
               limits=limits_from(args), max_steps=args.max_steps, max_action_bytes=args.max_action_bytes)
    return 0


def cmd_env_check(args: argparse.Namespace) -> int:
    from awm.episode import EnvRuntime
    from awm.runtime.pool import InfraError

    async def main() -> int:
        with EnvRuntime(_data_dir(args), num_workers=1) as runtime:
            try:
                tools = await runtime.tools(args.scenario)
            except (InfraError, KeyError) as exc:
                print(f"awm env check: {_message(exc)}", file=sys.stderr)
                return 1
        _print_json(tools)
        return 0

    return asyncio.run(main())


def cmd_env_check_all(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from awm.episode import EnvRuntime
    from awm.health import check_scenario

    async def main() -> int:
        with EnvRuntime(_data_dir(args), num_workers=args.workers) as runtime:
            names = args.scenarios or runtime.dataset.scenario_names(runnable_only=True)
            results = []
            for name in tqdm(names, desc="check", unit="scenario", file=sys.stderr):
                results.append(await check_scenario(runtime, name, call_reads=not args.list_only))
        bad = [r for r in results if not r.ok]
        if args.json:
            _print_json([r.to_dict() for r in results])
        else:
            print(f"{'scenario':40} {'ok':>3} {'tools':>5} {'reads':>5} {'5xx':>4}  problem")
            for r in results:
                problem = r.load_error.splitlines()[0] if r.load_error else (
                    ", ".join(e["tool"] for e in r.server_errors))
                print(f"{r.scenario:40} {'yes' if r.ok else 'NO':>3} {r.tools:5d} {r.read_tools:5d} "
                      f"{len(r.server_errors):4d}  {problem[:80]}")
            print(f"{len(results) - len(bad)}/{len(results)} scenarios healthy")
        return 1 if bad else 0

    return asyncio.run(main())


def cmd_env_reset_db(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from awm.data import default_cache_dir
    from awm.database import TemplateStore

    dataset = _dataset(args)
    store = TemplateStore(Path(args.database_dir) if args.database_dir else default_cache_dir() / "templates")
    names = args.scenarios or [n for n in dataset.scenario_names() if dataset.has("gen_db", n)]
    rows = []
    for name in tqdm(names, desc="build", unit="db", file=sys.stderr, disable=args.quiet):
        sc = dataset.scenario(name)
        if sc.db_schema is None:
            print(f"awm env reset_db: scenario {name!r} has no gen_db row", file=sys.stderr)
            return 1
        path, report = store.get_or_build(name, sc.db_schema, sc.sample_data, clock=args.clock, seed=args.seed,
                                          rebuild=True)
        rows.append({"scenario": name, "path": str(path), "tables": report.tables,
                     "inserts": f"{report.inserts_ok}/{report.inserts_total}", "failed": len(report.failed),
                     "sha256": report.sha256})
        for kind, stmt, err in report.failed[: args.show_failures]:
            print(f"  {name}: {kind} failed: {err}: {stmt[:120]}", file=sys.stderr)
    if not args.quiet:
        _print_json(rows)
    return 0


# ---- verify -------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace) -> int:
    if args.action == "audit":
        return cmd_verify_audit(args)
    missing = [f for f in ("scenario", "task_idx", "final_db") if getattr(args, f) is None]
    if missing:
        print(f"awm verify: missing --{', --'.join(m.replace('_', '-') for m in missing)} "
              "(or run `awm verify audit`)", file=sys.stderr)
        return 2
    from awm.data import default_cache_dir
    from awm.database import TemplateStore
    from awm.verifier import verify_code

    dataset = _dataset(args)
    row = dataset.verifier(args.scenario, args.task_idx, mode=args.mode)
    initial = args.initial_db
    if initial is None:
        sc = dataset.scenario(args.scenario)
        initial, _ = TemplateStore(default_cache_dir() / "templates").get_or_build(sc.name, sc.db_schema,
                                                                                  sc.sample_data)
    if args.mode == "sql":
        from awm.judge import JudgeConfig, judge_task
        verdict = asyncio.run(judge_task(row.code if row else None, str(initial), args.final_db,
                                         task=row.task if row else "", trajectory=[], config=JudgeConfig.from_env(),
                                         final_answer=args.final_answer))
    else:
        verdict = verify_code(row.code if row else None, str(initial), args.final_db, args.final_answer,
                              timeout_s=args.timeout)
    _print_json({"scenario": args.scenario, "task_idx": args.task_idx, "mode": args.mode, **verdict.to_dict()})
    return 0 if not verdict.infra_failure else 3


def cmd_verify_audit(args: argparse.Namespace) -> int:
    from awm.audit import audit, write_audit
    from awm.data import default_cache_dir
    from awm.database import TemplateStore
    from awm.verifier import VerifierSandbox

    dataset = _dataset(args)

    async def main() -> list:
        with VerifierSandbox() as sandbox:
            return await audit(dataset, TemplateStore(default_cache_dir() / "templates"), sandbox,
                               timeout_s=args.timeout)

    rows = asyncio.run(main())
    flagged = [r for r in rows if r.flag]
    if args.out:
        write_audit(rows, args.out)
    for r in flagged:
        print(f"{r.scenario}#{r.task_idx}: {r.flag} ({r.detail.strip().splitlines()[-1] if r.detail else r.verdict})")
    print(f"{len(flagged)} of {len(rows)} tasks flagged" + (f"; written to {args.out}" if args.out else ""),
          file=sys.stderr)
    return 0


# ---- demo ---------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    """Replay every task's reference and wrong solution (bundled, or the practice set), verify both, print a table."""
    from awm.episode import EnvRuntime
    from awm.solutions import load_solutions, replay

    solutions = load_solutions(args.data_dir)

    async def run_task(runtime: EnvRuntime, key: tuple[str, int]) -> dict:
        sol = solutions[key]
        out = {"scenario": key[0], "task": key[1], "type": sol.task_type + (" (repair)" if sol.repair else "")}
        for label, calls, answer in (("reference", sol.calls, sol.final_answer),
                                     ("wrong", sol.wrong_calls, sol.wrong_final_answer)):
            async with await runtime.open(key[0], key[1]) as ep:
                await replay(ep, calls)
                out[label] = (await ep.verify(answer)).verdict
                out["calls"] = out.get("calls", 0) + len(calls)
        return out

    async def main() -> list[dict]:
        with EnvRuntime(args.data_dir, num_workers=args.workers) as runtime:
            keys = sorted(k for k in solutions if not args.scenarios or k[0] in args.scenarios)
            return list(await asyncio.gather(*(run_task(runtime, k) for k in keys)))

    t0 = time.perf_counter()
    rows = asyncio.run(main())
    elapsed = time.perf_counter() - t0
    print(f"{'scenario':24} {'task':>4}  {'type':26} {'reference':>10} {'wrong':>8}")
    for r in rows:
        print(f"{r['scenario']:24} {r['task']:4d}  {r['type']:26} {r['reference']:>10} {r['wrong']:>8}")
    good = sum(r["reference"] == "complete" and r["wrong"] == "others" for r in rows)
    calls = sum(r["calls"] for r in rows)
    print(f"\n{good}/{len(rows)} tasks: reference solution verified complete and wrong solution rejected; "
          f"{2 * len(rows)} episodes, {calls} tool calls in {elapsed:.1f} s")
    return 0 if good == len(rows) else 1


# ---- parser -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="awm", description="AWM-1K-compatible environments: data, runtime, "
                                "MCP servers and verifiers.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def data_dir(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--data-dir", help="AWM-1K data directory (default: $AWM_DATA_DIR, else the bundled scenarios)")

    data = sub.add_parser("data", help="download or inspect AWM-1K data").add_subparsers(dest="action", required=True)
    sp = data.add_parser("download", help="fetch AgentWorldModel-1K with huggingface_hub")
    sp.add_argument("--dest", required=True, help="folder to write the JSONL files into")
    sp.add_argument("--repo-id", default="Snowflake/AgentWorldModel-1K")
    sp.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    sp.add_argument("--endpoint", default=None, help="Hub URL or mirror (default: $HF_ENDPOINT or huggingface.co)")
    sp.add_argument("--no-sql-verifiers", action="store_true", help="skip gen_verifier.jsonl (248 MB, LLM-judge mode only)")
    sp.set_defaults(func=cmd_data_download)
    sp = data.add_parser("info", help="summarise a data directory (scenarios, tasks, duplicates)")
    data_dir(sp)
    sp.set_defaults(func=cmd_data_info)

    env = sub.add_parser("env", help="run and check environments").add_subparsers(dest="action", required=True)
    sp = env.add_parser("start", help="serve a scenario over MCP streamable HTTP at http://HOST:PORT/mcp")
    data_dir(sp)
    sp.add_argument("--scenario", required=True)
    sp.add_argument("--also", nargs="*", help="more scenarios to serve at /mcp/<scenario>")
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    sp.add_argument("--port", type=int, default=8001, help="port (0 = any free port, printed at start)")
    sp.add_argument("--workers", type=int, default=None, help="environment worker processes (default: CPU count)")
    add_limit_arguments(sp)
    sp.set_defaults(func=cmd_env_start)
    sp = env.add_parser("agentgym", help="serve tasks over AgentGym's environment protocol (/create, /reset, "
                        "/step, ...) at http://HOST:PORT",
                        description="Serve AWM tasks to AgentGym clients: one env id = one isolated episode. "
                        "/reset's data_idx indexes GET /tasks (the served scenarios' verified tasks by scenario "
                        "name, then task_idx). Actions: `Action: <tool> with Action Input: <JSON object>`; "
                        "`Action: finish with Action Input: {\"answer\": ...}` runs the verifier (reward 1.0 or "
                        "0.0). The MCP limit flags apply per env id (--max-sessions caps open ids).")
    data_dir(sp)
    sp.add_argument("--scenario", nargs="*", help="serve only these scenarios (default: every runnable one)")
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only; "
                    "any other needs the bearer token $AWM_MCP_TOKEN, else one is printed)")
    sp.add_argument("--port", type=int, default=36002, help="port (default 36002; 0 = any free port, printed)")
    sp.add_argument("--workers", type=int, default=None, help="environment worker processes (default: CPU count)")
    sp.add_argument("--max-steps", type=int, default=50,
                    help="actions per episode (malformed ones count) before it ends unverified (default 50)")
    sp.add_argument("--max-action-bytes", type=int, default=64 * 1024,
                    help="an action longer than this (UTF-8 bytes) is an error observation (default 65536)")
    add_limit_arguments(sp)
    sp.set_defaults(func=cmd_env_agentgym)
    sp = env.add_parser("check", help="print a scenario's tool list as JSON (name, description, inputSchema)")
    data_dir(sp)
    sp.add_argument("--scenario", required=True)
    sp.set_defaults(func=cmd_env_check)
    sp = env.add_parser("check_all", help="load every scenario and call each read-only tool once")
    data_dir(sp)
    sp.add_argument("--scenarios", nargs="*", help="only these scenarios")
    sp.add_argument("--list-only", action="store_true", help="only load and list tools (upstream's check)")
    sp.add_argument("--workers", type=int, default=None)
    sp.add_argument("--json", action="store_true", help="JSON on stdout instead of a table")
    sp.set_defaults(func=cmd_env_check_all)
    sp = env.add_parser("reset_db", help="(re)build the template databases of scenarios")
    data_dir(sp)
    sp.add_argument("--scenarios", nargs="*", help="only these scenarios (default: all with a gen_db row)")
    sp.add_argument("--database-dir", help="where to write them (default: ~/.cache/awm/templates)")
    sp.add_argument("--clock", help="pin SQLite's 'now' (ISO time) for byte-identical builds")
    sp.add_argument("--seed", type=int, default=0, help="seed of random()/randomblob() when --clock is set")
    sp.add_argument("--show-failures", type=int, default=5, help="failed statements to print per scenario")
    sp.add_argument("--quiet", action="store_true", help="no progress bar, no JSON report")
    sp.set_defaults(func=cmd_env_reset_db)

    sp = sub.add_parser("verify", help="run a task's verifier on a final DB, or `awm verify audit`")
    sp.add_argument("action", nargs="?", choices=["audit"], help="audit: run every verifier on the untouched DB")
    data_dir(sp)
    sp.add_argument("--scenario")
    sp.add_argument("--task-idx", type=int)
    sp.add_argument("--final-db", help="the DB after the episode")
    sp.add_argument("--initial-db", help="the DB before it (default: the scenario's template)")
    sp.add_argument("--final-answer", default=None, help="the agent's last message")
    sp.add_argument("--mode", choices=["code", "sql"], default="code",
                    help="code: pure-code verifier; sql: evidence + LLM judge (OPENAI_BASE_URL, AWM_JUDGE_MODEL)")
    sp.add_argument("--timeout", type=float, default=10.0, help="seconds per verifier")
    sp.add_argument("--out", help="audit: write one JSON row per task here")
    sp.set_defaults(func=cmd_verify)

    sp = sub.add_parser("demo", help="replay the bundled reference/wrong solutions through the runtime and verify")
    sp.add_argument("--data-dir", help="a folder with reference_solutions.jsonl, e.g. the practice set "
                    "(default: the bundled scenarios)")
    sp.add_argument("--scenarios", nargs="*")
    sp.add_argument("--workers", type=int, default=None)
    sp.set_defaults(func=cmd_demo)

    from awm.gen.cli import add_gen_parser
    add_gen_parser(sub)
    for name, module, what in (("predicates", "awm.predicates.build", "build / report task predicates (recovery method)"),
                               ("semantics", "awm.predicates.tool_labels", "label tools read/create/update/delete from code")):
        sp = sub.add_parser(name, help=f"{what}; `awm {name} -h` for more", add_help=False, prefix_chars="+")
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(func=lambda a, m=module: __import__(m, fromlist=["main"]).main(a.rest))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"awm {args.command}: {_message(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `awm ... | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
