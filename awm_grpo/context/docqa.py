"""Long-document questions made locally from the bundled scenarios' databases, in StateLM's parquet layout.

    python -m awm_grpo.context.docqa --out DIR [--train N] [--val M] [--seed S] [--target-tokens T] [--jsonl]

writes DIR/train.parquet and DIR/val.parquet (and DIR/train.jsonl, DIR/val.jsonl with --jsonl). Each row is
one single-fact lookup over one document:

- The document is a dump of database records, one per line, rendered as text:
      Record 17 (library_lending_1, table members): id: 2 | full_name: Priya Nair | email: priya.nair@...
  Every scenario's initial DB is built from its data (awm.database.build_db, with a fixed clock so that
  timestamps do not depend on the day of the build); a document draws records from all of them, in a
  seeded order, until it is about --target-tokens long (estimated as max(words, characters / 4)). One
  bundled DB alone is only some 2,500 tokens of records, which is why a document mixes scenarios.
- The question asks for one field of one record, naming the record by another of its fields, one whose
  value no other row of that table has (a name, a title, an e-mail, a code):
      In the attached document, what is the email of the members record (database library_lending_1)
      whose full_name is "Priya Nair"?
  Both the answer and the naming value occur exactly once in the document (case-insensitively, as any
  substring): a question that the document could answer two ways is never asked. The asked record is
  placed at a spread of depths (start, middle, end in turn); extra_info.position is where its line starts,
  as a fraction of the document's characters.
- train and val never ask about the same record (scenario, table, row); everything follows from --seed.

The row (StateLM's layout): `data_source` "awm_docqa"; `prompt` [system, user] messages, the user message
the question alone (the document is never in the prompt: the model reaches it through the document tools,
awm_grpo.context.document); `reward_model` {"style": "rule", "ground_truth": the field value};
`document_content` the document; `extra_info` {index, split, question, source (the scenario), position,
data_source, table, row, key_field, key_value, answer_field, doc_records, doc_tokens, seed}.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sqlite3
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_SOURCE = "awm_docqa"
DB_CLOCK = "2026-01-01T00:00:00"  # the DBs' "now": timestamps in the documents do not depend on the build day
DEFAULT_TARGET_TOKENS = 6000
MIN_TARGET_TOKENS = 200
MAX_VALUE_CHARS = 80  # a field longer than this is neither asked for nor used to name a record
MAX_VALUE_WORDS = 10
KEY_HINTS = ("name", "title", "email", "code", "number", "isbn", "sku", "username", "subject", "label", "phone")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SPACE = re.compile(r"\s+")
SPLITS = ("train", "val")


# ---- records --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    """One row of one table of one scenario's DB, as (column, text) pairs (NULL and binary fields left out)."""

    scenario: str
    table: str
    row: int  # 1-based, in the table's rowid order
    fields: tuple[tuple[str, str], ...]

    @property
    def key(self) -> tuple[str, str, int]:
        return self.scenario, self.table, self.row

    def line(self, number: int) -> str:
        body = " | ".join(f"{column}: {value}" for column, value in self.fields)
        return f"Record {number} ({self.scenario}, table {self.table}): {body}"


def _text(value: Any) -> str | None:
    """A field as the document writes it (None: left out)."""
    if value is None or isinstance(value, bytes):
        return None
    return _SPACE.sub(" ", str(value)).strip() or None


def _table_rows(conn: sqlite3.Connection, table: str) -> tuple[list[str], list[tuple]]:
    quoted = '"' + table.replace('"', '""') + '"'
    try:
        cur = conn.execute(f"SELECT * FROM {quoted} ORDER BY rowid")
    except sqlite3.OperationalError:  # a WITHOUT ROWID table: its primary key order
        cur = conn.execute(f"SELECT * FROM {quoted}")
    return [d[0] for d in cur.description], cur.fetchall()


