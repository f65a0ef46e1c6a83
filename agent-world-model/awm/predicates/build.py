"""Build and report the executable intermediate predicates of every task (docs/recovery-method.md, Predicates).

    awm predicates build [--data-dir D] --out predicates.jsonl [--llm] [--ignore-solutions] [--episodes T]
    awm predicates coverage predicates.jsonl                                  (or python -m awm.predicates)

Per task: the verifier's source is analysed (`awm.predicates.verifier_analysis.analyse`), the verifier runs
traced in the sandbox on (s0, A), its final-DB statements become candidates (`awm.predicates.predicate.extract`),
and candidates are kept only when executable on s0 and met on A and B. A and B are two replays of the
reference solution run at different times where one exists (so clock-dependent values are caught); else
(AWM-1K) two final states the verifier itself accepts (`awm.predicates.goal_states`), and then the set is
kept only if Phi = 1 exactly on the accepted ones of every state the search built and every recorded
episode's final state (`--episodes`). Candidates met on s0 are kept apart as preservation predicates.
Each record says how it was validated (`validation`) and what its task type rests on (`evidence`).

`--llm` asks an OpenAI-compatible endpoint (`awm.llm.ChatClient`: OPENAI_BASE_URL, OPENAI_API_KEY,
OPENAI_MODEL) for extra predicates; they pass through the same validation, never around it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import json_repair
from tqdm import tqdm

from awm.data import AWMDataset, bundled_data_dir
from awm.database import backup, state_hash
from awm.episode import EnvRuntime
from awm.predicates.goal_states import GoalSearch
from awm.predicates.goal_states import search as search_goal_states
from awm.predicates.predicate import (
    Predicate,
    PredicateError,
    TaskPredicates,
    evaluate,
    extract,
    phi,
    validate,
)
from awm.predicates.tool_labels import task_type
from awm.predicates.verifier_analysis import analyse, traced_run
from awm.solutions import EpisodeFormatError, Solution, episode_paths, load_solutions, read_episodes, replay

log = logging.getLogger(__name__)
MIN_REPLAY_GAP_S = 1.1  # replays A and B at least this far apart: second-resolution clocks differ

LLM_PROMPT = """You turn a task's verifier into intermediate database conditions.
Task: {task}
Database schema (SQLite):
{schema}
Verifier (Python):
{verifier}
Reply with a JSON list of conditions that must hold in the final database when the task is done,
each {{"sql": "<one SELECT>", "check": "exists|not_exists|count_eq|value_eq", "expected": <value or null>}}.
"""


async def _final_state(runtime: EnvRuntime, scenario: str, task_idx: int, calls: list[dict[str, Any]],
                       answer: str | None, dest: Path) -> str:
    """Replay `calls` on a fresh episode, copy its final DB to `dest`, return the verdict."""
    ep = await runtime.open(scenario, task_idx)
    try:
        await replay(ep, calls)
        backup(ep.db_path, dest)
        return (await ep.verify(answer)).verdict
    finally:
        await ep.close()


async def _llm_candidates(client: Any, task: str, schema: str, code: str) -> list[Predicate]:
    """Ask the endpoint for conditions; unparseable or malformed items are skipped."""
    reply = await client.chat([{"role": "user", "content": LLM_PROMPT.format(task=task, schema=schema,
                                                                             verifier=code[:12000])}],
                              temperature=0.0, max_tokens=2048)
    items = json_repair.loads(reply.text)
    out = []
    for item in items if isinstance(items, list) else []:
        try:
            out.append(Predicate.from_dict({"id": "llm", "source": "llm", **item}))
        except (PredicateError, TypeError):
            continue
    return out


MAX_EPISODES_PER_TASK = 8


def load_episodes(paths: list[str]) -> dict[tuple[str, int], list[tuple[list[dict[str, Any]], str | None]]]:
    """Recorded episodes (`awm.solutions.read_episodes`) as (calls, final answer) per task, to check
    predicates on the states they reach. Infrastructure failures are skipped; a line that is not an episode
    record raises ValueError naming the file and line."""
    out: dict[tuple[str, int], list[tuple[list[dict[str, Any]], str | None]]] = {}
    for path in [f for p in paths for f in episode_paths(p)]:
        try:
            for ep in read_episodes(path):
                if not ep.infra_error:
                    out.setdefault((ep.scenario, ep.task_idx), []).append((ep.calls, ep.final_answer))
        except EpisodeFormatError as exc:
            raise ValueError(f"{exc.where}: not an episode record ({exc.problem}); pass trace files of training "
                             "(traces/rollout_*.jsonl) or awm_grpo.eval --out, or {scenario, task_idx, calls, "
                             "final_answer} lines") from None
    return out


class PredicateBuilder:
    """Builds `TaskPredicates` for the tasks of one data directory."""

    def __init__(self, runtime: EnvRuntime, solutions: dict[tuple[str, int], Solution] | None,
                 workdir: Path, llm: Any = None, episodes: dict[tuple[str, int], list] | None = None) -> None:
        self.runtime, self.solutions, self.workdir, self.llm = runtime, solutions or {}, workdir, llm
        self.episodes = episodes or {}

    async def _episode_states(self, scenario: str, idx: int) -> list[tuple[Path, str]]:
        """The final states of the task's recorded episodes, each with the verifier's verdict."""
        out = []
        for n, (calls, answer) in enumerate(self.episodes.get((scenario, idx), [])[:MAX_EPISODES_PER_TASK]):
            dest = self.workdir / f"{scenario}-{idx}-episode{n}.db"
            try:
                verdict = await _final_state(self.runtime, scenario, idx, calls, answer, dest)
            except Exception as exc:  # an episode that cannot be replayed checks nothing
                log.warning("recorded episode %d of %s/%d does not replay: %s", n, scenario, idx, exc)
                continue
            if verdict in ("complete", "others"):
                out.append((dest, verdict))
        return out

    async def build_scenario(self, scenario: str, task_ids: list[int]) -> list[TaskPredicates]:
        s0, _ = self.runtime.template(scenario)
        states: dict[int, dict[str, Any]] = {}
        for idx in task_ids:  # replay A (reference) and the wrong solution
            sol = self.solutions.get((scenario, idx))
            if sol is None:
                continue
            a, w = self.workdir / f"{scenario}-{idx}-A.db", self.workdir / f"{scenario}-{idx}-W.db"
            states[idx] = {"a": a, "w": w, "t": time.monotonic(),
                           "va": await _final_state(self.runtime, scenario, idx, sol.calls, sol.final_answer, a),
                           "vw": await _final_state(self.runtime, scenario, idx, sol.wrong_calls,
                                                    sol.wrong_final_answer, w)}
        for idx, st in states.items():  # replay B, later in time
            wait = MIN_REPLAY_GAP_S - (time.monotonic() - st["t"])
            if wait > 0:
                await asyncio.sleep(wait)
            sol = self.solutions[(scenario, idx)]
            st["b"] = self.workdir / f"{scenario}-{idx}-B.db"
            await _final_state(self.runtime, scenario, idx, sol.calls, sol.final_answer, st["b"])
        return [await self._task(scenario, idx, Path(s0), states.get(idx)) for idx in task_ids]

    async def _task(self, scenario: str, idx: int, s0: Path, st: dict[str, Any] | None) -> TaskPredicates:
        rec = TaskPredicates(scenario, idx, replayed=st is not None)
        row = self.runtime.dataset.verifier(scenario, idx)
        if row is None or not row.code:
            rec.note = "no pure-code verifier"
            return rec
        info = analyse(row.code)
        if info.syntax_error:
            rec.note = f"verifier does not parse: {info.syntax_error}"
            return rec
        sol = self.solutions.get((scenario, idx))
        answer = sol.final_answer if sol else None
        goal: GoalSearch | None = None
        if st is not None:
            a, b = st["a"], st["b"]
        else:  # no reference solution: states the verifier itself accepts (awm.predicates.goal_states)
            try:
                goal = await asyncio.to_thread(search_goal_states, self.runtime.sandbox(), row.code, s0,
                                               self.workdir / f"{scenario}-{idx}-goal", task=row.task)
            except Exception as exc:  # a defect of the search loses this task, not the build
                log.exception("goal-state search failed for %s/%d", scenario, idx)
                rec.note = f"goal-state search failed: {type(exc).__name__}: {exc}"[:300]
                return rec
            a, b = (goal.accepting[0], goal.accepting[1]) if goal.accepting else (None, None)
            answer = goal.answer
        trace = await asyncio.to_thread(traced_run, self.runtime.sandbox(), row.code, str(s0), str(a or s0),
                                        final_answer=answer)
        if trace.status != "ok":
            rec.note = f"traced verifier run failed: {trace.error}"
            return rec
        candidates, dropped = extract(trace.statements, info, s0, a, b, built=goal is not None) \
            if a is not None else ([], Counter())
        if self.llm is not None:
            candidates += await self._llm(scenario, row, "ok" if st is not None else "verifier_states")
        rec.predicates, rec.preservation = validate(candidates, s0, a, b, dropped)
        recorded = await self._episode_states(scenario, idx) if self.episodes else []
        if goal is not None:
            for p in rec.predicates + rec.preservation:
                p.replay = "verifier_states"
            rec.predicates, rec.validation = agree(rec.predicates, goal, dropped, recorded)
        else:  # replayed sets are kept as before; recorded episodes are reported against them
            rec.validation = {"method": "reference_replay", "states_checked": 3 + len(recorded),
                              "recorded_episodes": len(recorded),
                              "recorded_disagree": sum((phi(s, rec.predicates) == 1.0) != (v == "complete")
                                                       for s, v in recorded) if rec.predicates else 0}
        rec.dropped = dict(dropped)
        rec.task_type, rec.evidence = self._type(rec, info, s0, a, goal)
        rec.phi_initial = phi(s0, rec.predicates)
        if st is not None:
            rec.verdict_reference, rec.verdict_wrong = st["va"], st["vw"]
            rec.phi_reference, rec.phi_wrong = phi(a, rec.predicates), phi(st["w"], rec.predicates)
            rec.replay_ok = all(v == 1.0 for v in evaluate(b, rec.predicates + rec.preservation))
        return rec

    async def _llm(self, scenario: str, row: Any, replay: str) -> list[Predicate]:
        """LLM-proposed candidates; they go through the same validation as the extracted ones."""
        sc = self.runtime.dataset.scenario(scenario)
        schema = "\n".join(t.get("ddl", "") for t in (sc.db_schema or {}).get("tables", []))
        try:
            extra = await _llm_candidates(self.llm, row.task, schema, row.code)
        except Exception as exc:  # an unreachable endpoint loses the completion, not the task
            log.warning("LLM completion failed for %s/%d: %s", scenario, row.task_idx, exc)
            return []
        for p in extra:
            p.replay = replay
        return extra

    @staticmethod
    def _type(rec: TaskPredicates, info: Any, s0: Path, a: Path | None, goal: GoalSearch | None) -> tuple[str, str]:
        """The task type and the evidence it rests on (docs/recovery-method.md, Predicates)."""
        if goal is None:
            changed = state_hash(a) != state_hash(s0) if a is not None else None
            kind = task_type(len(rec.predicates), changed, reads_final_answer=info.reads_final_answer,
                             compares_states=info.uses_initial and info.uses_final)
            return kind, "the reference solution's final state" + (" changes" if changed else " keeps") + " the DB"
        if goal.accepting:
            writes = [e for e in goal.edits if e.kind != "answer"]
            if not writes:
                return "info_seeking", "the verifier accepts the initial database, given an answer"
            return "state_mutating", (f"the verifier rejects the initial database and accepts it after {len(writes)} "
                                      f"row edit(s) of {', '.join(sorted({e.table for e in writes}))}"
                                      + ("" if rec.predicates else "; no predicate set agrees with it on every state "
                                         "checked, so none is kept"))
        writes = sorted({e.table for e in goal.partial if e.kind != "answer"})
        if writes:
            return "state_mutating", (f"no accepted state was found, but the verifier got further only after row "
                                      f"edits of {', '.join(writes)} ({goal.reason})")
        if goal.partial and info.reads_final_answer:
            return "info_seeking", (f"its database checks pass on the untouched initial state and it got further only "
                                    f"with an answer; no answer tried was accepted ({goal.reason})")
        kind = task_type(0, None, reads_final_answer=info.reads_final_answer,
                         compares_states=info.uses_initial and info.uses_final)
        why = "reads the final answer and compares the two databases only to check nothing changed" \
            if kind == "info_seeking" else "no edit of the initial state or the answer gets the verifier further"
        return kind, f"{why} ({goal.reason})"


def agree(predicates: list[Predicate], goal: GoalSearch, dropped: Counter[str],
          recorded: list[tuple[Path, str]] = ()) -> tuple[list[Predicate], dict[str, Any]]:
    """Keep the set only if Phi = 1 exactly on the states the verifier accepts, of all the search built
    and all the recorded episodes reached.

    A predicate unmet on an accepted state is too strict and is dropped; if Phi is still 1 on some
    rejected state, the set misses a condition the verifier checks and none is kept.
    """
    checked = list(goal.checked) + list(recorded)
    accepted = [p for p, v in checked if v == "complete"]
    rejected = [p for p, v in checked if v != "complete"]
    if not goal.accepting:  # nothing to take targets from or check a set against: keep none
        dropped["no_accepting_state"] += len(predicates)
        return [], {"method": "verifier_states", "states_checked": len(checked), "agrees": None,
                    "verifier_runs": goal.runs, "reason": goal.reason}
    kept = [p for p in predicates if all(evaluate(s, [p])[0] == 1.0 for s in accepted)]
    dropped["false_on_accepted_state"] += len(predicates) - len(kept)
    report = {"method": "verifier_states", "states_checked": len(checked), "accepted": len(accepted),
              "rejected": len(rejected), "recorded_episodes": len(recorded), "verifier_runs": goal.runs,
              "edits": len(goal.edits), "free_columns": goal.free_columns,
              "second_state_other_donors": goal.second_from_other_donors}
    if not kept:
        return [], {**report, "agrees": None}
    wrong = [str(s.name) for s in rejected if phi(s, kept) == 1.0]
    if wrong:
        dropped["phi_1_on_rejected_state"] += len(kept)
        return [], {**report, "agrees": False, "phi_1_on_rejected": len(wrong)}
    return kept, {**report, "agrees": True}


def coverage(records: list[TaskPredicates]) -> dict[str, Any]:
    """Coverage report: share of tasks with >= 1 predicate, by task type, plus validation figures."""
    def share(rs: list[TaskPredicates], pred: Any) -> dict[str, Any]:
        n = sum(1 for r in rs if pred(r))
        return {"tasks": len(rs), "with": n, "share": round(n / len(rs), 3) if rs else None}

    by_type: dict[str, Any] = {}
    for tt in sorted({r.task_type for r in records}):
        rs = [r for r in records if r.task_type == tt]
        by_type[tt] = {"progress": share(rs, lambda r: r.predicates),
                       "any_including_preservation": share(rs, lambda r: r.predicates or r.preservation)}
    replayed = [r for r in records if r.replayed]
    wrong = [r for r in replayed if r.verdict_wrong != "complete" and r.predicates]
    dropped: Counter[str] = Counter()
    for r in records:
        dropped.update(r.dropped)
    return {
        "tasks": len(records),
        "replayed_tasks": len(replayed),
        "unreplayed_tasks": len(records) - len(replayed),
        "with_progress_predicate": share(records, lambda r: r.predicates),
        "with_any_predicate": share(records, lambda r: r.predicates or r.preservation),
        "by_task_type": by_type,
        "progress_predicates": sum(len(r.predicates) for r in records),
        "preservation_predicates": sum(len(r.preservation) for r in records),
        "scalar_predicates": sum(p.kind == "scalar" for r in records for p in r.predicates),
        "dropped": dict(dropped),
        "reference_phi_is_1": share(replayed, lambda r: r.phi_reference in (None, 1.0)),
        "reference_verdict_complete": share(replayed, lambda r: r.verdict_reference == "complete"),
        "replay_ok": share(replayed, lambda r: r.replay_ok),
        "wrong_solution_phi_below_1": share(wrong, lambda r: r.phi_wrong is not None and r.phi_wrong < 1.0),
        "validated_by": dict(Counter(r.validation.get("method", "none") for r in records if r.predicates)),
        "verifier_states_agree": dict(Counter(str(r.validation.get("agrees")) for r in records
                                              if r.validation.get("method") == "verifier_states")),
        "notes": sorted({r.note for r in records if r.note}),
    }


async def build(data_dir: str | None, *, scenarios: list[str] | None = None, llm: Any = None,
                runtime: EnvRuntime | None = None, use_solutions: bool = True,
                progress: bool = False, episodes: list[str] | None = None) -> list[TaskPredicates]:
    """Predicates for every task with a verifier: from reference replays where solutions exist (and
    `use_solutions`), else from states the verifier accepts (`awm.predicates.goal_states`)."""
    data_dir = data_dir or str(bundled_data_dir())
    try:
        solutions = load_solutions(data_dir) if use_solutions else {}
    except FileNotFoundError:
        solutions = {}
    own = runtime is None
    runtime = runtime or EnvRuntime(data_dir, dataset=AWMDataset(data_dir))
    workdir = Path(tempfile.mkdtemp(prefix="awm-predicates-"))
    try:
        builder = PredicateBuilder(runtime, solutions, workdir, llm, load_episodes(episodes or []))
        keys = runtime.dataset.task_keys(runnable_only=False)
        out = []
        names = [n for n in sorted({s for s, _ in keys}) if not scenarios or n in scenarios]
        with tqdm(total=sum(1 for s, _ in keys if s in names), desc="predicates", unit="task", file=sys.stderr,
                  disable=not progress) as bar:
            for name in names:
                ids = [i for s, i in keys if s == name]
                if runtime.dataset.scenario(name).db_schema is None:
                    out += [TaskPredicates(name, i, note="no gen_db row: no initial DB") for i in ids]
                else:
                    out += await builder.build_scenario(name, ids)
                bar.update(len(ids))
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if own:
            runtime.close()


def write_predicates(records: list[TaskPredicates], path: str | Path) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)


def read_predicates(path: str | Path) -> list[TaskPredicates]:
    """Load and validate a predicates file (schema errors raise PredicateError with the line)."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                out.append(TaskPredicates.from_dict(json.loads(line)))
            except (PredicateError, ValueError, TypeError) as exc:
                raise PredicateError(f"{path}:{n}: {exc}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="awm predicates", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sp = sub.add_parser("build", help="extract, validate and write predicates (JSONL) and print coverage")
    sp.add_argument("--data-dir", help="AWM-1K data directory (default: the bundled scenarios)")
    sp.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    sp.add_argument("--out", required=True, help="predicates JSONL to write")
    sp.add_argument("--llm", action="store_true", help="add LLM-proposed predicates (OPENAI_BASE_URL/_API_KEY/_MODEL); "
                    "they are validated like the extracted ones")
    sp.add_argument("--ignore-solutions", action="store_true",
                    help="do not use reference_solutions.jsonl even if present: targets come from states the verifier "
                         "accepts, as on AWM-1K (to measure that path on data that has solutions)")
    sp.add_argument("--episodes", action="append", default=[], metavar="TRACES.jsonl",
                    help="recorded episodes (training traces, awm_grpo.eval --out, or {scenario, task_idx, calls, "
                    "final_answer} lines; repeatable): their final states are checked too (at most "
                    f"{MAX_EPISODES_PER_TASK} a task)")
    sp = sub.add_parser("coverage", help="print the coverage report of a predicates JSONL")
    sp.add_argument("predicates", help="predicates JSONL file")
    sp.add_argument("--per-task", action="store_true",
                    help="also one line per task: type, predicates, how they were validated, the evidence or note")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.action == "coverage":
        records = read_predicates(args.predicates)
        print(json.dumps(coverage(records), indent=1))
        if args.per_task:
            for r in records:
                v = r.validation
                how = (f"{v.get('method')}: {v.get('states_checked', 0)} states checked, agrees {v.get('agrees')}"
                       if v else "not validated")
                print(f"{r.scenario}/{r.task_idx}\t{r.task_type}\t{len(r.predicates)} progress, "
                      f"{len(r.preservation)} preservation\t{how}\t{r.evidence or r.note}")
        return 0
    llm = None
    if args.llm:
        from awm.llm import ChatClient
        llm = ChatClient(max_concurrency=4)
    try:
        records = asyncio.run(build(args.data_dir, scenarios=args.scenario, llm=llm,
                                    use_solutions=not args.ignore_solutions, progress=True, episodes=args.episodes))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_predicates(records, args.out)
    print(json.dumps(coverage(records), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
