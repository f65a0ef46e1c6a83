"""Trajectory traces and rollout metrics: every episode auditable and replayable from JSONL.

The rollout keeps each episode's full record in `sample.metadata["awm_trace"]` and appends a short
line to `<trace_dir>/live.jsonl` as soon as the episode ends (the live view). After each step the
slime hooks below write the records, now with rewards, to `<trace_dir>/rollout_<step>.jsonl` (or
`eval_<step>.jsonl`), drop them from the samples (so trajectories never travel to the trainer), clear
the live file and return the step's metrics:

    --custom-rollout-log-function-path awm_grpo.traces.log_rollout
    --custom-eval-rollout-log-function-path awm_grpo.traces.log_eval

A record: scenario, task_idx, task, task_type, group/sample index, status, reward, verdict, stop
reason, messages, per turn the model text, the calls with arguments, observations, and after each
turn that ran a tool the DB state hash and a per-table summary of changes since the initial DB;
timings (generate / env / verify seconds); weight version.

    python -m awm_grpo.traces summary RUN/traces            # success by scenario and task type
    python -m awm_grpo.traces watch RUN/traces              # follow episodes as they finish
    python -m awm_grpo.traces serve RUN                     # browse trajectories: http://127.0.0.1:8765/
    python -m awm_grpo.traces export RUN OUT_DIR            # the same as one self-contained HTML file
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

LIVE_FILE = "live.jsonl"
TRACE_KEY = "awm_trace"
SUPERSEDED_DIR = ".superseded"  # hidden: the viewer and `summary` do not read it
_STEP_FILE = re.compile(r"^(?P<series>rollout|eval_.+)_(?P<step>\d+)\.jsonl$")
_STARTED: set[Path] = set()  # trace folders this process (one run) has written a step file into
logger = logging.getLogger("awm_grpo")


def _append_line(path: Path, record: dict[str, Any]) -> None:
    """One write of one line with O_APPEND: concurrent writers never interleave within a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write_trace(trace_dir: str | None, kind: str, step: int, sample: Any, episode: Any) -> None:
    """Attach the episode record to the sample and announce it on the live view."""
    record = {
        "kind": kind, "step": step, "scenario": episode.scenario, "task_idx": episode.task_idx,
        "task": episode.task, "task_type": (sample.metadata or {}).get("task_type"),
        "group_index": sample.group_index, "index": sample.index, "status": sample.status.value,
        "verdict": episode.verdict, "stop_reason": episode.stop_reason, "infra_error": episode.infra_error,
        "final_answer": episode.final_answer, "invalid_calls": episode.invalid_calls,
        "tool_calls": episode.tool_calls, "drift_tokens": episode.drift_tokens,
        "verifier_result": episode.verifier_result, "verifier_detail": episode.verdict_detail[:2000],
        "response_length": sample.response_length, "weight_versions": list(sample.weight_versions or []),
        "timings": episode.timings, "turns": episode.turns, "messages": episode.messages,
        "recovery": getattr(episode, "recovery", None),
        "context": getattr(episode, "context", None),  # context management: deletions, samples, context tokens
        "handover": (sample.metadata or {}).get("handover"),  # a damaged start (recovery split), else None
    }
    sample.metadata[TRACE_KEY] = record
    if trace_dir:
        _append_line(Path(trace_dir) / LIVE_FILE, {
            "time": time.time(), "kind": kind, "step": step, "scenario": episode.scenario,
            "task_idx": episode.task_idx, "turns": len(episode.turns), "verdict": episode.verdict,
            "stop_reason": episode.stop_reason, "infra_error": episode.infra_error})


def _reward(args: argparse.Namespace, sample: Any) -> float | None:
    try:
        return float(sample.get_reward_value(args))
    except (TypeError, ValueError, KeyError):
        return None


def _flush(args: argparse.Namespace, samples: Iterable[Any], name: str) -> list[dict[str, Any]]:
    """Write the samples' records (with rewards) to `<trace_dir>/<name>.jsonl` and detach them."""
    records = []
    for sample in samples:
        record = (sample.metadata or {}).pop(TRACE_KEY, None)
        if record is None:
            continue
        record["reward"] = _reward(args, sample)
        records.append(record)
    trace_dir = getattr(args, "awm_trace_dir", None)
    if trace_dir and records:
        path = Path(trace_dir) / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        start_run(path.parent, name)
        data = "".join(json.dumps(record, default=str) + "\n" for record in records).encode()
        if path.exists():  # the same step flushed twice in this run: one write, appended whole
            with open(path, "ab") as f:
                f.write(data)
        else:  # whole or not at all: a reader (or a later resume) never meets a torn file of this run
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        (Path(trace_dir) / LIVE_FILE).unlink(missing_ok=True)
    return records