def load_records(data_dir: str | Path | None = None) -> list[Record]:
    """Every record of every scenario's initial DB (the bundled scenarios unless `data_dir`), built afresh."""
    from awm.data import AWMDataset, bundled_data_dir
    from awm.database import build_db

    dataset = AWMDataset(data_dir or bundled_data_dir())
    records: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="awm-docqa-") as tmp:
        for name in dataset.scenario_names():
            scenario = dataset.scenario(name)
            if scenario.db_schema is None:
                continue
            path = Path(tmp) / f"{name}.db"
            build_db(path, scenario.db_schema, scenario.sample_data, scenario=name, clock=DB_CLOCK, seed=0)
            conn = sqlite3.connect(path)
            try:
                tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                                                     "name NOT LIKE 'sqlite_%' ORDER BY rowid")]
                for table in tables:
                    columns, rows = _table_rows(conn, table)
                    for i, row in enumerate(rows, start=1):
                        fields = tuple((c, t) for c, v in zip(columns, row, strict=True)
                                       if (t := _text(v)) is not None)
                        if fields:
                            records.append(Record(name, table, i, fields))
            finally:
                conn.close()
    if not records:
        raise ValueError(f"no database records in {data_dir or 'the bundled scenarios'}: the scenarios need "
                         "gen_db and gen_sample rows")
    return records


def estimate_tokens(text: str) -> int:
    """A tokenizer-free size: the larger of the word count and a quarter of the characters."""
    return max(len(text.split()), math.ceil(len(text) / 4))


# ---- questions ------------------------------------------------------------------------------------

def _id_like(column: str) -> bool:
    c = column.lower()
    return c == "id" or c.endswith("_id") or c == "rowid"


def _answerable(column: str, value: str) -> bool:
    """A field that may be asked for: short, not an id, with a letter or digit in it."""
    return (not _id_like(column) and len(value) <= MAX_VALUE_CHARS and len(value.split()) <= MAX_VALUE_WORDS
            and any(ch.isalnum() for ch in value))


def _keyable(column: str, value: str) -> bool:
    """A field that may name its record in a question: answerable, with a letter, not a date."""
    return _answerable(column, value) and any(ch.isalpha() for ch in value) and not _DATE.search(value) \
        and '"' not in value


def _key_rank(column: str) -> tuple[int, str]:
    c = column.lower()
    return (0 if any(h in c for h in KEY_HINTS) else 1), c


def natural_keys(records: list[Record]) -> dict[tuple[str, str, int], frozenset[str]]:
    """Per record, the columns that may name it: keyable, and holding a value no other row of its table has
    (so the question names one record of the database, not just one of the document)."""
    seen: Counter[tuple[str, str, str, str]] = Counter(
        (r.scenario, r.table, c, v.casefold()) for r in records for c, v in r.fields)
    return {r.key: frozenset(c for c, v in r.fields
                             if _keyable(c, v) and seen[(r.scenario, r.table, c, v.casefold())] == 1)
            for r in records}


def candidates(record: Record, keys: frozenset[str]) -> list[str]:
    """The columns a question about `record` may ask for: some other of its `keys` must be able to name it."""
    return [c for c, v in record.fields if _answerable(c, v) and any(k != c for k in keys)]


def question_text(record: Record, key_field: str, key_value: str, answer_field: str) -> str:
    return (f'In the attached document, what is the {answer_field} of the {record.table} record (database '
            f'{record.scenario}) whose {key_field} is "{key_value}"?')


def split_records(records: list[Record], n_train: int, n_val: int, seed: int) -> dict[str, list[Record]]:
    """The askable records divided between the splits in proportion to the rows asked for (disjoint)."""
    keys = natural_keys(records)
    askable = [r for r in records if candidates(r, keys[r.key])]
    random.Random(f"docqa-split:{seed}").shuffle(askable)
    if n_train + n_val == 0:
        return {"train": [], "val": []}
    n_val_records = round(len(askable) * n_val / (n_train + n_val))
    if n_val and not n_val_records:
        n_val_records = 1
    if n_train and n_val_records >= len(askable):
        n_val_records = len(askable) - 1
    return {"val": askable[:n_val_records], "train": askable[n_val_records:]}


