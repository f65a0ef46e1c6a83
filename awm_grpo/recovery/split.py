"""Controlled recovery split: episodes that start from a damaged state, to test whether a policy repairs it.

    python -m awm_grpo.recovery.split build --out DIR [--predicates FILE] [--weak-traces TRACES.jsonl ...]
    python -m awm_grpo.recovery.split evaluate --split DIR --model CKPT [--seeds 0 1 2] [--temperature 0.7]
    python -m awm_grpo.recovery.split evaluate --split DIR --engine-url http://127.0.0.1:30000 --model TOKENIZER

Build (docs/recovery-method.md, Metrics): for every state-mutating task (per the predicates file) with a
reference solution, a damaged intermediate state is

    source "wrong_write":  the reference solution's calls up to its first write (the reads a correct
                           agent makes), then one plausible wrong write of the task's wrong solution
                           (`wrong_calls` in reference_solutions.jsonl) that the reference never makes;
    source "weak_policy":  the calls of a weak policy's episode (trace JSONL with progress, from
                           `awm_grpo.eval --out` or training traces) up to and including its first
                           explicit tool error or negative-progress step.

The calls are replayed on a fresh episode, the DB is snapshotted to `DIR/states/`, and the
conversation that led there (meta mode: list_tools + call_tool blocks, with the real observations)
is stored as `start_messages`. A state the verifier already accepts is skipped. For wrong-write
handovers the rest of the reference solution is then replayed on the damaged state:
`reference_completion` "complete" means finishing the plan suffices, "others" that the damage must
be repaired (or is irreparable) first; the manifest counts both. `DIR/split.jsonl`
holds prompt records (`text`, `metadata` with `start_db` relative to DIR), `DIR/predicates.jsonl`
the predicates, `DIR/manifest.json` counts and sources.

Evaluate runs the policy from every handover through the training rollout (awm_grpo.eval machinery,
with progress predicates on) and reports, all and per task type:
recovery_success (the task completes), additional_damage (a negative-progress step after the
handover), verification_first_rate (the first action is a task-relevant read), plus SR and DSR.
Handover kinds: error (the last call failed), negative_progress (it lowered Phi), destructive (it
broke a preservation predicate: rows the task must leave alone), wrong_write (any other change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from awm_grpo import protocol

log = logging.getLogger("awm_grpo.recovery.split")
REPORTED = ("recovery_success", "additional_damage", "verification_first_rate", "SR", "DSR")


def call_text(tool: str, arguments: dict[str, Any], tool_mode: str) -> str:
    """An assistant reply making one call, in the rollout's format for `tool_mode`."""
    if tool_mode == "native":
        body = {"name": tool, "arguments": arguments}
    else:
        body = {"name": protocol.CALL_TOOL, "arguments": {"tool_name": tool, "arguments": arguments}}
    return "<tool_call>\n" + json.dumps(body) + "\n</tool_call>"


def _observation(obs: Any, max_chars: int) -> str:
    text = protocol.observation_text(obs.text, obs.is_error)
    return text if len(text) <= max_chars else text[:max_chars] + "\n[... observation truncated]"


