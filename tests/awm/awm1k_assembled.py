"""AWM-format data assembled from public AWM-1K records: `content_platform_1` with verifiers of our own.

The AWM-1K excerpt (`../shared/awm_1k_excerpt`, read in place, never copied into the repository) has,
for `content_platform_1`, the real environment code, schema, sample data, API spec and its 10 tasks,
but no verifiers. `tests/data/content_platform_1/` holds one pure-code verifier per task, written in
the style of upstream's LLM-written verifiers (`verify_task_completion(initial_db_path, final_db_path,
final_answer)`), and a reference and a wrong tool-call solution per task (the bundled format of
`awm.solutions`). `assemble` joins the two into a data directory, so the data has what AWM-1K ships
(plus, optionally, held-out solutions to check predicates built without them).

    python tests/awm/awm1k_assembled.py DEST [--no-solutions]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO.parent / "shared" / "awm_1k_excerpt"
OURS = REPO / "tests" / "data" / "content_platform_1"
SCENARIO = "content_platform_1"
STAGES = ("gen_tasks", "gen_db", "gen_sample", "gen_spec", "gen_envs")


def _scenario_rows(path: Path) -> list[str]:
    """The lines of `path` whose row is SCENARIO's, byte-for-byte (UTF-8; the records hold raw non-ASCII)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.strip() and json.loads(line).get("scenario") == SCENARIO:
            out.append(line if line.endswith("\n") else line + "\n")
    return out


def assemble(dest: str | Path, *, solutions: bool = True, excerpt: Path = EXCERPT) -> Path:
    """Write a data dir at `dest`: the excerpt's content_platform_1 rows, our verifiers (and solutions)."""
    if not excerpt.is_dir():
        raise FileNotFoundError(f"the AWM-1K excerpt is not at {excerpt}: it lives in the shared folder beside "
                                "the repository (CI has it); the assembled data reads it in place")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for stage in STAGES:
        parts = sorted(excerpt.glob(f"{stage}.jsonl")) + sorted(excerpt.glob(f"{stage}.*.jsonl"))
        rows = [row for part in parts for row in _scenario_rows(part)]
        if len(rows) != 1:
            raise ValueError(f"expected one {stage} row of {SCENARIO} in {excerpt}, found {len(rows)}")
        (dest / f"{stage}.jsonl").write_text(rows[0], encoding="utf-8")
    shutil.copyfile(OURS / "gen_verifier.pure_code.jsonl", dest / "gen_verifier.pure_code.jsonl")
    if solutions:
        shutil.copyfile(OURS / "reference_solutions.jsonl", dest / "reference_solutions.jsonl")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", help="directory to write (created if missing)")
    parser.add_argument("--no-solutions", action="store_true", help="leave reference_solutions.jsonl out")
    args = parser.parse_args(argv)
    print(assemble(args.dest, solutions=not args.no_solutions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