def _count(haystack: str, needle: str) -> int:
    return haystack.count(needle.casefold())


def make_document(asked: Record, pool: list[Record], position: float, target_tokens: int,
                  rng: random.Random) -> tuple[str, float, int]:
    """(document, where the asked record's line starts as a fraction of it, record count): records of `pool`
    in a seeded order until about `target_tokens`, the asked one at about `position` (0..1) of them."""
    others = [r for r in pool if r.key != asked.key]
    rng.shuffle(others)
    chosen: list[Record] = []
    size = estimate_tokens(asked.line(0)) + 1
    for record in others:
        if size >= target_tokens:
            break
        chosen.append(record)
        size += estimate_tokens(record.line(len(chosen))) + 1
    at = min(len(chosen), int(position * (len(chosen) + 1)))
    chosen.insert(at, asked)
    lines = [r.line(i) for i, r in enumerate(chosen, start=1)]
    start = sum(len(line) + 1 for line in lines[:at])
    document = "\n".join(lines)
    return document, round(start / max(1, len(document)), 4), len(chosen)


def build_split(split: str, records: list[Record], pool: list[Record], count: int, seed: int,
                target_tokens: int, progress: Any = None) -> list[dict[str, Any]]:
    """`count` rows asking about `records` (documents drawn from `pool`); ValueError when they run out."""
    from awm_grpo.context.document import DocumentEnv

    natural = natural_keys(pool)
    asks = [(r, c) for r in records for c in candidates(r, natural[r.key])]
    random.Random(f"docqa-order:{seed}:{split}").shuffle(asks)
    rows: list[dict[str, Any]] = []
    for tried, (record, answer_field) in enumerate(asks):
        if len(rows) >= count:
            break
        rng = random.Random(f"docqa-doc:{seed}:{split}:{tried}")
        stratum = len(rows) % 3  # start, middle, end third in turn
        document, position, n_records = make_document(record, pool, (stratum + rng.random()) / 3, target_tokens,
                                                      rng)
        folded = document.casefold()
        values = dict(record.fields)
        answer = values[answer_field]
        if _count(folded, answer) != 1:
            continue
        keys = sorted((c for c, v in record.fields if c != answer_field and c in natural[record.key]
                       and v.casefold() != answer.casefold() and _count(folded, v) == 1), key=_key_rank)
        if not keys:
            continue
        key_field = keys[0]
        question = question_text(record, key_field, values[key_field], answer_field)
        index = len(rows)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "system", "content": DocumentEnv.system_prompt},
                       {"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": answer},
            "document_content": document,
            "extra_info": {"index": index, "split": split, "question": question, "source": record.scenario,
                           "position": position, "data_source": DATA_SOURCE, "table": record.table,
                           "row": record.row, "key_field": key_field, "key_value": values[key_field],
                           "answer_field": answer_field, "doc_records": n_records,
                           "doc_tokens": estimate_tokens(document), "seed": seed},
        })
        if progress is not None:
            progress.update(1)
    if len(rows) < count:
        raise ValueError(f"only {len(rows)} {split} questions could be made from {len(records)} records (each "
                         f"field at most once; {count} asked for): ask for fewer with --{split}, or use a "
                         "larger data set (--data-dir)")
    return rows