async def _handover(runtime: Any, tracker_args: tuple, scenario: str, idx: int, calls: list[dict[str, Any]],
                    tool_mode: str, dest: Path, max_chars: int, completion: Any = None,
                    list_tools: bool = True, damage_at: int | None = None) -> dict[str, Any] | None:
    """Replay `calls` on a fresh episode; snapshot, conversation and progress of the last call. None if solved.

    `damage_at`: index of the damaging call (default the last; phi_before is measured before it).
    `completion` ((calls, final answer) of the reference after its prefix): replayed on the damaged
    state after the snapshot; its verdict says whether finishing the plan without repairing the
    damage already succeeds ("complete") or a repair is needed ("others").
    """
    from awm.database import backup
    from awm.predicates.predicate import evaluate as evaluate_predicates

    from awm_grpo.recovery.progress import open_tracker

    ep = await runtime.open(scenario, idx)
    try:
        code = runtime.dataset.scenario(scenario).full_code
        tracker = await asyncio.to_thread(open_tracker, *tracker_args, code, scenario, idx, ep.db_path)
        messages: list[dict[str, str]] = []
        if tool_mode == "meta" and list_tools:
            messages += [{"role": "assistant", "content": "<tool_call>\n" + json.dumps(
                {"name": protocol.LIST_TOOLS, "arguments": {}}) + "\n</tool_call>"},
                {"role": "tool", "content": protocol.tool_catalogue(ep.tools)}]
        phi_before, obs = tracker.phi0, None
        damage_at = len(calls) - 1 if damage_at is None else damage_at
        for i, c in enumerate(calls):
            if i == damage_at:
                phi_before = (await asyncio.to_thread(tracker.after_tool_turn))["phi"]
            obs = await ep.call(c["tool"], c.get("arguments") or {})
            messages += [{"role": "assistant", "content": call_text(c["tool"], c.get("arguments") or {}, tool_mode)},
                         {"role": "tool", "content": _observation(obs, max_chars)}]
        phi_after = (await asyncio.to_thread(tracker.after_tool_turn))["phi"]
        if (await ep.verify(None)).verdict == "complete":
            return None
        backup(ep.db_path, dest)
        reference_completion = None
        if completion is not None:
            for c in completion[0]:
                await ep.call(c["tool"], c.get("arguments") or {})
            reference_completion = (await ep.verify(completion[1])).verdict
        broken = any(v < 1.0 for v in evaluate_predicates(ep.db_path, tracker.task.preservation))
        kind = "error" if obs is not None and obs.is_error else "negative_progress" if phi_after < phi_before \
            else "destructive" if broken else "wrong_write"
        return {"start_messages": messages, "kind": kind, "phi_before": phi_before, "phi_after": phi_after,
                "task_type": tracker.task.task_type, "reference_completion": reference_completion}
    finally:
        await ep.close()


