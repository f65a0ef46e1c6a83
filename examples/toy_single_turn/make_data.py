"""Write the toy prompt files: `python make_data.py OUT_DIR` -> train.jsonl (64) and eval.jsonl (8)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

TEMPLATES = (
    "Answer with digits only. Write the digit {d} as many times as you can.",
    "Output the number {d}{d}{d}, nothing else.",
    "Count in digits, using mostly {d}.",
    "Reply with a number made of the digit {d}.",
)


def rows(count: int, offset: int) -> list[dict[str, str]]:
    out = []
    for i in range(offset, offset + count):
        digit = str(i % 10)
        out.append({"input": TEMPLATES[i % len(TEMPLATES)].format(d=digit), "label": digit})
    return out


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, count, offset in (("train.jsonl", 64, 0), ("eval.jsonl", 8, 1000)):
        with open(out / name, "w") as f:
            for row in rows(count, offset):
                f.write(json.dumps(row) + "\n")
    print(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data")