def build(n_train: int, n_val: int, seed: int = 0, target_tokens: int = DEFAULT_TARGET_TOKENS,
          data_dir: str | Path | None = None, show_progress: bool = False) -> dict[str, list[dict[str, Any]]]:
    """The rows of both splits (see the module docstring)."""
    if n_train < 0 or n_val < 0 or n_train + n_val == 0:
        raise ValueError(f"--train {n_train} --val {n_val}: give row counts >= 0, at least one of them > 0")
    if target_tokens < MIN_TARGET_TOKENS:
        raise ValueError(f"--target-tokens {target_tokens} is too small for a document: use at least "
                         f"{MIN_TARGET_TOKENS}")
    records = load_records(data_dir)
    total = sum(estimate_tokens(r.line(len(records))) + 1 for r in records)
    if target_tokens > total:
        raise ValueError(f"--target-tokens {target_tokens} is more than all {len(records)} records hold (about "
                         f"{total} tokens): use --target-tokens {total} or less, or a larger data set (--data-dir)")
    parts = split_records(records, n_train, n_val, seed)
    from tqdm import tqdm

    counts = {"train": n_train, "val": n_val}
    with tqdm(total=n_train + n_val, desc="docqa rows", unit="row", delay=1.0,
              disable=not show_progress) as bar:
        return {split: build_split(split, parts[split], records, counts[split], seed, target_tokens, bar)
                if counts[split] else [] for split in SPLITS}


# ---- writing --------------------------------------------------------------------------------------

def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError("writing parquet needs pyarrow, which is not installed: `pip install pyarrow` (it is "
                           "in the project's requirements; reinstall them)") from None
    return pa, pq


def parquet_schema(pa: Any) -> Any:
    """The columns' types (explicit, so that every file has the same schema whatever its rows)."""
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    extra = pa.struct([("index", pa.int64()), ("split", pa.string()), ("question", pa.string()),
                       ("source", pa.string()), ("position", pa.float64()), ("data_source", pa.string()),
                       ("table", pa.string()), ("row", pa.int64()), ("key_field", pa.string()),
                       ("key_value", pa.string()), ("answer_field", pa.string()), ("doc_records", pa.int64()),
                       ("doc_tokens", pa.int64()), ("seed", pa.int64())])
    return pa.schema([("data_source", pa.string()), ("prompt", pa.list_(message)),
                      ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
                      ("document_content", pa.string()), ("extra_info", extra)])


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> None:
    pa, pq = _pyarrow()
    pq.write_table(pa.Table.from_pylist(rows, schema=parquet_schema(pa)), str(path))


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m awm_grpo.context.docqa",
        description="Build long-document lookup questions from the bundled scenarios' databases and write "
                    "them in StateLM's parquet layout (prompt, reward_model, document_content, extra_info): "
                    "OUT/train.parquet and OUT/val.parquet. The document is handed to the document tools, "
                    "never put in the prompt.")
    parser.add_argument("--out", required=True, help="folder to write train.parquet / val.parquet into (created)")
    parser.add_argument("--train", type=int, default=256, help="train rows (default: 256)")
    parser.add_argument("--val", type=int, default=32, help="val rows; 0 writes no val file (default: 32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the record split, the documents' record "
                        "order and the questions (default: 0)")
    parser.add_argument("--target-tokens", type=int, default=DEFAULT_TARGET_TOKENS,
                        help="about how long each document is, in tokens estimated as max(words, chars/4) "
                             f"(default: {DEFAULT_TARGET_TOKENS}: past a 2k-4k context)")
    parser.add_argument("--data-dir", default=None, help="an AWM-1K data directory whose scenarios' DBs to use "
                        "(default: the bundled scenarios)")
    parser.add_argument("--jsonl", action="store_true", help="also write train.jsonl / val.jsonl, the same rows "
                        "one JSON object a line")
    opts = parser.parse_args(argv)
    try:
        _pyarrow()  # fail before the work, not after it
        rows = build(opts.train, opts.val, opts.seed, opts.target_tokens, opts.data_dir, show_progress=True)
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        if not rows[split]:
            continue
        write_parquet(rows[split], out / f"{split}.parquet")
        if opts.jsonl:
            write_jsonl(rows[split], out / f"{split}.jsonl")
        tokens = sum(r["extra_info"]["doc_tokens"] for r in rows[split]) / len(rows[split])
        print(f"wrote {len(rows[split])} {split} rows to {out / f'{split}.parquet'}"
              + (f" (and {split}.jsonl)" if opts.jsonl else "") + f"; documents of ~{tokens:.0f} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
