"""Progress credit of a training run: how many state-mutating tasks got R_prog != 0, per step and over the run.

    .venv/bin/python benchmarks/progress_credit.py RUN_DIR [--labels FILE]

Reads the run's trace files (`RUN_DIR/traces/rollout_*.jsonl`, awm_grpo.traces) and applies the same count the
step metrics use (awm_grpo.recovery.metrics.progress_credit, `awm/recovery/progress_*` in metrics.jsonl): per
step, then over the whole run (a task counts as credited when any of its episodes in any step had a write turn
that moved Phi). Task types come from the traces (the data's labels, else the predicates file's own
classification); `--labels FILE` (JSONL rows of scenario, task_idx, task_type, e.g. the bundled
`reference_solutions.jsonl`) overrides them, so a run on data without labels can be scored against known ones.
Prints figures; it is not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from awm_grpo.recovery.metrics import progress_credit
from awm_grpo.recovery.plugin import episode_record
from awm_grpo.traces import read_records


def relabel(records: list[dict[str, Any]], labels: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    return [{**r, "task_type": labels.get((r["scenario"], int(r["task_idx"])), r.get("task_type"))} for r in records]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="a run's save dir (with traces/) or its traces/ folder")
    p.add_argument("--labels", default=None, help="JSONL of {scenario, task_idx, task_type}: task types to use")
    opts = p.parse_args(argv)
    run = Path(opts.run_dir)
    trace_dir = run / "traces" if (run / "traces").is_dir() else run
    files = sorted(trace_dir.glob("rollout_*.jsonl"))
    if not files:
        print(f"no rollout_*.jsonl under {trace_dir}: is it a training run's save dir (or its traces/)?",
              file=sys.stderr)
        return 1
    labels: dict[tuple[str, int], str] = {}
    if opts.labels:
        for line in Path(opts.labels).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                labels[(row["scenario"], int(row["task_idx"]))] = row["task_type"]
    everything = []
    for path in files:
        records = relabel(read_records(trace_dir, path.name), labels)
        everything += records
        m = progress_credit([episode_record(r) for r in records])
        if not m:
            print(f"{path.name}: no progress tracked (the run had no awm_predicates)")
            continue
        print(f"{path.name}: {len(records):3d} episodes | state-mutating tasks {int(m['progress_sm_tasks']):3d} | "
              f"with predicates {int(m['progress_tasks']):3d} | written {int(m['progress_write_tasks']):3d} | "
              f"credited {int(m['progress_credit_tasks']):3d} | "
              f"episodes credited {m.get('progress_credit_episode_rate', float('nan')):.2f}")
    m = progress_credit([episode_record(r) for r in everything])
    if m:
        print(f"whole run ({len(files)} steps, {len(everything)} episodes): state-mutating tasks "
              f"{int(m['progress_sm_tasks'])}, with predicates {int(m['progress_tasks'])}, written to "
              f"{int(m['progress_write_tasks'])}, credited "
              f"{int(m['progress_credit_tasks'])} (of those with predicates "
              f"{m.get('progress_credit_task_rate', float('nan')):.2f}, of all state-mutating "
              f"{m.get('progress_credit_sm_task_rate', float('nan')):.2f}); episodes credited "
              f"{m.get('progress_credit_episode_rate', float('nan')):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
