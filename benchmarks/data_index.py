"""Data-layer benchmark at AWM-1K scale: index a synthetic 1,000-scenario release, then look up.

    .venv/bin/python benchmarks/data_index.py [--scenarios 1000]

The release is synthesised from the bundled scenarios (each row copied under 1,000 names), so
file sizes are close to AWM-1K's (gen_envs ~100 KB of code per scenario). Prints cold index
time (first scan of every file), warm time (index read from the cache) and one lookup.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from awm.data import AWMDataset, bundled_data_dir

STAGES = ("gen_scenario", "gen_tasks", "gen_db", "gen_sample", "gen_envs", "gen_verifier.pure_code")


def synthesise(out: Path, n: int) -> None:
    src = bundled_data_dir()
    for stage in STAGES:
        rows = [json.loads(line) for line in (src / f"{stage}.jsonl").read_text().splitlines()]
        per_scenario = [r for r in rows if r.get("scenario", r.get("name")) == rows[0].get("scenario", rows[0].get("name"))]
        key = "name" if stage == "gen_scenario" else "scenario"
        with open(out / f"{stage}.jsonl", "w") as fh:
            for i in range(n):
                for row in per_scenario:
                    if stage == "gen_envs":  # pad to AWM-1K's ~100 KB of code per scenario
                        row = {**row, "full_code": row["full_code"] + "\n# padding\n" * 6000}
                    fh.write(json.dumps({**row, key: f"scenario_{i}"}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", type=int, default=1000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data, cache = Path(tmp) / "data", Path(tmp) / "cache"
        data.mkdir()
        synthesise(data, args.scenarios)
        size = sum(f.stat().st_size for f in data.iterdir())
        t = time.perf_counter()
        AWMDataset(data, cache_dir=cache)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        ds = AWMDataset(data, cache_dir=cache)
        warm = time.perf_counter() - t
        name = f"scenario_{args.scenarios // 2}"
        t = time.perf_counter()
        sc, v = ds.scenario(name), ds.verifier(name, 3)
        lookup = time.perf_counter() - t
        assert sc.full_code and v is not None
        print(f"{args.scenarios} scenarios, {size / 1e6:.0f} MB of JSONL")
        print(f"cold index (scan every file once)   {cold:.2f} s")
        print(f"warm (index read from the cache)    {warm:.3f} s")
        print(f"one scenario + verifier lookup      {lookup * 1e3:.2f} ms")
        print(f"tasks with a code verifier          {len(ds.task_keys())}")


if __name__ == "__main__":
    main()