def start_run(trace_dir: Path, name: str) -> list[Path]:
    """Once per process and trace folder, at its first step file `name`: move the step files a previous
    run wrote for this step or later (a resumed run repeats the steps after its checkpoint) into
    `<trace_dir>/.superseded/<time>/`, so a step file never mixes two runs; returns what moved.

    A first rollout at step S moves rollout files of steps >= S and eval files of steps > S (the eval
    at S evaluated the checkpoint this run resumed from, and is not redone); a first eval at S (before
    training) moves both from S on."""
    folder = Path(trace_dir)
    key = folder.resolve()
    if key in _STARTED:
        return []
    _STARTED.add(key)
    first = _STEP_FILE.match(f"{name}.jsonl")
    if first is None:
        return []
    step, eval_first = int(first["step"]), first["series"] != "rollout"
    stale = []
    for path in sorted(folder.glob("*.jsonl")):
        m = _STEP_FILE.match(path.name)
        if m is None:
            continue
        other = int(m["step"])
        if other > step or (other == step and (m["series"] == "rollout" or eval_first)):
            stale.append(path)
    stale += sorted(folder.glob(".*.jsonl.tmp-*"))  # a write killed before its rename
    if not stale:
        return []
    dest = folder / SUPERSEDED_DIR / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
    dest.mkdir(parents=True, exist_ok=True)
    moved = []
    for path in stale:
        os.replace(path, dest / path.name)
        moved.append(dest / path.name)
    logger.warning("%s: %d trace files of steps from %d on were written by an earlier run (this one resumed or "
                   "restarted at step %d): moved to %s so no step file mixes two runs: %s", folder, len(moved), step,
                   step, dest, ", ".join(p.name for p in moved[:8]) + (" ..." if len(moved) > 8 else ""))
    return moved


def episode_metrics(records: Sequence[dict[str, Any]], prefix: str) -> dict[str, float]:
    """Success and behaviour figures; infrastructure failures are counted, not scored."""
    out: dict[str, float] = {f"{prefix}/episodes": float(len(records))}
    if not records:
        return out
    infra = [r for r in records if r.get("infra_error")]
    valid = [r for r in records if not r.get("infra_error")]
    out[f"{prefix}/infra_failures"] = float(len(infra))
    out[f"{prefix}/infra_failure_rate"] = len(infra) / len(records)
    if not valid:
        return out
    n = len(valid)
    out[f"{prefix}/success_rate"] = sum(r.get("verdict") == "complete" for r in valid) / n
    out[f"{prefix}/turns_mean"] = sum(len(r.get("turns") or []) for r in valid) / n
    out[f"{prefix}/tool_calls_mean"] = sum(r.get("tool_calls", 0) for r in valid) / n
    out[f"{prefix}/invalid_call_rate"] = sum(r.get("invalid_calls", 0) > 0 for r in valid) / n
    out[f"{prefix}/drift_rate"] = sum(r.get("drift_tokens", 0) > 0 for r in valid) / n
    # Qwen3 with thinking off drifts in every multi-turn episode (docs/chat-templates.md): the size per
    # model turn says whether it is only the expected 4 tokens of each dropped empty think block.
    turns = sum(len(r.get("turns") or []) for r in valid)
    out[f"{prefix}/drift_tokens_per_turn"] = sum(r.get("drift_tokens", 0) for r in valid) / max(turns, 1)
    for reason, count in Counter(r.get("stop_reason") or "none" for r in valid).items():
        out[f"{prefix}/stop/{reason}"] = count / n
    for key in ("generate_s", "env_s", "verify_s"):
        out[f"{prefix}/time/{key}"] = sum((r.get("timings") or {}).get(key, 0.0) for r in valid) / n
    out.update(context_metrics(valid, prefix))
    by_type: dict[str, list[bool]] = defaultdict(list)
    for r in valid:
        by_type[r.get("task_type") or "unlabelled"].append(r.get("verdict") == "complete")
    for task_type, wins in by_type.items():
        out[f"{prefix}/success_rate/{task_type}"] = sum(wins) / len(wins)
    return out


def context_metrics(records: Sequence[dict[str, Any]], prefix: str) -> dict[str, float]:
    """Context management's figures (awm_grpo.context.loop), per episode: deletions, samples made and kept,
    the context the engine saw last and at its largest (tokens, and as a share of the limit)."""
    managed = [r["context"] for r in records if r.get("context")]
    if not managed:
        return {}
    n = len(managed)
    out = {f"{prefix}/context/{key}_mean": sum(c.get(key, 0) for c in managed) / n
           for key in ("deletions", "notes", "samples", "samples_made", "final_tokens", "peak_tokens")}
    out[f"{prefix}/context/deleting_episodes"] = sum(c.get("deletions", 0) > 0 for c in managed) / n
    limited = [c for c in managed if c.get("limit")]
    if limited:
        out[f"{prefix}/context/final_fraction_mean"] = sum(c["final_tokens"] / c["limit"] for c in limited) / len(limited)
    return out


