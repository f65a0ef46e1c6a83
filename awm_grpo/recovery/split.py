"""Controlled recovery split: episodes that start from a damaged state, to test whether a policy repairs it.

    python -m awm_grpo.recovery.split build --out DIR [--data-dir D] [--predicates F] [--episodes T.jsonl ...]
    python -m awm_grpo.recovery.split evaluate --split DIR --model CKPT [--seeds 0 1 2] [--temperature 0.7]
    python -m awm_grpo.recovery.split evaluate --split DIR --engine-url http://127.0.0.1:30000 --model TOKENIZER

Build (docs/recovery-method.md, Metrics): for every state-mutating task (per the predicates file), a
damaged intermediate state is

    source "wrong_write":       (data with reference solutions only) the reference solution's calls up to
                                its first write (the reads a correct agent makes), then one plausible wrong
                                write of the task's wrong solution (`wrong_calls` in
                                reference_solutions.jsonl) that the reference never makes;
    source "recorded_episode":  (any data) the calls of a recorded episode of any policy (`--episodes`:
                                trace JSONL written by training, `<SAVE_DIR>/traces/rollout_*.jsonl` /
                                `eval_*.jsonl`, or by `python -m awm_grpo.eval --out`) up to and including
                                its damaging call. The calls are replayed on a fresh episode and judged by
                                the predicates file given now (never by Phi values the trace recorded): the
                                first write (tool label not "read") that returned an explicit tool error,
                                lowered Phi, or broke a preservation predicate, else (unless
                                `--strict-damage`; `unproductive_writes` in `build`) its first write after
                                its last progress that changed rows without raising Phi, if the verifier
                                rejects its replayed end state. Episodes
                                without one, of tasks that are not state-mutating, or of scenarios without
                                environment code give no handover; the manifest counts them by reason.
                                `--episodes-only` leaves out the wrong writes where solutions exist.

The calls are replayed on a fresh episode, the DB is snapshotted to `DIR/states/`, and the
conversation that led there (meta mode: list_tools + call_tool blocks, with the real observations)
is stored as `start_messages`. A state the verifier already accepts is skipped. For wrong-write
handovers the rest of the reference solution is then replayed on the damaged state:
`reference_completion` "complete" means finishing the plan suffices, "others" that the damage must
be repaired (or is irreparable) first; the manifest counts both. `DIR/split.jsonl`
holds prompt records (`text`, `metadata` with `start_db` relative to DIR), `DIR/predicates.jsonl`
the predicates, `DIR/manifest.json` counts, sources and, for every task without a handover, why
(`no_handover`). Without reference solutions and without `--episodes` the split is empty but valid,
and `build` says which files to pass.

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

from awm.solutions import EPISODE_FILES, RecordedEpisode, episode_paths, read_episodes
from awm.solutions import EpisodeFormatError as TraceFormatError

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


NO_ENV_CODE = "no environment code (gen_envs row) for this scenario: episodes cannot be played"


async def _damaging_call(runtime: Any, predicates: str, episode: RecordedEpisode,
                         unproductive: bool = False) -> tuple[int | None, str]:
    """(index of the episode's damaging call, "") or (None, why none): replays its calls on a fresh episode.

    Damaging: the first write (tool label not "read") that returned an explicit tool error, lowered Phi,
    or broke a preservation predicate (one that held before it), judged by the predicates file now.
    `unproductive`: else the first write after the episode's last progress that changed rows without
    raising Phi, when the verifier rejects the episode's replayed final state (a wrong write on rows the
    predicates do not watch, e.g. the wrong loan renewed)."""
    from awm.predicates.predicate import evaluate as evaluate_predicates

    from awm_grpo.recovery.progress import open_tracker

    scenario, idx = episode.scenario, episode.task_idx
    ep = await runtime.open(scenario, idx)
    try:
        code = runtime.dataset.scenario(scenario).full_code
        tracker = await asyncio.to_thread(open_tracker, predicates, code, scenario, idx, ep.db_path)
        writes, idle = 0, None
        for i, c in enumerate(episode.calls):
            write = tracker.label(c["tool"]) != "read"
            if write:
                writes += 1
                phi_before = (await asyncio.to_thread(tracker.after_tool_turn))["phi"]
                kept = await asyncio.to_thread(evaluate_predicates, ep.db_path, tracker.task.preservation)
            obs = await ep.call(c["tool"], c["arguments"])
            if not write:
                continue
            after = await asyncio.to_thread(tracker.after_tool_turn)
            now = await asyncio.to_thread(evaluate_predicates, ep.db_path, tracker.task.preservation)
            broke = any(b == 1.0 and a < 1.0 for b, a in zip(kept, now, strict=True))
            if obs.is_error or after["phi"] < phi_before or broke:
                return i, ""
            if after["phi"] > phi_before:
                idle = None  # progress after it: the earlier writes were steps of a plan
            elif unproductive and idle is None and after["rows"]:
                idle = i
        if idle is not None and (await ep.verify(episode.final_answer)).verdict != "complete":
            return idle, ""
        return None, "no_write" if not writes else "no_damaging_write"
    finally:
        await ep.close()


def _count(counter: dict[str, int], key: str) -> None:
    counter[key] = counter.get(key, 0) + 1


async def build(out: Path, *, data_dir: str | None, predicates: str | None, scenarios: list[str] | None,
                tool_mode: str, episodes: list[str] | None = None, max_per_task: int = 2,
                max_chars: int = 2000, list_tools: bool = True, read_back: bool = False,
                episodes_only: bool = False, unproductive_writes: bool = False,
                weak_traces: list[str] | None = None) -> dict[str, Any]:
    """Write the split to `out` (module docstring); returns the manifest.

    `episodes` (alias `weak_traces`): trace files of recorded episodes; at most `max_per_task` handovers
    per task come from them, as from the reference's wrong writes (identical call prefixes count once).
    `episodes_only`: ignore reference solutions even where the data ships them. `unproductive_writes`:
    an episode's damaging call may also be a write without progress in a rejected episode
    (`_damaging_call`). `list_tools` False: meta-mode conversations open with the first call, not
    list_tools (for a policy warm-started with `--no-list-tools`). `read_back`: a wrong-write handover
    also replays the reference's reads after the wrong write, so the conversation ends on a read that
    shows the damage."""
    from awm.episode import EnvRuntime
    from awm.predicates.build import build as build_predicates
    from awm.predicates.build import write_predicates
    from awm.runtime.pool import InfraError
    from awm.solutions import load_solutions

    from awm_grpo.recovery.progress import load_predicates, tool_semantics

    episode_files = [f for p in [*(episodes or []), *(weak_traces or [])] for f in episode_paths(p)]
    # read (and check) every episode before any work: a bad line fails in seconds, not after the replays
    recorded = [ep for path in episode_files for ep in read_episodes(path)]
    runtime = EnvRuntime(data_dir, num_workers=1)
    dataset = runtime.dataset
    names = set(dataset.scenario_names())
    for ep in recorded:
        if ep.scenario not in names or not 0 <= ep.task_idx < len(dataset.tasks(ep.scenario)):
            runtime.close()
            raise TraceFormatError(ep.where, f"task {ep.scenario}#{ep.task_idx} is not in {dataset.data_dir}",
                                   "pass the --data-dir the episodes were played on")
    out.mkdir(parents=True, exist_ok=True)
    (out / "states").mkdir(exist_ok=True)
    pred_path = out / "predicates.jsonl"
    rows: list[dict[str, Any]] = []
    skipped = 0
    attempts: dict[tuple[str, int], dict[str, int]] = {}  # per task: outcome -> count (both sources)
    outcomes: dict[str, int] = {}  # per recorded episode
    try:
        if predicates:
            shutil.copyfile(predicates, pred_path)
        else:
            write_predicates(await build_predicates(data_dir, scenarios=scenarios, runtime=runtime), pred_path)
        tasks = load_predicates(str(pred_path.resolve()))
        try:
            solutions = {} if episodes_only else load_solutions(data_dir)
            has_solutions = not episodes_only
        except FileNotFoundError:
            solutions, has_solutions = {}, False

        def playable(scenario: str) -> bool:
            return scenario in names and dataset.scenario(scenario).full_code is not None

        async def make(scenario: str, idx: int, source: str, calls: list[dict[str, Any]], rest: Any,
                       damage_at: int | None, where: str | None = None) -> bool:
            nonlocal skipped
            name = f"{scenario}-{idx}-{len(rows) + skipped}.db"
            h = await _handover(runtime, (str(pred_path.resolve()),), scenario, idx, calls, tool_mode,
                                out / "states" / name, max_chars, rest, list_tools, damage_at)
            if h is None:
                skipped += 1
                if source != "recorded_episode":  # recorded episodes count their outcome once, below
                    _count(attempts.setdefault((scenario, idx), {}), "already_complete")
                return False
            handover = {"source": source, "kind": h["kind"], "calls": calls, "phi_before": h["phi_before"],
                        "phi_after": h["phi_after"], "reference_completion": h["reference_completion"],
                        **({"episode": where} if where else {})}
            meta = {"scenario": scenario, "task_idx": idx, "task": dataset.tasks(scenario)[idx],
                    "task_type": h["task_type"], "start_db": f"states/{name}",
                    "start_messages": h["start_messages"], "handover": handover}
            rows.append({"text": meta["task"], "metadata": meta})
            if source != "recorded_episode":
                _count(attempts.setdefault((scenario, idx), {}), "handover")
            return True

        for (scenario, idx), sol in sorted(solutions.items()):
            rec = tasks.get((scenario, idx))
            if (scenarios and scenario not in scenarios) or rec is None or rec.task_type != "state_mutating" \
                    or not playable(scenario):
                continue
            labels, _ = tool_semantics(dataset.scenario(scenario).full_code)
            write_at = next((i for i, c in enumerate(sol.calls) if labels.get(c["tool"], "read") != "read"), None)
            prefix = sol.calls[:write_at] if write_at is not None else list(sol.calls)
            reference = {json.dumps(c, sort_keys=True) for c in sol.calls}
            wrong = [c for c in sol.wrong_calls if labels.get(c["tool"], "read") != "read"
                     and json.dumps(c, sort_keys=True) not in reference]
            rest = (sol.calls[len(prefix):], sol.final_answer)
            after = prefix if read_back else []
            for c in wrong[:max_per_task]:
                await make(scenario, idx, "wrong_write", prefix + [c] + after, rest, len(prefix))

        seen: set[str] = set()
        from_episodes: dict[tuple[str, int], int] = {}

        async def episode_handover(ep: RecordedEpisode) -> str:
            """Replay one recorded episode; a handover at its damaging call. Returns the outcome."""
            at, why = await _damaging_call(runtime, str(pred_path.resolve()), ep, unproductive_writes)
            if at is None:
                return why
            calls = ep.calls[: at + 1]
            digest = json.dumps([ep.scenario, ep.task_idx, calls], sort_keys=True)
            if digest in seen:
                return "duplicate_of_an_earlier_handover"
            seen.add(digest)
            made = await make(ep.scenario, ep.task_idx, "recorded_episode", calls, None, at, ep.where)
            key = (ep.scenario, ep.task_idx)
            from_episodes[key] = from_episodes.get(key, 0) + made
            return "handover" if made else "already_complete"

        for ep in recorded:
            key = (ep.scenario, ep.task_idx)
            rec = tasks.get(key)
            why = ("other_scenario" if scenarios and ep.scenario not in scenarios
                   else "infra_error" if ep.infra_error
                   else "started_from_a_handover" if ep.from_handover
                   else "task_not_in_predicates" if rec is None
                   else "task_not_state_mutating" if rec.task_type != "state_mutating"
                   else "no_environment_code" if not playable(ep.scenario)
                   else "task_has_max_per_task_handovers" if from_episodes.get(key, 0) >= max_per_task
                   else "")
            if not why:
                try:
                    why = await episode_handover(ep)
                except InfraError as exc:  # e.g. environment code that does not load: not the episode's fault
                    log.warning("%s: the environment failed while replaying the episode: %s", ep.where, exc)
                    why = "environment_error"
            _count(outcomes, why)
            if why != "other_scenario":
                _count(attempts.setdefault(key, {}), why)

        no_handover: dict[str, str] = {}
        for scenario in dataset.scenario_names():
            if scenarios and scenario not in scenarios:
                continue
            for idx in range(len(dataset.tasks(scenario))):
                tried = attempts.get((scenario, idx), {})
                if tried.get("handover"):
                    continue
                no_handover[f"{scenario}#{idx}"] = _why_none(
                    dataset, tasks.get((scenario, idx)), scenario, idx, tried, (scenario, idx) in solutions,
                    playable(scenario))
        playable_tasks = sorted(f"{s}#{i}" for (s, i), r in tasks.items() if r.task_type == "state_mutating"
                                and (not scenarios or s in scenarios) and playable(s))
    finally:
        runtime.close()
    (out / "split.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    kinds: dict[str, int] = {}
    completion: dict[str, int] = {}
    for r in rows:
        _count(kinds, f"{r['metadata']['handover']['source']}/{r['metadata']['handover']['kind']}")
        _count(completion, str(r["metadata"]["handover"]["reference_completion"]))
    reasons: dict[str, int] = {}
    for why in no_handover.values():
        _count(reasons, why.split(" (")[0].split(":")[0])
    manifest = {"handovers": len(rows), "skipped_already_complete": skipped, "kinds": kinds, "tool_mode": tool_mode,
                "list_tools": list_tools, "read_back": read_back,
                "data_dir": str(Path(data_dir).resolve()) if data_dir else None,
                "reference_completion": completion,
                "tasks": len({(r["metadata"]["scenario"], r["metadata"]["task_idx"]) for r in rows}),
                "reference_solutions": has_solutions, "unproductive_writes": unproductive_writes,
                "episodes": {"files": [str(Path(p).resolve()) for p in episode_files],
                             "records": sum(outcomes.values()), "outcomes": outcomes},
                "playable_tasks": playable_tasks,
                "no_handover_reasons": reasons, "no_handover": no_handover}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _why_none(dataset: Any, rec: Any, scenario: str, idx: int, tried: dict[str, int], solution: bool,
              playable: bool) -> str:
    """Why a task got no handover, in words (manifest `no_handover`)."""
    if rec is None:
        return ("not in the predicates file" if dataset.verifier(scenario, idx) is not None
                else "no code verifier (not in the predicates file)")
    if rec.task_type != "state_mutating":
        return f"task type {rec.task_type}: handovers are built for state-mutating tasks only" + \
            (f" ({rec.note})" if rec.note else "")
    if not playable:
        return NO_ENV_CODE
    if not tried:
        return ("no recorded episode, and the reference's wrong solution makes no write the reference "
                "does not" if solution else "no reference solution and no recorded episode")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(tried.items()))
    return f"no damaged state from its reference solution or recorded episodes ({counts})"


def explain_empty(manifest: dict[str, Any], out: Path) -> str:
    """What to do about a split without handovers (printed by `build`)."""
    lines = [f"No handovers: {out / 'split.jsonl'} is empty (a valid split with nothing to evaluate)."]
    if not manifest["reference_solutions"]:
        lines.append("This data has no reference solutions (reference_solutions.jsonl), so handovers come "
                     f"only from recorded episodes: pass --episodes FILE (repeatable), {EPISODE_FILES}.")
    playable = manifest["playable_tasks"]
    if playable:
        shown = ", ".join(playable[:10]) + (f" and {len(playable) - 10} more" if len(playable) > 10 else "")
        lines.append("Episodes qualify when they are of a state-mutating task whose scenario has "
                     f"environment code ({len(playable)} here: {shown}) and make a write that the predicates "
                     "show as wrong.")
    else:
        lines.append("No task of this data can get a handover: none is state-mutating (per the predicates) "
                     "with environment code (a gen_envs row) for its scenario.")
    reasons = "; ".join(f"{k}: {v}" for k, v in sorted(manifest["no_handover_reasons"].items()))
    lines.append(f"Tasks without a handover, by reason: {reasons or 'none'} "
                 f"(per task: {out / 'manifest.json'}, no_handover).")
    return "\n".join(lines)


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
    b.add_argument("--episodes", "--weak-traces", action="append", default=[], metavar="TRACES.jsonl",
                   help="recorded episodes of any policy (repeatable): training's traces/rollout_*.jsonl or "
                   "eval_*.jsonl (or the traces/ folder), or `awm_grpo.eval --out`; a handover at each one's "
                   "damaging write")
    b.add_argument("--episodes-only", action="store_true",
                   help="only recorded episodes, even where the data ships reference solutions")
    b.add_argument("--strict-damage", action="store_true",
                   help="only writes that failed, lowered Phi or broke a preservation predicate are damage; by "
                   "default an episode without one also hands over at its first write after its last progress "
                   "that changed rows without raising Phi, when the verifier rejects its replayed end state (a "
                   "wrong write on rows the predicates do not watch)")
    b.add_argument("--max-per-task", type=int, default=2,
                   help="handovers per task from each source: wrong writes, recorded episodes (default 2)")
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
        try:
            manifest = asyncio.run(build(Path(args.out), data_dir=args.data_dir, predicates=args.predicates,
                                         scenarios=args.scenario, tool_mode=args.tool_mode,
                                         episodes=args.episodes, max_per_task=args.max_per_task,
                                         max_chars=args.max_observation_chars,
                                         episodes_only=args.episodes_only,
                                         unproductive_writes=not args.strict_damage))
        except (TraceFormatError, FileNotFoundError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        shown = {k: v for k, v in manifest.items() if k not in ("no_handover", "playable_tasks")}
        print(json.dumps({**shown, "playable_tasks": len(manifest["playable_tasks"])}, indent=1))
        if not manifest["handovers"]:
            print(explain_empty(manifest, Path(args.out)), file=sys.stderr)
            return 1
        return 0
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