def _first_trouble_calls(record: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A weak policy's calls up to and including its first error / negative-progress turn (None: none)."""
    credit = (record.get("recovery") or {}).get("credit") or {}
    phis = [credit.get("phi0"), *(credit.get("phi") or [])]
    calls: list[dict[str, Any]] = []
    for i, turn in enumerate(record.get("turns") or []):
        named = [c for c in turn.get("calls") or [] if "name" in c and c["name"] != protocol.LIST_TOOLS]
        calls += [{"tool": c["name"], "arguments": c.get("arguments") or {}} for c in named]
        dip = i + 1 < len(phis) and phis[i] is not None and phis[i + 1] is not None and phis[i + 1] < phis[i]
        if named and (any(c.get("is_error") for c in named) or dip):
            return calls
    return None


async def build(out: Path, *, data_dir: str | None, predicates: str | None, scenarios: list[str] | None,
                tool_mode: str, weak_traces: list[str], max_per_task: int, max_chars: int,
                list_tools: bool = True, read_back: bool = False) -> dict[str, Any]:
    """Write the split to `out` (module docstring); returns the manifest.

    `list_tools` False: meta-mode conversations open with the first call, not list_tools (for a policy
    warm-started with `--no-list-tools`). `read_back`: a wrong-write handover also replays the
    reference's reads after the wrong write, so the conversation ends on a read that shows the damage."""
    from awm.episode import EnvRuntime
    from awm.predicates.build import build as build_predicates
    from awm.predicates.build import write_predicates
    from awm.solutions import load_solutions

    from awm_grpo.recovery.progress import load_predicates, tool_semantics

    out.mkdir(parents=True, exist_ok=True)
    (out / "states").mkdir(exist_ok=True)
    pred_path = out / "predicates.jsonl"
    runtime = EnvRuntime(data_dir, num_workers=1)
    try:
        if predicates:
            shutil.copyfile(predicates, pred_path)
        else:
            write_predicates(await build_predicates(data_dir, scenarios=scenarios, runtime=runtime), pred_path)
        tasks = load_predicates(str(pred_path.resolve()))
        solutions = load_solutions(data_dir) if not weak_traces else {}
        jobs: list[tuple[str, int, str, list[dict[str, Any]], Any, int | None]] = []
        for (scenario, idx), sol in sorted(solutions.items()):
            rec = tasks.get((scenario, idx))
            if (scenarios and scenario not in scenarios) or rec is None or rec.task_type != "state_mutating":
                continue
            labels, _ = tool_semantics(runtime.dataset.scenario(scenario).full_code)
            write_at = next((i for i, c in enumerate(sol.calls) if labels.get(c["tool"], "read") != "read"), None)
            prefix = sol.calls[:write_at] if write_at is not None else list(sol.calls)
            reference = {json.dumps(c, sort_keys=True) for c in sol.calls}
            wrong = [c for c in sol.wrong_calls if labels.get(c["tool"], "read") != "read"
                     and json.dumps(c, sort_keys=True) not in reference]
            rest = (sol.calls[len(prefix):], sol.final_answer)
            after = prefix if read_back else []
            jobs += [(scenario, idx, "wrong_write", prefix + [c] + after, rest, len(prefix)) for c in wrong[:max_per_task]]
        for path in weak_traces:
            for line in Path(path).read_text().splitlines():
                r = json.loads(line) if line.strip() else None
                rec = tasks.get((r["scenario"], r["task_idx"])) if r else None
                calls = _first_trouble_calls(r) if rec is not None and rec.task_type == "state_mutating" else None
                if calls and not r.get("infra_error") and (not scenarios or r["scenario"] in scenarios):
                    jobs.append((r["scenario"], r["task_idx"], "weak_policy", calls, None, None))
        rows, skipped = [], 0
        for n, (scenario, idx, source, calls, rest, damage_at) in enumerate(jobs):
            name = f"{scenario}-{idx}-{n}.db"
            h = await _handover(runtime, (str(pred_path.resolve()),), scenario, idx, calls, tool_mode,
                                out / "states" / name, max_chars, rest, list_tools, damage_at)
            if h is None:
                skipped += 1
                continue
            meta = {"scenario": scenario, "task_idx": idx, "task": runtime.dataset.tasks(scenario)[idx],
                    "task_type": h["task_type"], "start_db": f"states/{name}", "start_messages": h["start_messages"],
                    "handover": {"source": source, "kind": h["kind"], "calls": calls,
                                 "phi_before": h["phi_before"], "phi_after": h["phi_after"],
                                 "reference_completion": h["reference_completion"]}}
            rows.append({"text": meta["task"], "metadata": meta})
    finally:
        runtime.close()
    (out / "split.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    kinds: dict[str, int] = {}
    for r in rows:
        k = f"{r['metadata']['handover']['source']}/{r['metadata']['handover']['kind']}"
        kinds[k] = kinds.get(k, 0) + 1
    completion: dict[str, int] = {}
    for r in rows:
        v = str(r["metadata"]["handover"]["reference_completion"])
        completion[v] = completion.get(v, 0) + 1
    manifest = {"handovers": len(rows), "skipped_already_complete": skipped, "kinds": kinds, "tool_mode": tool_mode,
                "list_tools": list_tools, "read_back": read_back, "data_dir": str(Path(data_dir).resolve()) if data_dir else None,
                "reference_completion": completion,
                "tasks": len({(r["metadata"]["scenario"], r["metadata"]["task_idx"]) for r in rows})}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def resolved_split(split_dir: Path, dest: Path, tasks: set[tuple[str, int]] | None = None) -> Path:
    """split.jsonl with `start_db` made absolute (the rollout reads it from any working directory).

    `tasks`: keep only handovers of these (scenario, task_idx), e.g. the held-out tasks of a run.
    """
    rows = []
    for line in (split_dir / "split.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if tasks is not None and (r["metadata"]["scenario"], r["metadata"]["task_idx"]) not in tasks:
                continue
            r["metadata"]["start_db"] = str((split_dir / r["metadata"]["start_db"]).resolve())
            rows.append(r)
    if not rows:
        raise ValueError(f"{split_dir}/split.jsonl has no handovers{' of the selected tasks' if tasks else ''}: "
                         "rebuild it with `build` (or select other tasks)")
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest


def play(prompts: Path, *, predicates: Path, tool_mode: str, data_dir: str | None, model: str | None,
         engine_url: str | None = None, seed: int = 0, n: int = 1, temperature: float = 0.0,
         max_response_len: int = 1024, max_turns: int = 8, max_tokens_per_turn: int | None = 256,
         max_observation_tokens: int = 256, concurrency: int = 4, limit: int = 0,
         runtime: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Play the policy on every prompt of `prompts` (damaged starts or initial states) through the
    training rollout with progress on: (recovery metrics by task type, trace records). `runtime`:
    more awm_* keys, e.g. B1's window for a policy trained with it."""
    import yaml

    from awm_grpo import eval as awm_eval
    from awm_grpo.recovery.metrics import recovery_metrics
    from awm_grpo.recovery.plugin import episode_record

    with tempfile.TemporaryDirectory(prefix="awm-recovery-eval-") as tmp:
        config = Path(tmp) / "runtime.yaml"
        config.write_text(yaml.safe_dump({"awm_predicates": str(Path(predicates).resolve()),
                                          "awm_tool_mode": tool_mode, "awm_data_dir": data_dir,
                                          "awm_max_turns": max_turns, "awm_env_workers": 1,
                                          "awm_max_tokens_per_turn": max_tokens_per_turn,
                                          "awm_max_observation_tokens": max_observation_tokens,
                                          **(runtime or {})}))
        opts = argparse.Namespace(split=str(prompts), model=model, engine_url=engine_url, openai_base_url=None,
                                  openai_model=None, config=str(config), n=n, temperature=temperature,
                                  max_response_len=max_response_len, max_tokens_per_turn=512,
                                  concurrency=concurrency, limit=limit, seed=seed)
        records = awm_eval.evaluate(opts)
    return recovery_metrics([episode_record(r, max_turns) for r in records]), records


def evaluate(split_dir: str | Path, *, model: str | None, engine_url: str | None = None, seed: int = 0,
             n: int = 1, temperature: float = 0.0, max_response_len: int = 1024, max_turns: int = 8,
             max_tokens_per_turn: int | None = 256, max_observation_tokens: int = 256, concurrency: int = 4,
             limit: int = 0, tasks: set[tuple[str, int]] | None = None,
             runtime: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Play the policy from every handover: (recovery metrics by task type, trace records)."""
    split_dir = Path(split_dir)
    with tempfile.TemporaryDirectory(prefix="awm-recovery-split-") as tmp:
        split = resolved_split(split_dir, Path(tmp) / "split.jsonl", tasks)
        return play_like(split_dir, split, model=model, engine_url=engine_url, seed=seed, n=n,
                         temperature=temperature, max_response_len=max_response_len, max_turns=max_turns,
                         max_tokens_per_turn=max_tokens_per_turn, max_observation_tokens=max_observation_tokens,
                         concurrency=concurrency, limit=limit, runtime=runtime)


def play_like(split_dir: Path, prompts: Path, **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`play` the prompts with the split's predicates, tool mode and data folder (e.g. the held-out tasks
    from their initial states, beside the split's handovers)."""
    manifest = json.loads((Path(split_dir) / "manifest.json").read_text())
    return play(prompts, predicates=Path(split_dir) / "predicates.jsonl", tool_mode=manifest.get("tool_mode", "meta"),
                data_dir=manifest.get("data_dir"), **kw)


def summarize(runs: list[dict[str, Any]], metrics: tuple[str, ...] = REPORTED) -> dict[str, dict[str, tuple[float, float, int]]]:
    """{task type: {metric: (mean, std over runs, runs with a value)}} of `metrics`."""
    from awm_grpo.recovery.report import mean_std

    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for split in sorted({s for m in runs for s in m}):
        out[split] = {}
        for key in metrics:
            vals = [m[split][key]["rate"] for m in runs if split in m and isinstance(m[split].get(key), dict)
                    and m[split][key]["rate"] is not None]
            mean, std = mean_std(vals)
            out[split][key] = (mean, std if vals else 0.0, len(vals))
    return out


def print_table(rows: dict[str, dict[str, dict[str, tuple[float, float, int]]]]) -> None:
    """One line per (policy, task type): mean +- std over seeds of each reported metric."""
    print(f"{'policy':<14} {'task type':<16} " + " ".join(f"{k:>24}" for k in REPORTED))
    for policy, by_split in rows.items():
        for split, metrics in by_split.items():
            cells = [f"{m:.3f} +- {s:.3f} (n={k})" if k else "-" for m, s, k in (metrics[x] for x in REPORTED)]
            print(f"{policy:<14} {split:<16} " + " ".join(f"{c:>24}" for c in cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.recovery.split", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="snapshot damaged states + conversation prefixes of state-mutating tasks")
    b.add_argument("--out", required=True)
    b.add_argument("--data-dir", help="AWM data directory (default: the bundled scenarios, which ship solutions)")
    b.add_argument("--predicates", help="predicates JSONL (default: built now with awm.predicates)")
    b.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    b.add_argument("--tool-mode", default="meta", choices=["meta", "native"])
    b.add_argument("--weak-traces", action="append", default=[],
                   help="trace JSONL of a weak policy (with progress): handovers at its first bad step instead")
    b.add_argument("--max-per-task", type=int, default=2, help="wrong writes per task (default 2)")
    b.add_argument("--max-observation-chars", type=int, default=2000)
    e = sub.add_parser("evaluate", help="play a policy from every handover and report recovery metrics")
    e.add_argument("--split", required=True, help="a folder written by `build`")
    e.add_argument("--model", help="HF checkpoint (served by a CPU engine here) or, with --engine-url, the tokenizer")
    e.add_argument("--engine-url", help="a running SGLang-protocol server (/generate)")
    e.add_argument("--seeds", type=int, nargs="+", default=[0])
    e.add_argument("--n", type=int, default=1, help="episodes per handover and seed")
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--max-response-len", type=int, default=1024)
    e.add_argument("--max-turns", type=int, default=8)
    e.add_argument("--limit", type=int, default=0, help="only the first N handovers")
    e.add_argument("--out", help="write metrics per seed and the trace records here (JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.command == "build":
        manifest = asyncio.run(build(Path(args.out), data_dir=args.data_dir, predicates=args.predicates,
                                     scenarios=args.scenario, tool_mode=args.tool_mode, weak_traces=args.weak_traces,
                                     max_per_task=args.max_per_task, max_chars=args.max_observation_chars))
        print(json.dumps(manifest, indent=1))
        return 0 if manifest["handovers"] else 1
    if not args.model:
        raise SystemExit("--model is required (a checkpoint, or the tokenizer folder with --engine-url)")
    runs, records = [], {}
    for seed in args.seeds:
        metrics, recs = evaluate(args.split, model=args.model, engine_url=args.engine_url, seed=seed, n=args.n,
                                 temperature=args.temperature, max_response_len=args.max_response_len,
                                 max_turns=args.max_turns, limit=args.limit)
        runs.append(metrics)
        records[seed] = recs
    print_table({Path(args.model).name: summarize(runs)})
    if args.out:
        Path(args.out).write_text(json.dumps({"seeds": args.seeds, "metrics": runs, "records": records}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