def summary_line(label: str, records: Sequence[dict[str, Any]], metrics: dict[str, float], prefix: str) -> str:
    """One aligned console line for a step or an eval set: what a person watches. Every metric
    (about a hundred with the recovery ones) goes to metrics.jsonl and TensorBoard instead."""
    rewards = [r["reward"] for r in records if r.get("reward") is not None and not r.get("infra_error")]
    reward = f"{sum(rewards) / len(rewards):+.3f}" if rewards else "   n/a"
    get = lambda key: metrics.get(f"{prefix}/{key}", float("nan"))  # noqa: E731
    line = (f"{label:<16} episodes {len(records):4d} | success {get('success_rate'):6.1%} | reward {reward} | "
            f"turns {get('turns_mean'):4.1f} | invalid calls {get('invalid_call_rate'):6.1%} | "
            f"infra failures {int(metrics.get(f'{prefix}/infra_failures', 0)):3d}")
    if f"{prefix}/recovery/progress_sm_tasks" in metrics:  # with awm_predicates (awm_grpo.recovery.metrics)
        line += (f" | progress credit {int(get('recovery/progress_credit_tasks'))}/"
                 f"{int(get('recovery/progress_sm_tasks'))} mutating tasks")
    return line


def log_rollout(rollout_id: int, args: argparse.Namespace, samples: Sequence[Any], rollout_extra_metrics: Any = None,
                rollout_time: float | None = None) -> dict[str, float]:
    """slime hook after each training rollout: write traces, return metrics (merged by slime.train)."""
    records = _flush(args, samples, f"rollout_{rollout_id:06d}")
    metrics = {**episode_metrics(records, "awm"), **_recovery(args, records, "awm/recovery")}
    if records:
        logger.info(summary_line(f"step {rollout_id + 1} rollout", records, metrics, "awm"))
    return metrics


def log_eval(rollout_id: int, args: argparse.Namespace, data: dict[str, Any], extra_metrics: Any = None) -> dict[str, float]:
    """slime hook after each evaluation: traces per eval set and success by task type."""
    metrics: dict[str, float] = {}
    for name, result in data.items():
        records = _flush(args, result.get("samples") or [], f"eval_{name}_{rollout_id:06d}")
        metrics.update(episode_metrics(records, f"eval_awm/{name}"))
        metrics.update(_recovery(args, records, f"eval_awm/{name}/recovery"))
        if records:
            logger.info(summary_line(f"eval {name} @{rollout_id}", records, metrics, f"eval_awm/{name}"))
    return metrics


def _recovery(args: argparse.Namespace, records: Sequence[dict[str, Any]], prefix: str) -> dict[str, float]:
    """Recovery metrics (docs/recovery-method.md, Metrics), all and per task type; progress ones need awm_predicates."""
    from awm_grpo.recovery.plugin import trace_metrics

    return trace_metrics(records, prefix, int(getattr(args, "awm_max_turns", None) or 15))


# ---- command line ------------------------------------------------------------------------------


