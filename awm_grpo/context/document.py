"""Document episodes: a question about a long document the model reaches only through the document tools.

A prompt row in StateLM's layout (`prompt`, `reward_model`, `document_content`, `extra_info`) becomes, through
slime's loader, a sample whose metadata holds the document (`document_content`) and whose label is the
`reward_model` dict. `DocumentEnv` is the episode's environment: `awm_grpo.context.tools.DocumentTools` over
that document, and a grader for the answer given with `finish(answer)`:

    correct    the normalised answer equals the normalised ground truth  -> verdict "complete"
    wrong      a finish call with any other answer                        -> verdict "others"
    no_answer  no finish call (a plain-text reply is not an answer)       -> verdict "others"

The verdict's result carries {"grading": "document_qa", "outcome": ...}; awm_grpo.reward scores a document
episode by that outcome (+1 / -0.5 / -1 by default, StateLM's rule). Normalisation (`normalize_answer`):
surrounding whitespace and quotes and a trailing period dropped, case folded, runs of whitespace made one
space; the match is exact after that (no LLM judge: the questions of awm_grpo.context.docqa have short
field values as answers).

This module never imports awm_grpo.rollout (the rollout imports it to open document episodes).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from awm.verifier import Verdict

from awm_grpo.context.tools import DocumentTools
from awm_grpo.env_client import ToolResult

DOCUMENT_KEY = "document_content"
TARGET_PREFIX = "docqa:"
GRADING = "document_qa"
MAX_REPORTED_CHARS = 2000  # the answer as kept in the verdict's result (traces, metrics)
_QUOTE_PAIRS = {'"': '"', "'": "'", "`": "`", "\u201c": "\u201d", "\u2018": "\u2019", "\u00ab": "\u00bb"}
_SPACE = re.compile(r"\s+")


def document_target(metadata: Mapping[str, Any]) -> tuple[str, int] | None:
    """("docqa:<data_source>", index) of a document-QA row, None for any other row (AWM, AgentGym).

    A row is a document row when its metadata carries `document_content` (the loader copies that column into
    the metadata). The index is extra_info's "index" (0 when the row has none, as StateLM's own rows)."""
    if DOCUMENT_KEY not in metadata:
        return None
    if not isinstance(metadata[DOCUMENT_KEY], str):
        raise ValueError(f"metadata {DOCUMENT_KEY!r} is {type(metadata[DOCUMENT_KEY]).__name__}, not text: a "
                         "document row's document_content column must hold the document as a string")
    index = metadata.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"metadata 'index' of a document row must be an integer >= 0, got {index!r}: write "
                         "extra_info.index as the row's number (python -m awm_grpo.context.docqa does)")
    source = metadata.get("data_source")
    name = source if isinstance(source, str) and source else "document"
    return f"{TARGET_PREFIX}{name}", index


def ground_truth_of(label: Any, metadata: Mapping[str, Any]) -> str:
    """The expected answer of a document row: the label's (reward_model's) "ground_truth" (or the label itself
    when it is a plain string), else the metadata's "ground_truth"."""
    if isinstance(label, str) and label.strip():  # a --label-key naming a plain answer column
        return label
    for where, holder in (("reward_model", label), ("metadata", metadata)):
        if isinstance(holder, Mapping) and holder.get("ground_truth") is not None:
            truth = holder["ground_truth"]
            if isinstance(truth, bool) or not isinstance(truth, str | int | float):
                raise ValueError(f"{where} 'ground_truth' is {type(truth).__name__}, not text: a document row's "
                                 "answer must be one short string")
            return str(truth)
    raise ValueError("a document row has no ground truth: give it a reward_model column "
                     '{"style": "rule", "ground_truth": "<answer>"} (load it with --label-key reward_model), or '
                     "put 'ground_truth' in its extra_info")


def normalize_answer(text: str) -> str:
    """The form answers are compared in (module docstring)."""
    out = _SPACE.sub(" ", text).strip()
    while True:
        before = out
        out = out.removesuffix(".").strip()
        if len(out) >= 2 and _QUOTE_PAIRS.get(out[0]) == out[-1]:
            out = out[1:-1].strip()
        if out == before:
            return out.casefold()


class DocumentEnv:
    """One document episode: an EnvSession (awm_grpo.env_client) whose tools are the document tools."""

    system_prompt: ClassVar[str] = (
        "You are answering a question about a document that is attached to this task. The document is not "
        "shown in the conversation and may be far longer than your context: you can reach it only through the "
        "document tools (look at its size and shape, load it whole if it is small, or split it into chunks "
        "and read or search them). Look up what the question asks in the document itself rather than "
        "guessing. When you have found it, end the episode by calling finish(answer) with the answer in "
        "short form: just the value asked for, exactly as the document writes it, not a sentence. A reply "
        "that does not call finish gives no answer."
    )

    def __init__(self, document: str, ground_truth: str, encode: Callable[[str], list[int]],
                 decode: Callable[[list[int]], str], default_chunk_tokens: int = 4000) -> None:
        if not isinstance(document, str):
            raise ValueError(f"the document must be text, got {type(document).__name__}")
        if not isinstance(ground_truth, str) or not normalize_answer(ground_truth):
            raise ValueError(f"the ground truth must be a non-empty string, got {ground_truth!r}: check the "
                             "row's reward_model.ground_truth")
        self.ground_truth = ground_truth
        self.doc = DocumentTools(document, encode, decode, default_chunk_tokens=default_chunk_tokens)
        self.tools: list[dict[str, Any]] = self.doc.tools
        self.calls = 0

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """One document tool call (pure Python: nothing to await, nothing that can fail as infrastructure)."""
        started = time.perf_counter()
        self.calls += 1
        result = self.doc.call(name, arguments)
        result.latency_s = time.perf_counter() - started
        return result

    @property
    def answer(self) -> str | None:
        """The finish call's answer, None before one (the episode's final answer in traces)."""
        return None if self.doc.answer is None else str(self.doc.answer)

    async def state(self) -> dict[str, Any]:
        """What a turn's trace records: no database here, only whether finish has been called."""
        return {"answered": self.doc.answer is not None, "calls": self.calls}

    def outcome(self) -> str:
        """correct | wrong | no_answer, of the finish call so far."""
        if self.doc.answer is None:
            return "no_answer"
        return "correct" if normalize_answer(str(self.doc.answer)) == normalize_answer(self.ground_truth) \
            else "wrong"

    async def verify(self, final_answer: str | None) -> Verdict:
        """Grade the finish call's answer; `final_answer` (a plain-text reply) is not one and is ignored."""
        started = time.perf_counter()
        outcome = self.outcome()
        answer = None if self.doc.answer is None else str(self.doc.answer)[:MAX_REPORTED_CHARS]
        if outcome == "no_answer":
            detail = "document QA: no finish(answer) call" + (" (the episode ended on a plain-text reply)"
                                                               if final_answer else "")
        else:
            detail = f"document QA: finish({answer[:200]!r}) is {outcome}; the ground truth is " \
                     f"{self.ground_truth[:200]!r}"
        return Verdict("complete" if outcome == "correct" else "others", "code", detail,
                       {"grading": GRADING, "outcome": outcome, "answer": answer, "ground_truth": self.ground_truth},
                       time.perf_counter() - started)

    async def close(self) -> None:
        """Nothing to release: the document lives in this object."""
