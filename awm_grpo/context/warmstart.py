"""Warm starts for the document task: a scripted teacher played through the real context-managed rollout.

    python -m awm_grpo.context.warmstart --prompts runs/awm_grpo/docqa/train.parquet --style managed \\
        --base runs/awm_grpo/methods_ps/ws0 --out runs/awm_grpo/docqa_ws_managed [--limit L --reserve R ...]

StateLM's pipeline fine-tunes on tool-using trajectories before RL; the plain pipeline on trajectories without
the memory tools. This module makes both kinds from document rows (awm_grpo.context.docqa), as
awm_grpo.warmstart.sft does for AWM tasks: every row is played by `awm_grpo.rollout.play` with the managed turn
loop (`awm_grpo.context.loop.play_managed`, meta tool mode as the CPU profile) and a *teacher* policy in place
of the engine. The teacher reads what the tools returned (it decodes the context it is given and parses the
last tool result), so each reply is written for the episode as it went:

    plain     buildIndex(chunk_size, overlap) -> searchEngine(the record's naming value and the asked field)
              -> readChunk(the top chunk) -> finish(the asked field, read off that chunk's record line)
    managed   buildIndex -> searchEngine -> "Chunk k ranks first." + deleteContext(the search result)
              -> readChunk(k) -> finish(...)    (the memory tools on: context.tools)

The managed teacher drops the search result (the bulky observation: several chunks' highlights) once it has
written down which chunk to read, so the chunk never shares the context with the search result; the plain one
holds both at once. It keeps the chunk id in its own reply's text rather than in a note: a note turn costs
more context than it saves here. An episode whose top chunk does not hold the record line, or that the verifier
does not grade correct, is dropped. Every sample an episode makes is trained on (the snapshot a
deletion closes and the last one: each a prompt and a response with its loss mask) with the masked next-token
loss of awm_grpo.warmstart.sft (its `sft` and `Episodes`, as they are).
Each kept episode's `need` (the largest context the engine was given, plus the reserve: the smallest context
limit it fits) is printed and written to OUT/warmstart.json, which is how the study's limit is chosen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from awm_grpo.context.loop import play_managed
from awm_grpo.rollout import TRUNCATION_MARKER, Policy, play
from slime.utils.types import Sample

logger = logging.getLogger("awm_grpo.context.warmstart")

STYLES = ("plain", "managed")
UNLIMITED = 1 << 30  # the context limit when none is given: every episode fits
RESPONSE_TAG = "<tool_response>\n"


def call(tool: str, **arguments: Any) -> str:
    """One meta-protocol reply calling `tool` (call_tool), as the model must write it."""
    body = {"name": "call_tool", "arguments": {"tool_name": tool, "arguments": arguments}}
    return "<tool_call>\n" + json.dumps(body, ensure_ascii=False) + "\n</tool_call>"


def last_tool_result(context: str) -> dict[str, Any] | None:
    """The last tool result in a decoded context (its JSON with msg_id), None when there is none yet."""
    at = context.rfind(RESPONSE_TAG)
    if at < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(context, at + len(RESPONSE_TAG))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def answer_in(text: str, key_field: str, key_value: str, answer_field: str) -> str | None:
    """The `answer_field` of the record line holding `key_field: key_value` in `text` (None: no such line,
    e.g. the chunk cut the record)."""
    for line in text.splitlines():
        if not re.search(rf"(?:: | \| ){re.escape(key_field)}: {re.escape(key_value)}(?: \| |$)", line):
            continue
        found = re.search(rf"(?:: | \| ){re.escape(answer_field)}: (.*?)(?: \| |$)", line)
        if found:
            return found.group(1)
    return None


@dataclass
class DocTeacher:
    """The scripted agent of one document row (module docstring); a `Policy` for awm_grpo.rollout.play.

    It sees only what the engine would see: the token ids of the context, which it decodes. `gave_up` says
    why it stopped early (the episode is then dropped); `contexts` records the length of every context it
    was given (the episode's need is the largest plus the reserve)."""

    tokenizer: Any
    style: str
    key_field: str
    key_value: str
    answer_field: str
    chunk_size: int = 256
    overlap: int = 64
    search_size: int = 8
    fragment_size: int = 120
    num_fragments: int = 3
    contexts: list[int] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    gave_up: str | None = None
    _step: str = "start"
    _search_msg: int | None = None
    _chunk: int | None = None
    _last_chunk: int | None = None

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"style {self.style!r} is unknown: use one of {', '.join(STYLES)}")
        self.end_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def next_reply(self, context: str) -> str:
        """The reply to the context as it stands (the state machine of the module docstring)."""
        result = last_tool_result(context)
        if self._step == "start":
            self._step = "index"
            return call("buildIndex", chunk_size=self.chunk_size, **({"overlap": self.overlap} if self.overlap else {}))
        if self._step == "index":
            self._step = "search"
            last = (result or {}).get("last_chunk_id")
            self._last_chunk = last if isinstance(last, int) else None
            return call("searchEngine", keyword=f"{self.key_value}, {self.answer_field}", size=self.search_size,
                        fragment_size=self.fragment_size, num_fragments=self.num_fragments)
        if self._step == "search":
            chunk = top_chunk(result)
            if chunk is None:
                return self.give_up(f"the search found no chunk: {str(result)[:200]}")
            self._chunk, self._search_msg = chunk, int(result["msg_id"])
            if self.style == "plain":
                self._step = "read"
                return call("readChunk", chunk_id=chunk)
            self._step = "deleted"  # the chunk id stays in this reply's text: the search result can go
            return f"Chunk {chunk} ranks first.\n" + call("deleteContext", msg_id=self._search_msg)
        if self._step == "deleted":
            self._step = "read"
            return call("readChunk", chunk_id=self._chunk)
        if self._step == "read":
            text = chunk_text(result, self._last_chunk)
            answer = answer_in(text, self.key_field, self.key_value, self.answer_field) if text else None
            if answer is None:
                return self.give_up(f"chunk {self._chunk} does not hold the line of {self.key_value!r}")
            self._step = "done"
            return call("finish", answer=answer)
        return self.give_up("the episode went on after finish")

    def give_up(self, why: str) -> str:
        self.gave_up = self.gave_up or why
        self._step = "gave_up"
        return "I cannot find it."

    async def __call__(self, input_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        self.contexts.append(len(input_ids))
        text = self.next_reply(self.tokenizer.decode(input_ids))
        self.replies.append(text)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.end_id]
        limit = params.get("max_new_tokens", len(ids))
        if len(ids) > limit:  # the reply does not fit a turn: the episode must not be trained on
            self.gave_up = self.gave_up or f"a reply of {len(ids)} tokens is over the turn cap {limit}"
            finish = {"type": "length"}
            ids = ids[:limit]
        else:
            finish = {"type": "stop"}
        return {"meta_info": {"output_token_logprobs": [[0.0, i, None] for i in ids], "finish_reason": finish,
                              "weight_version": "teacher"}}


