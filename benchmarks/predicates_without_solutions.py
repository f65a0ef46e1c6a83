"""Predicates built without reference solutions, checked against the solutions they never saw.

    python benchmarks/predicates_without_solutions.py [--data-dir D] [--out predicates.jsonl]

The data must ship `reference_solutions.jsonl` (the bundled scenarios do). The predicates are built
as on AWM-1K (`awm predicates build --ignore-solutions`: targets from states the verifier accepts);
then every reference solution and every wrong solution is replayed through the environment, and on
each final state Phi is compared with the verifier's verdict. Printed: coverage over the tasks whose
reference solution changes the database (the true state-mutating ones), task types against that
truth, and how often Phi = 1 disagrees with the verdict on states the build never saw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from awm.data import AWMDataset, bundled_data_dir
from awm.database import state_hash
from awm.episode import EnvRuntime
from awm.predicates.build import _final_state, build, coverage, write_predicates
from awm.predicates.predicate import phi
from awm.solutions import load_solutions


async def main_async(data_dir: str, out: str | None) -> dict:
    runtime = EnvRuntime(data_dir, dataset=AWMDataset(data_dir))
    work = Path(tempfile.mkdtemp(prefix="awm-pred-bench-"))
    try:
        t0 = time.monotonic()
        records = await build(data_dir, runtime=runtime, use_solutions=False)
        build_s = time.monotonic() - t0
        if out:
            write_predicates(records, out)
        solutions = load_solutions(data_dir)
        agree, disagree = Counter(), []
        mutating, covered, types = 0, 0, Counter()
        for rec in records:
            sol = solutions.get((rec.scenario, rec.task_idx))
            if sol is None:
                continue
            s0, _ = runtime.template(rec.scenario)
            ref, wrong = work / f"{rec.scenario}-{rec.task_idx}-ref.db", work / f"{rec.scenario}-{rec.task_idx}-w.db"
            v_ref = await _final_state(runtime, rec.scenario, rec.task_idx, sol.calls, sol.final_answer, ref)
            v_wrong = await _final_state(runtime, rec.scenario, rec.task_idx, sol.wrong_calls,
                                         sol.wrong_final_answer, wrong)
            truly_mutating = state_hash(ref) != state_hash(s0)
            mutating += truly_mutating
            covered += truly_mutating and bool(rec.predicates)
            types[(("state_mutating" if truly_mutating else "info_seeking"), rec.task_type)] += 1
            if not rec.predicates:
                continue
            for name, state, verdict in (("reference", ref, v_ref), ("wrong", wrong, v_wrong)):
                value = phi(state, rec.predicates)
                ok = (value == 1.0) == (verdict == "complete")
                agree[(name, ok)] += 1
                if not ok:
                    disagree.append({"task": f"{rec.scenario}/{rec.task_idx}", "state": name, "verdict": verdict,
                                     "phi": value})
        report = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "data_dir": data_dir,
            "build_seconds": round(build_s, 1),
            "coverage": coverage(records)["with_progress_predicate"],
            "truly_state_mutating": mutating,
            "truly_state_mutating_with_progress_predicates": covered,
            "types_truth_vs_built": {f"{t}->{b}": n for (t, b), n in sorted(types.items())},
            "phi_agrees_with_verdict_on_unseen_states": {f"{k}:{'agree' if ok else 'disagree'}": n
                                                         for (k, ok), n in sorted(agree.items())},
            "disagreements": disagree,
        }
        return report
    finally:
        runtime.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(bundled_data_dir()))
    parser.add_argument("--out", help="also write the predicates built without solutions here")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(main_async(args.data_dir, args.out)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