def iter_records(trace_dir: str | Path, pattern: str = "*.jsonl",
                 damaged: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """Every record of the trace files matching `pattern`, file by file, without holding them all.

    `damaged` None: the viewer's reader (a half-written last line is left for later, a broken line
    elsewhere raises). A list: every line that is not a JSON object (torn, not UTF-8, not JSON) is
    skipped and named there as `file:line: why`, and reading goes on."""
    from awm_grpo.viewer.store import iter_file

    for path in sorted(Path(trace_dir).glob(pattern)):
        if path.name == LIVE_FILE:
            continue
        if damaged is None:
            yield from iter_file(path)
        else:
            yield from _tolerant_records(path, damaged)


def _tolerant_records(path: Path, damaged: list[str]) -> Iterator[dict[str, Any]]:
    from awm.data import DataFormatError

    from awm_grpo.viewer.store import parse_record

    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = parse_record(raw, f"{path}:{lineno}")
            except DataFormatError as exc:
                torn = "" if raw.endswith(b"\n") else " (last line without a newline: torn or being written)"
                damaged.append(f"{exc}{torn}")
                continue
            if not isinstance(record, dict):
                damaged.append(f"{path}:{lineno} is a JSON {type(record).__name__}, not a trace record")
                continue
            yield record


def read_records(trace_dir: str | Path, pattern: str = "*.jsonl") -> list[dict[str, Any]]:
    return list(iter_records(trace_dir, pattern))


def success_tables(records: Iterable[dict[str, Any]], keys: Sequence[str]) -> dict[str, list[tuple[str, int, int, int]]]:
    """Per key: (group, episodes, successes, infra failures) per value of the key, in one pass over `records`."""
    rows: dict[str, dict[str, list[int]]] = {key: defaultdict(lambda: [0, 0, 0]) for key in keys}
    for r in records:
        for key in keys:
            row = rows[key][str(r.get(key) or "unlabelled")]
            if r.get("infra_error"):
                row[2] += 1
                continue
            row[0] += 1
            row[1] += r.get("verdict") == "complete"
    return {key: [(k, *v) for k, v in sorted(table.items())] for key, table in rows.items()}


def print_table(title: str, rows: list[tuple[str, int, int, int]]) -> None:
    print(f"{title:<28} {'episodes':>8} {'success':>8} {'rate':>6} {'infra':>6}")
    for name, n, wins, infra in rows:
        rate = f"{wins / n:.2f}" if n else "-"
        print(f"{name:<28} {n:>8} {wins:>8} {rate:>6} {infra:>6}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.traces", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("summary", help="success rate by scenario and task type from trace files")
    sp.add_argument("trace_dir")
    sp.add_argument("--pattern", default="*.jsonl", help="which files, e.g. 'eval_*.jsonl' (default: all)")
    sp = sub.add_parser("watch", help="print episodes as they finish (reads live.jsonl), Ctrl-C to stop")
    sp.add_argument("trace_dir")
    sp.add_argument("--interval", type=float, default=1.0)
    sp = sub.add_parser("serve", help="browse runs, steps and trajectories in a local web page (docs/viewer.md)")
    sp.add_argument("run_dir", help="a run directory, its traces/ folder, or a folder of runs")
    sp.add_argument("--port", type=int, default=8765)
    sp.add_argument("--host", default="127.0.0.1", help="127.0.0.1: this machine only (traces hold model outputs)")
    sp = sub.add_parser("export", help="write the viewer with the run's data as one self-contained HTML file")
    sp.add_argument("run_dir")
    sp.add_argument("out_dir")
    sp.add_argument("--max-episodes", type=int, default=0, help="per run, the first N episodes only (0: all)")
    args = parser.parse_args(argv)
    if args.command in ("serve", "export"):
        return _viewer(args)
    if args.command == "summary":
        damaged: list[str] = []
        tables = success_tables(iter_records(args.trace_dir, args.pattern, damaged), ("scenario", "task_type"))
        for line in damaged:
            print(f"skipped damaged line {line}", file=sys.stderr)
        if not tables["scenario"]:
            print(f"no trace records under {args.trace_dir} matching {args.pattern}", file=sys.stderr)
            return 1
        print_table("scenario", tables["scenario"])
        print()
        print_table("task type", tables["task_type"])
        return 0
    live = Path(args.trace_dir) / LIVE_FILE
    offset, done = 0, Counter()
    try:
        while True:
            if live.exists():
                if live.stat().st_size < offset:
                    offset = 0  # a new step started a fresh live file
                with open(live) as f:
                    f.seek(offset)
                    for line in f:
                        r = json.loads(line)
                        done[r.get("verdict") or r.get("stop_reason")] += 1
                        print(f"step {r['step']:>4} {r['kind']:<7} {r['scenario']}#{r['task_idx']:<3} "
                              f"turns={r['turns']:<3} {r.get('verdict') or '-':<12} {r['stop_reason']}"
                              + (f" INFRA: {r['infra_error'][:80]}" if r.get("infra_error") else ""), flush=True)
                    offset = f.tell()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        print("seen:", dict(done))
        return 0


def _viewer(args: argparse.Namespace) -> int:
    from awm_grpo.viewer.store import TraceError, find_runs

    try:
        if not find_runs(Path(args.run_dir)):
            print(f"no trace files under {args.run_dir}: point at a run directory (SAVE_DIR, its traces/) or the "
                  "folder of `python -m awm_grpo.eval --out FILE`", file=sys.stderr)
            return 1
    except TraceError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.command == "export":
        from awm_grpo.viewer.export import export

        print(export(Path(args.run_dir), Path(args.out_dir), args.max_episodes))
        return 0
    from awm_grpo.viewer.server import serve

    try:
        serve(Path(args.run_dir), args.host, args.port)
    except OSError as exc:  # e.g. the port is taken
        print(f"cannot serve on {args.host}:{args.port}: {exc}; pick another with --port", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
