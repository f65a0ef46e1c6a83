"""The scenario stage: rounds of proposals, de-duplicated by name and optionally by embeddings.

A round asks for `batch` scenarios, shows a few examples (seed file first, then accepted
ones) and the latest accepted names to avoid. A candidate is dropped when its normalised name
is taken (by an accepted scenario or a seed), or, with an embedding model, when the cosine
similarity of its embedded "name: description" to any of those exceeds the threshold:

    cos(u, v) = u . v / (|u| |v|)

Rounds run one after another (each one's avoid list depends on the last) until `count`
scenarios exist or `max_rounds` rounds were spent.
"""

from __future__ import annotations

import math
import random
from typing import Any

from awm.data import normalize_scenario_name, read_jsonl
from awm.gen import prompts
from awm.gen.checks import Invalid
from awm.gen.jobs import Job, StageRun
from awm.gen.records import read_records
from awm.gen.replies import parse_json

MIN_DESCRIPTION_WORDS = 30


def cosine(u: list[float], v: list[float]) -> float:
    dot = sum(a * b for a, b in zip(u, v, strict=True))
    norm = math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v))
    return dot / norm if norm else 0.0


def _candidates(value: Any) -> list[Any]:
    if isinstance(value, dict):  # {"scenarios": [...]} is a common wrapping
        value = next((v for v in value.values() if isinstance(v, list)), None)
    if not isinstance(value, list):
        raise Invalid(['expected a JSON list: [{"name": "...", "description": "..."}, ...]'])
    return value


async def run_scenario_stage(run: StageRun) -> None:
    cfg = run.cfg
    accepted = [{"name": normalize_scenario_name(r["name"]), "description": r.get("description", "")}
                for r in read_records(cfg.path("scenario")) if r.get("name")]
    seeds = [{"name": normalize_scenario_name(str(s["name"])), "description": str(s.get("description", ""))}
             for s in (read_jsonl(cfg.seeds) if cfg.seeds else []) if s.get("name")]
    names = {r["name"] for r in accepted + seeds}  # a copied example is a duplicate too
    run.stats.skipped = len(accepted)
    need = cfg.count - len(accepted)
    if need <= 0:
        return
    vectors: list[list[float]] = []
    if cfg.embedding_model and accepted + seeds:
        vectors = await run.client.embed([f"{r['name']}: {r['description']}" for r in accepted + seeds],
                                         cfg.embedding_model)
    rounds = cfg.max_rounds or 3 * math.ceil(need / cfg.batch)
    run.start_bar(rounds, unit="round")
    made = 0

    async def accept(text: str) -> list[dict[str, Any]]:
        reasons, fresh = [], []
        for item in _candidates(parse_json(text)):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
                reasons.append("every scenario needs a non-empty string 'name'")
                continue
            name, description = normalize_scenario_name(item["name"]), str(item.get("description", "")).strip()
            if len(description.split()) < MIN_DESCRIPTION_WORDS:
                reasons.append(f"scenario {name!r}: the description has {len(description.split())} words, "
                               f"needs {MIN_DESCRIPTION_WORDS}-300")
                continue
            if not name or name in names or name in {f["name"] for f in fresh}:
                run.stats.duplicates += 1
                continue
            fresh.append({"name": name, "description": description})
        if not fresh and reasons:
            raise Invalid(reasons)
        if cfg.embedding_model and fresh:
            embedded = await run.client.embed([f"{f['name']}: {f['description']}" for f in fresh], cfg.embedding_model)
            kept = []
            for record, vector in zip(fresh, embedded, strict=True):
                if any(cosine(vector, other) > cfg.embed_threshold for other in vectors):
                    run.stats.duplicates += 1
                    continue
                vectors.append(vector)
                kept.append(record)
            fresh = kept
        fresh = fresh[: need - made]
        names.update(f["name"] for f in fresh)
        return fresh

    for round_idx in range(rounds):
        if made >= need:
            break
        pool = seeds + accepted
        examples = random.Random(round_idx).sample(pool, min(4, len(pool)))
        avoid = [r["name"] for r in accepted[-20:]]
        prompt = prompts.scenario_prompt(min(cfg.batch, need - made), examples, avoid)
        records = await run.run_job(Job(key=f"round-{len(accepted)}-{round_idx}",
                                        messages=prompts.messages(prompt), accept=accept))
        accepted.extend(records)
        made += len(records)
