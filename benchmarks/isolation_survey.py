"""Which scenarios need a private module per episode (module state), and what that path costs.

    .venv/bin/python benchmarks/isolation_survey.py [--data-dir DIR ...]

For each scenario with environment code: the module-level names its functions change
(`awm.runtime.isolation.module_state`), whether the code patches shared libraries (refused at load), the
import time in a worker (what a private-module episode pays at every open) and the open latency of
an episode on the shared module.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from awm.data import AWMDataset, bundled_data_dir
from awm.episode import EnvRuntime
from awm.runtime.isolation import module_state
from awm.runtime.pool import EnvLoadError


async def survey(data_dir: Path, cache: Path) -> list[tuple[str, str, str, str, str]]:
    rows = []
    ds = AWMDataset(data_dir, cache_dir=cache)
    with EnvRuntime(dataset=ds, num_workers=1, cache_dir=cache) as rt:
        for name in ds.scenario_names():
            code = ds.scenario(name).full_code
            if not code:
                continue
            state = ", ".join(module_state(code)) or "-"
            try:
                await rt.tools(name)
            except EnvLoadError as exc:
                rows.append((name, state, str(exc)[:60], "-", "-"))
                continue
            slot = next(s for s in rt.pool.slots if name in s.loaded)
            load_s = slot.loaded[name].result()["load_s"]
            opens = []
            for _ in range(20):
                t0 = time.perf_counter()
                ep = await rt.open(name)
                opens.append(time.perf_counter() - t0)
                await ep.close()
            rows.append((name, state, "ok", f"{load_s * 1e3:.0f} ms", f"{statistics.median(opens) * 1e3:.1f} ms"))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", nargs="*", default=None, help="data directories (default: the bundled scenarios)")
    args = p.parse_args()
    dirs = [Path(d) for d in args.data_dir] if args.data_dir else [bundled_data_dir()]
    cache = Path(tempfile.mkdtemp(prefix="awm-survey-"))
    header = ("scenario", "module state", "load", "import (per private open)", "open p50 (shared)")
    print(" | ".join(header))
    for data_dir in dirs:
        for row in asyncio.run(survey(data_dir, cache)):
            print(" | ".join(row))


if __name__ == "__main__":
    main()