def top_chunk(result: dict[str, Any] | None) -> int | None:
    """The first chunk id of a searchEngine result (also when the result was cut to the observation cap)."""
    if not result:
        return None
    chunks = result.get("retrieved_chunks")
    if isinstance(chunks, list) and chunks and isinstance(chunks[0], dict) and "chunk_id" in chunks[0]:
        return int(chunks[0]["chunk_id"])
    found = re.search(r'"chunk_id": (\d+)', str(result.get("result", "")))
    return int(found.group(1)) if found else None


def chunk_text(result: dict[str, Any] | None, last_chunk: int | None) -> str | None:
    """The whole lines of a readChunk result: a line the chunk's end (or the observation cap) cut is left out,
    so that a value cut short is never read as the answer. The last chunk of the index ends the document."""
    if not result:
        return None
    chunk = result.get("retrieved_chunk")
    if isinstance(chunk, list) and chunk and isinstance(chunk[0], dict):
        text = str(chunk[0].get("content", ""))
        ends_document = last_chunk is not None and chunk[0].get("chunk_id") == last_chunk
    elif isinstance(result.get("result"), str):  # cut to the observation cap: the JSON text up to the cut
        text, ends_document = result["result"], False
        text = text[: text.rfind(TRUNCATION_MARKER.split("{n}")[0])].replace("\\n", "\n").replace('\\"', '"')
    else:
        return None
    if not ends_document and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return text


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a document-QA prompt file (parquet or JSONL, StateLM's layout)."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: build it with `python -m awm_grpo.context.docqa --out DIR`")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(str(path)).to_pylist()
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        missing = [k for k in ("prompt", "reward_model", "document_content", "extra_info") if k not in row]
        if missing or not all(k in row["extra_info"] for k in ("key_field", "key_value", "answer_field")):
            raise SystemExit(f"{path} row {i} is not a document-QA row of awm_grpo.context.docqa (missing "
                             f"{missing or 'extra_info key_field/key_value/answer_field'}): rebuild the file")
    return rows


def row_sample(row: dict[str, Any], index: int) -> Sample:
    """A row as slime's loader gives it (--input-key prompt --label-key reward_model --metadata-key extra_info
    --extra-metadata-keys document_content data_source)."""
    meta = {**row["extra_info"], "document_content": row["document_content"], "data_source": row.get("data_source")}
    return Sample(index=index, group_index=index, prompt=list(row["prompt"]), label=dict(row["reward_model"]),
                  metadata=meta)


def rollout_args(base: str, style: str, limit: int | None, reserve: int, max_turns: int = 10,
                 max_observation_tokens: int = 256) -> argparse.Namespace:
    """slime args for teacher episodes, with the runtime YAML's awm_* keys as the CPU profile and the study set
    them: meta tool mode, `reserve` tokens a turn, results cut to `max_observation_tokens`, snapshot samples."""
    from slime.arguments import parse_args

    args = parse_args(["--hf-checkpoint", base, "--prompt-data", "unused.jsonl", "--rollout-batch-size", "1",
                       "--num-rollout", "1", "--rollout-max-response-len", "4096"])
    settings = {"tool_mode": "meta", "max_turns": max_turns, "max_tokens_per_turn": reserve,
                "max_observation_tokens": max_observation_tokens, "enable_thinking": False, "env_workers": 1,
                "context_tools": style == "managed", "context_limit": limit or UNLIMITED, "context_reserve": reserve,
                "context_samples": "snapshot", "context_max_samples": 8, "trace_dir": None}
    for key, value in settings.items():
        setattr(args, f"awm_{key}", value)
    return args


@dataclass
class Played:
    """One teacher episode: its samples (last first) and what it needed."""

    samples: list[Sample]
    need: int  # the smallest context limit it fits: the largest context it was given plus the reserve
    outcome: str
    why: str | None = None  # why it is dropped (None: kept)
    replies: list[str] = field(default_factory=list)  # the teacher's, in order


async def play_row(args: argparse.Namespace, row: dict[str, Any], index: int, style: str,
                   teacher_opts: dict[str, Any] | None = None) -> Played:
    """Play one row with the teacher through the real managed rollout."""
    from slime.rollout.sglang_rollout import GenerateState

    tokenizer = GenerateState(args).tokenizer
    info = row["extra_info"]
    teacher = DocTeacher(tokenizer, style, str(info["key_field"]), str(info["key_value"]),
                         str(info["answer_field"]), **(teacher_opts or {}))
    policy: Policy = teacher
    segments: list[Sample] = []
    final = await play(args, row_sample(row, index), {"max_new_tokens": args.awm_context_reserve}, policy,
                       segments=segments, body=play_managed)
    awm = final.metadata["awm"]
    outcome = (awm.get("verifier_result") or {}).get("outcome") or awm.get("verdict") or "none"
    why = teacher.gave_up or (None if outcome == "correct" else f"{outcome} ({awm.get('stop_reason')})")
    need = max(teacher.contexts, default=0) + args.awm_context_reserve
    return Played([final, *segments], need, outcome, why, list(teacher.replies))


async def collect(args: argparse.Namespace, rows: list[dict[str, Any]], style: str,
                  teacher_opts: dict[str, Any] | None = None) -> tuple[list[Played], list[Played]]:
    """Every row played; (kept: correct and the teacher never gave up, dropped)."""
    kept, dropped = [], []
    for i, row in enumerate(rows):
        played = await play_row(args, row, i, style, teacher_opts)
        (dropped if played.why else kept).append(played)
    return kept, dropped


def describe(needs: Iterable[int]) -> dict[str, float]:
    values = sorted(needs)
    if not values:
        return {}
    return {"episodes": len(values), "min": values[0], "median": statistics.median(values),
            "p90": values[int(0.9 * (len(values) - 1))], "max": values[-1]}


def share_fitting(needs: list[int], limit: int) -> float:
    return sum(n <= limit for n in needs) / len(needs) if needs else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.context.warmstart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", required=True, help="document-QA rows (awm_grpo.context.docqa's train.parquet)")
    parser.add_argument("--style", required=True, choices=STYLES, help="plain: document tools only; managed: "
                        "with the memory tools, the search result deleted once its top chunk is written down")
    parser.add_argument("--base", required=True, help="HF model folder to fine-tune (it must know the meta protocol, "
                        "e.g. the AWM warm start runs/awm_grpo/methods_ps/ws0)")
    parser.add_argument("--out", help="where to write the fine-tuned HF folder (omit with --measure-only)")
    parser.add_argument("--limit", type=int, default=None, help="context limit the teacher plays under; episodes "
                        "that do not fit are dropped (default: none, every episode fits; its need is printed)")
    parser.add_argument("--reserve", type=int, default=128, help="tokens kept for a turn, its cap (the CPU profile's "
                        "max_tokens_per_turn, 128)")
    parser.add_argument("--max-observation-tokens", type=int, default=256, help="as the CPU profile")
    parser.add_argument("--chunk-size", type=int, default=256, help="the teacher's buildIndex chunk_size (tokens)")
    parser.add_argument("--overlap", type=int, default=64, help="the teacher's buildIndex overlap (tokens)")
    parser.add_argument("--search-size", type=int, default=8, help="the teacher's searchEngine size")
    parser.add_argument("--fragment-size", type=int, default=120, help="the teacher's searchEngine fragment_size")
    parser.add_argument("--num-fragments", type=int, default=3, help="the teacher's searchEngine num_fragments")
    parser.add_argument("--tasks", type=int, default=None, help="play only the first N rows")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--measure-only", action="store_true", help="play and print the needs; train nothing")
    parser.add_argument("--fits", type=int, nargs="*", default=[], metavar="L",
                        help="also print the share of kept episodes that fit these limits")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not opts.measure_only and not opts.out:
        raise SystemExit("--out is required (or --measure-only)")
    if opts.limit is not None and opts.limit <= opts.reserve:
        raise SystemExit(f"--limit {opts.limit} must be larger than --reserve {opts.reserve}")
    import torch

    torch.manual_seed(opts.seed)
    torch.set_num_threads(opts.threads)
    rows = read_rows(opts.prompts)[: opts.tasks]
    args = rollout_args(opts.base, opts.style, opts.limit, opts.reserve,
                        max_observation_tokens=opts.max_observation_tokens)
    teacher_opts = {"chunk_size": opts.chunk_size, "overlap": opts.overlap, "search_size": opts.search_size,
                    "fragment_size": opts.fragment_size, "num_fragments": opts.num_fragments}
    started = time.perf_counter()
    kept, dropped = asyncio.run(collect(args, rows, opts.style, teacher_opts))
    whys: dict[str, int] = {}
    for p in dropped:
        reason = re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'...'", p.why or ""))[:120]
        whys[reason] = whys.get(reason, 0) + 1
    needs = [p.need for p in kept]
    samples = [s for p in kept for s in p.samples]
    summary = {"style": opts.style, "rows": len(rows), "kept": len(kept), "dropped": len(dropped),
               "dropped_why": whys, "samples": len(samples), "need": describe(needs),
               "fits": {str(limit): share_fitting(needs, limit) for limit in opts.fits},
               "teacher": teacher_opts, "limit": opts.limit, "reserve": opts.reserve,
               "played_s": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary, indent=1), flush=True)
    if opts.measure_only:
        return 0
    if not kept:
        raise SystemExit("no teacher episode was graded correct: nothing to fine-tune on")
    from transformers import AutoModelForCausalLM

    from awm_grpo.warmstart.sft import Episodes, sft
    from slime.rollout.sglang_rollout import GenerateState

    episodes = Episodes(None, 0, UNLIMITED)  # no renamed copies: every sample of every kept episode, as played
    episodes.real = samples
    model = AutoModelForCausalLM.from_pretrained(opts.base, dtype=torch.float32)
    losses = sft(model, episodes, epochs=opts.epochs, lr=opts.lr, seed=opts.seed, batch_size=opts.batch_size)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    GenerateState(args).tokenizer.save_pretrained(out)
    record = {**summary, "base": opts.base, "epochs": opts.epochs, "lr": opts.lr, "batch_size": opts.batch_size,
              "seed": opts.seed, "losses": losses, "tokens": sum(len(s.tokens) for s in samples),
              "trained_tokens": sum(sum(s.loss_mask or []) for s in samples)}
    (out / "warmstart.json").write_text(json.dumps(record, indent=1))
    logger.info("saved %s (loss %.3f -> %.3f)", out, losses[0], losses[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
