"""StateLM's eleven context-management tools, as two pure-Python tool sets.

`DocumentTools` gives the model a long document it never sees whole: it measures it (analyzeText), may load it
(loadDocument), cuts it into token windows (buildIndex), reads one window (readChunk), ranks windows for
keywords with BM25 (searchEngine) and submits its answer (finish). `MemoryTools` keeps notes across deletions
(note, readNote, updateNote), reports the budget (checkBudget) and asks for old messages to be replaced by a
stub (deleteContext); the episode loop owns the history and the budget, so both arrive as callables.

Every tool returns a JSON string. An agent's mistake (a missing, ill-typed or out-of-range argument, an
unknown note or tool) is an error observation -- `{"error": "<what to do>"}` with `is_error=True` -- never an
exception, and every argument is bounded (the caps below), so no call can make the tools use unbounded
memory or time. Nothing here does I/O; the same calls on the same document give the same results.

Departures from StateLM (which searches with Elasticsearch): search runs in-process, BM25 over lower-cased
word tokens; a keyword of several words matches a chunk holding all its words (anywhere in the chunk, not as
a phrase); chunk edges move forward by up to 3 tokens rather than split a UTF-8 character; the last chunk of
an index ends at the document's end, so no chunk lies wholly inside the one before it; unknown argument names
and a blank answer are errors rather than ignored.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from awm_grpo.env_client import ToolResult

STUB = "Content has been deleted to save space."
DOCUMENT_TOOL_NAMES = ("analyzeText", "loadDocument", "buildIndex", "readChunk", "searchEngine", "finish")
MEMORY_TOOL_NAMES = ("checkBudget", "note", "readNote", "updateNote", "deleteContext")

FILE_NAME = "attached_document.txt"  # what analyzeText calls the document

# Caps: what one call may ask for. Each keeps memory and time bounded whatever the arguments are.
MAX_KEY_CHARS = 128
MAX_SUMMARY_CHARS = 512
MAX_CONTENT_BYTES = 16 * 1024  # a note's content, as UTF-8 JSON
MAX_NOTES = 256
MAX_JSON_DEPTH = 32  # nesting of a note's content
MAX_KEYWORD_CHARS = 512
MAX_KEYWORDS = 32
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 16, 32768
MAX_CHUNKS = 4096
MIN_INDEX_TOKENS = 65536  # an index may hold max(this, INDEX_TOKENS_FACTOR x document) tokens in all
INDEX_TOKENS_FACTOR = 4
MAX_SEARCH_SIZE = 50
DEFAULT_SEARCH_SIZE = 20
MIN_FRAGMENT_CHARS, MAX_FRAGMENT_CHARS, DEFAULT_FRAGMENT_CHARS = 20, 1000, 180
MAX_FRAGMENTS, DEFAULT_FRAGMENTS = 10, 3
MAX_ANSWER_CHARS = 16 * 1024
MAX_MSG_ID = 10**9
_MAX_INT_TEXT = 20  # longest numeral accepted where an integer is expected

# BM25 (Robertson/Sparck Jones, with Lucene's non-negative idf), for a chunk d and a query term t:
#   idf(t)      = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5))
#   score(t, d) = idf(t) * f(t,d) * (K1 + 1) / (f(t,d) + K1 * (1 - B + B * |d| / avgdl))
# N chunks, n(t) chunks holding t, f(t,d) occurrences of t in d, |d| word tokens in d, avgdl their mean.
# A chunk's score is the sum of score(t, d) over the terms of every keyword it matches.
BM25_K1 = 1.2
BM25_B = 0.75

_WORD = re.compile(r"\w+")
_INTEGER = re.compile(r"[+-]?\d+")
_REPLACEMENT = "\ufffd"


class _ArgError(Exception):
    """An agent mistake: becomes an error observation in `call`, never leaves this module."""

    def __init__(self, message: str, kind: str = "invalid_arguments") -> None:
        super().__init__(message)
        self.kind = kind


def _ok(payload: dict[str, Any], done: bool = False) -> ToolResult:
    return ToolResult(json.dumps(payload, ensure_ascii=False), False, "ok", done=done)


def _error(message: str, kind: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}, ensure_ascii=False), True, kind)


def _clip(text: str, limit: int = 64) -> str:
    """A name the agent wrote, shortened for an error message."""
    return text if len(text) <= limit else text[:limit] + "..."


def _check_text(value: str, name: str) -> str:
    """Reject lone surrogates: they cannot be encoded, so no tokenizer could read the observation back."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _ArgError(f"{name} holds an invalid character (a lone surrogate): write plain text") from None
    return value


def _schema(properties: dict[str, dict[str, Any]], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


def _entry(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "description": description, "inputSchema": schema}


class _Arguments:
    """One call's arguments, read with types and bounds checked; unknown names are mistakes."""

    def __init__(self, tool: str, arguments: Any, allowed: tuple[str, ...]) -> None:
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise _ArgError(f"{tool} takes a JSON object of named arguments, not {type(arguments).__name__}")
        unknown = next((k for k in arguments if k not in allowed), None)
        if unknown is not None:
            takes = ", ".join(allowed) if allowed else "no arguments"
            raise _ArgError(f"{tool} has no argument {_clip(str(unknown))!r}; it takes {takes}")
        self.tool = tool
        self.values = arguments

    def present(self, name: str) -> bool:
        return self.values.get(name) is not None

    def integer(self, name: str, lo: int, hi: int, default: int | None = None) -> int:
        value = self.values.get(name)
        if value is None:
            if default is None:
                raise _ArgError(f"{self.tool} needs {name}: an integer from {lo} to {hi}")
            return default
        number: int | None = None
        if isinstance(value, bool):
            number = None
        elif isinstance(value, int):
            number = value
        elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
            number = int(value)
        elif isinstance(value, str) and len(value) <= _MAX_INT_TEXT and _INTEGER.fullmatch(value.strip()):
            number = int(value.strip())
        if number is None:
            raise _ArgError(f"{name} must be an integer from {lo} to {hi}")
        if not lo <= number <= hi:
            shown = str(number) if abs(number) < 10**_MAX_INT_TEXT else "a number that large"
            raise _ArgError(f"{name} must be from {lo} to {hi}, not {shown}")
        return number

    def text(self, name: str, max_chars: int, required: bool = True, default: str = "") -> str:
        value = self.values.get(name)
        if value is None:
            if required:
                raise _ArgError(f"{self.tool} needs {name}: a string of at most {max_chars} characters")
            return default
        if not isinstance(value, str):
            raise _ArgError(f"{name} must be a string of at most {max_chars} characters")
        if len(value) > max_chars:
            raise _ArgError(f"{name} is {len(value)} characters long; write at most {max_chars}")
        return _check_text(value, name)


def _json_value(value: Any, name: str, max_bytes: int) -> tuple[Any, str]:
    """(value, its JSON text) for a JSON-able value no bigger than max_bytes, checked without recursion.

    The walk charges each item a lower bound of its JSON size and stops as soon as the bound passes max_bytes,
    so a huge value costs no more than a small one; the exact size is measured once the walk accepts it.
    """
    budget = max_bytes
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _ArgError(f"{name} is nested more than {MAX_JSON_DEPTH} levels deep: flatten it")
        if isinstance(item, str):
            budget -= len(item) + 2
            if budget >= 0:
                _check_text(item, name)
        elif item is None or isinstance(item, bool):
            budget -= 4
        elif isinstance(item, int):
            if abs(item) >= 2**63:
                raise _ArgError(f"{name} holds an integer too large to store: write it as text")
            budget -= len(str(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _ArgError(f"{name} holds a number that is not finite: write it as text")
            budget -= len(repr(item))
        elif isinstance(item, list):
            budget -= 1 + len(item)
            stack.extend((child, depth + 1) for child in item[: max(budget, 0) + 1])
        elif isinstance(item, dict):
            budget -= 1 + len(item)
            for key, child in itertools.islice(item.items(), max(budget, 0) + 1):
                if not isinstance(key, str):
                    raise _ArgError(f"{name} has a non-string object key: JSON keys are strings")
                budget -= len(key) + 3
                if budget >= 0:
                    _check_text(key, name)
                stack.append((child, depth + 1))
        else:
            raise _ArgError(f"{name} must be JSON (text, numbers, lists, objects), not {type(item).__name__}")
        if budget < 0:
            break
    if budget >= 0:
        encoded = json.dumps(value, ensure_ascii=False)
        if len(encoded.encode("utf-8")) <= max_bytes:
            return value, encoded
    raise _ArgError(f"{name} is larger than {max_bytes} bytes as JSON: keep only what you need")


def _as_text(value: Any) -> str:
    """A note's content as text: strings stay as they are, anything else becomes its JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _dispatch(handlers: dict[str, Callable[[_Arguments], ToolResult]], allowed: dict[str, tuple[str, ...]],
              family: str, name: Any, arguments: Any) -> ToolResult:
    """One call of a tool set: its handler on checked arguments, or the error observation."""
    handler = handlers.get(name) if isinstance(name, str) else None
    if handler is None:
        return _error(f"there is no tool {_clip(str(name))!r}; the {family} tools are {', '.join(handlers)}",
                      "unknown_tool")
    try:
        return handler(_Arguments(name, arguments, allowed[name]))
    except _ArgError as exc:
        return _error(str(exc), exc.kind)


class DocumentTools:
    """analyzeText, loadDocument, buildIndex, readChunk, searchEngine and finish over one document.

    Tokens are the model's (`encode`/`decode`), so sizes and chunk windows mean what the model's context
    means. The document is tokenized once, on first need; buildIndex may be called again with other sizes
    and replaces the index. `answer` is the text of the last finish call (None until then).
    """

    def __init__(self, document: str, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                 default_chunk_tokens: int = 4000) -> None:
        if not isinstance(document, str):
            raise TypeError(f"document must be a str, not {type(document).__name__}")
        if not callable(encode) or not callable(decode):
            raise TypeError("encode and decode must be callables: str -> list[int] and list[int] -> str")
        if isinstance(default_chunk_tokens, bool) or not isinstance(default_chunk_tokens, int) \
                or not MIN_CHUNK_TOKENS <= default_chunk_tokens <= MAX_CHUNK_TOKENS:
            raise ValueError(f"default_chunk_tokens must be an int from {MIN_CHUNK_TOKENS} to {MAX_CHUNK_TOKENS}, "
                             f"not {default_chunk_tokens!r}")
        self.document = document
        self.encode = encode
        self.decode = decode
        self.default_chunk_tokens = default_chunk_tokens
        self.answer: str | None = None
        self.chunks: list[dict[str, Any]] = []  # the index: {"chunk_id", "content", "start_pos", "end_pos"}
        self._ids: list[int] | None = None
        self._indexed = False
        self._postings: dict[str, dict[int, int]] = {}  # term -> {chunk_id: occurrences}
        self._lengths: list[int] = []  # word tokens per chunk
        self._handlers: dict[str, Callable[[_Arguments], ToolResult]] = {
            "analyzeText": self._analyze_text, "loadDocument": self._load_document,
            "buildIndex": self._build_index, "readChunk": self._read_chunk,
            "searchEngine": self._search_engine, "finish": self._finish}
        self._allowed: dict[str, tuple[str, ...]] = {
            "analyzeText": (), "loadDocument": (), "buildIndex": ("chunk_size", "overlap"),
            "readChunk": ("chunk_id",), "searchEngine": ("keyword", "mode", "size", "fragment_size", "num_fragments"),
            "finish": ("answer",)}
        self.tools: list[dict[str, Any]] = self._tool_entries()
        self.names: frozenset[str] = frozenset(DOCUMENT_TOOL_NAMES)

    def _tool_entries(self) -> list[dict[str, Any]]:
        integer = "integer"
        return [
            _entry("analyzeText", "Report the attached document's file name and its length in tokens.", _schema({})),
            _entry("loadDocument", "Return the whole attached document at once. Long documents can overflow "
                   "your context: prefer buildIndex with readChunk or searchEngine.", _schema({})),
            _entry("buildIndex", "Cut the document into windows of chunk_size tokens, consecutive windows "
                   "sharing overlap tokens, so they can be read (readChunk) and searched (searchEngine). "
                   "Calling it again replaces the index.", _schema({
                       "chunk_size": {"type": integer, "description": "Tokens per chunk.",
                                      "minimum": MIN_CHUNK_TOKENS, "maximum": MAX_CHUNK_TOKENS,
                                      "default": self.default_chunk_tokens},
                       "overlap": {"type": integer, "description": "Tokens shared by neighbouring chunks; "
                                   "less than chunk_size.", "minimum": 0, "default": 0}})),
            _entry("readChunk", "Return the full text of one chunk of the index, with its token positions.",
                   _schema({"chunk_id": {"type": integer, "description": "Which chunk, from 0 to the "
                                         "last_chunk_id buildIndex reported.", "minimum": 0}}, ("chunk_id",))),
            _entry("searchEngine", "Rank the index's chunks for keywords (BM25) and return the best chunk ids "
                   "with short highlighted fragments.", _schema({
                       "keyword": {"type": "string", "description": "Comma-separated keywords; a keyword of "
                                   "several words needs all of them in a chunk.", "maxLength": MAX_KEYWORD_CHARS},
                       "mode": {"type": "string", "enum": ["or", "and"], "default": "or",
                                "description": "'or': chunks matching any keyword; 'and': chunks matching all."},
                       "size": {"type": integer, "description": "At most this many chunks.", "minimum": 1,
                                "maximum": MAX_SEARCH_SIZE, "default": DEFAULT_SEARCH_SIZE},
                       "fragment_size": {"type": integer, "description": "Characters per highlight fragment.",
                                         "minimum": MIN_FRAGMENT_CHARS, "maximum": MAX_FRAGMENT_CHARS,
                                         "default": DEFAULT_FRAGMENT_CHARS},
                       "num_fragments": {"type": integer, "description": "Highlight fragments per chunk.",
                                         "minimum": 1, "maximum": MAX_FRAGMENTS, "default": DEFAULT_FRAGMENTS}},
                       ("keyword",))),
            _entry("finish", "Submit your final answer to the question; this ends the episode.",
                   _schema({"answer": {"type": "string", "description": "The answer, short and exact."}},
                           ("answer",))),
        ]

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool; mistakes come back as error observations (is_error=True), never as exceptions."""
        return _dispatch(self._handlers, self._allowed, "document", name, arguments)

    # -- the document's tokens ---------------------------------------------------------------------------------

    @property
    def token_ids(self) -> list[int]:
        """The document's token ids (computed once)."""
        if self._ids is None:
            self._ids = list(self.encode(self.document)) if self.document else []
        return self._ids

    def _clean(self, pos: int) -> bool:
        """Whether a window may start or end at token `pos` without splitting a character's bytes."""
        ids = self.token_ids
        return pos <= 0 or pos >= len(ids) or not self.decode(ids[pos:pos + 1]).startswith(_REPLACEMENT)

    def _boundary(self, pos: int) -> int:
        """`pos`, moved forward (at most 3 tokens: a UTF-8 character has at most 4 bytes) onto a clean boundary."""
        for step in range(4):
            if self._clean(pos + step):
                return min(pos + step, len(self.token_ids))
        return min(pos, len(self.token_ids))

    # -- tools ---------------------------------------------------------------------------------------------------

    def _analyze_text(self, args: _Arguments) -> ToolResult:
        return _ok({"file_name": FILE_NAME, "total_tokens": len(self.token_ids)})

    def _load_document(self, args: _Arguments) -> ToolResult:
        if not self.document:
            raise _ArgError("the attached document is empty: there is nothing to load")
        return _ok({"document_content": self.document})

    def _build_index(self, args: _Arguments) -> ToolResult:
        chunk_size = args.integer("chunk_size", MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS, self.default_chunk_tokens)
        overlap = args.integer("overlap", 0, MAX_CHUNK_TOKENS, 0)
        if overlap >= chunk_size:
            raise _ArgError(f"overlap ({overlap}) must be less than chunk_size ({chunk_size})")
        total = len(self.token_ids)
        step = chunk_size - overlap
        # Windows start at 0, step, 2*step, ... and stop once one reaches the document's end.
        count = 1 if total <= chunk_size else 1 + math.ceil((total - chunk_size) / step)
        count = 0 if total == 0 else count
        indexed = sum(min(i * step + chunk_size, total) - i * step for i in range(min(count, MAX_CHUNKS + 1)))
        if count > MAX_CHUNKS or indexed > max(MIN_INDEX_TOKENS, INDEX_TOKENS_FACTOR * total):
            raise _ArgError(f"chunk_size {chunk_size} with overlap {overlap} would make {count} chunks of a "
                            f"{total}-token document (an index holds at most {MAX_CHUNKS} chunks and "
                            f"{INDEX_TOKENS_FACTOR}x the document): use a larger chunk_size or a smaller overlap")
        chunks: list[dict[str, Any]] = []
        postings: dict[str, dict[int, int]] = {}
        lengths: list[int] = []
        for chunk_id in range(count):
            raw_start = chunk_id * step
            start = self._boundary(raw_start)
            end = self._boundary(min(raw_start + chunk_size, total))
            content = self.decode(self.token_ids[start:end])
            chunks.append({"chunk_id": chunk_id, "content": content, "start_pos": start, "end_pos": end})
            terms = Counter(m.group().lower() for m in _WORD.finditer(content))
            lengths.append(sum(terms.values()))
            for term, occurrences in terms.items():
                postings.setdefault(term, {})[chunk_id] = occurrences
        self.chunks, self._postings, self._lengths, self._indexed = chunks, postings, lengths, True
        return _ok({"index_id": "document_index", "total_chunks": len(chunks), "first_chunk_id": 0,
                    "last_chunk_id": len(chunks) - 1, "chunk_size": chunk_size, "overlap": overlap})

    def _need_index(self) -> None:
        if not self._indexed:
            raise _ArgError("there is no index yet: call buildIndex first (e.g. buildIndex with "
                            f"chunk_size {self.default_chunk_tokens}), then readChunk or searchEngine")
        if not self.chunks:
            raise _ArgError("the attached document is empty: the index has no chunks")

    def _read_chunk(self, args: _Arguments) -> ToolResult:
        self._need_index()
        last = len(self.chunks) - 1
        value = args.values.get("chunk_id")
        if value is None:
            raise _ArgError(f"readChunk needs chunk_id: an integer from 0 to {last}")
        chunk_id = args.integer("chunk_id", 0, last)
        return _ok({"retrieved_chunk": [dict(self.chunks[chunk_id])], "chunk_id": chunk_id})

    def _keywords(self, args: _Arguments) -> list[str]:
        raw = args.values.get("keyword")
        if raw is None:
            raise _ArgError("searchEngine needs keyword: comma-separated keywords, e.g. \"budget, 2021\"")
        if isinstance(raw, list):  # some models send a list; accept it when it is a short list of strings
            if len(raw) > MAX_KEYWORDS or not all(isinstance(k, str) for k in raw):
                raise _ArgError(f"keyword must be a string of comma-separated keywords (at most {MAX_KEYWORDS})")
            raw = ",".join(raw)
        if not isinstance(raw, str):
            raise _ArgError("keyword must be a string of comma-separated keywords")
        if len(raw) > MAX_KEYWORD_CHARS:
            raise _ArgError(f"keyword is {len(raw)} characters long; write at most {MAX_KEYWORD_CHARS}")
        _check_text(raw, "keyword")
        keywords = [k.strip() for k in raw.split(",") if k.strip()]
        if len(keywords) > MAX_KEYWORDS:
            raise _ArgError(f"keyword holds {len(keywords)} keywords; give at most {MAX_KEYWORDS}")
        if not any(_WORD.search(k) for k in keywords):
            raise _ArgError("keyword has no words to search for: give comma-separated words, e.g. \"budget, 2021\"")
        return keywords

    def _search_engine(self, args: _Arguments) -> ToolResult:
        self._need_index()
        keywords = self._keywords(args)
        mode = args.text("mode", 8, required=False, default="or").strip().lower()
        if mode not in ("or", "and"):
            raise _ArgError(f"mode must be 'or' (chunks matching any keyword) or 'and' (all keywords), not {mode!r}")
        size = args.integer("size", 1, MAX_SEARCH_SIZE, DEFAULT_SEARCH_SIZE)
        fragment_size = args.integer("fragment_size", MIN_FRAGMENT_CHARS, MAX_FRAGMENT_CHARS, DEFAULT_FRAGMENT_CHARS)
        num_fragments = args.integer("num_fragments", 1, MAX_FRAGMENTS, DEFAULT_FRAGMENTS)
        scores, matched_terms = self._bm25([[m.group().lower() for m in _WORD.finditer(k)] for k in keywords], mode)
        if not scores:
            hint = " or use mode 'or'" if mode == "and" and len(keywords) > 1 else ""
            return _ok({"retrieved_chunks": [], "keywords": keywords,
                        "message": f"No chunk matches: try other keywords (synonyms, fewer words){hint}."})
        best = heapq.nsmallest(size, scores.items(), key=lambda item: (-item[1], item[0]))
        items = [{"chunk_id": chunk_id, "relevance_score": round(score, 3),
                  "highlights": _highlights(self.chunks[chunk_id]["content"], matched_terms[chunk_id],
                                            fragment_size, num_fragments)}
                 for chunk_id, score in best]
        message = (f"Showing the {len(items)} most relevant of {len(scores)} matching chunks."
                   if len(items) < len(scores) else f"{len(items)} matching chunks, most relevant first.")
        return _ok({"retrieved_chunks": items, "keywords": keywords, "message": message})

    def _bm25(self, keywords: list[list[str]], mode: str) -> tuple[dict[int, float], dict[int, set[str]]]:
        """Each matching chunk's BM25 score, and the query terms it matched (for highlighting)."""
        n = len(self.chunks)
        avgdl = max(sum(self._lengths) / n, 1e-9)
        scores: dict[int, float] = {}
        matched: dict[int, set[str]] = {}
        hits_per_keyword: list[set[int]] = []
        for terms in keywords:
            if not terms:
                continue
            postings = [self._postings.get(term, {}) for term in terms]
            hits = set(min(postings, key=len))
            for posting in postings:
                hits &= posting.keys()
            hits_per_keyword.append(hits)
            for term, posting in zip(terms, postings, strict=True):
                idf = math.log(1 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
                for chunk_id in hits:
                    tf = posting[chunk_id]
                    norm = BM25_K1 * (1 - BM25_B + BM25_B * self._lengths[chunk_id] / avgdl)
                    scores[chunk_id] = scores.get(chunk_id, 0.0) + idf * tf * (BM25_K1 + 1) / (tf + norm)
                    matched.setdefault(chunk_id, set()).add(term)
        if mode == "and":
            keep = set.intersection(*hits_per_keyword) if hits_per_keyword else set()
            scores = {c: s for c, s in scores.items() if c in keep}
        return scores, matched

    def _finish(self, args: _Arguments) -> ToolResult:
        value = args.values.get("answer")
        if value is None:
            raise _ArgError("finish needs answer: your final answer as a short string")
        if isinstance(value, str):
            answer = args.text("answer", MAX_ANSWER_CHARS)
            if not answer.strip():
                raise _ArgError("finish needs a non-empty answer: write your final answer as a short string")
        else:
            _, answer = _json_value(value, "answer", MAX_ANSWER_CHARS)
        self.answer = answer
        return _ok({"final_answer": answer}, done=True)


def _highlights(content: str, terms: set[str], fragment_size: int, num_fragments: int) -> list[str]:
    """Up to num_fragments fragments of about fragment_size characters around matches, matches in <em>."""
    spans = [(m.start(), m.end()) for m in _WORD.finditer(content) if m.group().lower() in terms]
    candidates: list[tuple[int, int, list[tuple[int, int]]]] = []
    i, previous_end = 0, 0
    while i < len(spans) and len(candidates) < 4 * MAX_FRAGMENTS:
        first_start, first_end = spans[i]
        start = max(previous_end, first_start - max(fragment_size - (first_end - first_start), 0) // 2)
        end = min(len(content), max(start + fragment_size, first_end))
        inside = []
        while i < len(spans) and spans[i][1] <= end:
            inside.append(spans[i])
            i += 1
        # Do not cut words at the fragment's edges (the matches themselves stay whole).
        while start < first_start and start > 0 and content[start - 1].isalnum() and content[start].isalnum():
            start += 1
        while end > inside[-1][1] and end < len(content) and content[end - 1].isalnum() and content[end].isalnum():
            end -= 1
        candidates.append((start, end, inside))
        previous_end = end
    # The fragments with the most distinct matched words, shown in document order.
    ranked = sorted(range(len(candidates)), key=lambda k: (-len({content[a:b].lower() for a, b in
                                                                  candidates[k][2]}), -len(candidates[k][2]), k))
    fragments = []
    for k in sorted(ranked[:num_fragments]):
        start, end, inside = candidates[k]
        pieces, cursor = [], start
        for a, b in inside:
            pieces += [content[cursor:a], "<em>", content[a:b], "</em>"]
            cursor = b
        pieces.append(content[cursor:end])
        fragments.append(" ".join("".join(pieces).split()))
    return fragments


class MemoryTools:
    """checkBudget, note, readNote, updateNote and deleteContext: notes that outlive deletions, and deletions.

    The episode loop owns the history and the budget: `budget()` gives checkBudget's figures verbatim and
    `deletable(msg_id)` says whether a message may go (None) or why not. Accepted deletions wait in
    `take_deletions()` for the loop to apply (the stub re-render). `notes` keeps insertion order.
    """

    def __init__(self, budget: Callable[[], dict[str, int | None]],
                 deletable: Callable[[int], str | None]) -> None:
        if not callable(budget) or not callable(deletable):
            raise TypeError("budget and deletable must be callables: () -> dict and int -> str | None")
        self.budget = budget
        self.deletable = deletable
        self.notes: dict[str, dict[str, Any]] = {}
        self._deletions: list[int] = []
        self._handlers: dict[str, Callable[[_Arguments], ToolResult]] = {
            "checkBudget": self._check_budget, "note": self._note, "readNote": self._read_note,
            "updateNote": self._update_note, "deleteContext": self._delete_context}
        self._allowed: dict[str, tuple[str, ...]] = {
            "checkBudget": (), "note": ("key", "summary", "content"), "readNote": ("key",),
            "updateNote": ("key", "mode", "new_content", "new_summary"), "deleteContext": ("msg_id",)}
        self.tools: list[dict[str, Any]] = self._tool_entries()
        self.names: frozenset[str] = frozenset(MEMORY_TOOL_NAMES)

    @staticmethod
    def _tool_entries() -> list[dict[str, Any]]:
        key = {"type": "string", "description": "The note's name.", "maxLength": MAX_KEY_CHARS}
        return [
            _entry("checkBudget", "Report the rounds so far and the tokens and rounds you have left.", _schema({})),
            _entry("note", "Save information under a key, as a short summary (always shown to you in the external "
                   "memory block) and a full content (read back with readNote). An existing key is replaced.",
                   _schema({"key": key,
                            "summary": {"type": "string", "description": "One line saying what the note holds.",
                                        "maxLength": MAX_SUMMARY_CHARS},
                            "content": {"description": "The information itself: text or any JSON value, at most "
                                        f"{MAX_CONTENT_BYTES} bytes as JSON."}},
                           ("key", "summary", "content"))),
            _entry("readNote", "Return a note's summary and full content.", _schema({"key": key}, ("key",))),
            _entry("updateNote", "Change a note: append text to it, overwrite its content, or delete it.",
                   _schema({"key": key,
                            "mode": {"type": "string", "enum": ["append", "overwrite", "delete"],
                                     "description": "What to do with the note."},
                            "new_content": {"description": "The text to append or the new content; not needed "
                                            "to delete."},
                            "new_summary": {"type": "string", "description": "A new summary (optional).",
                                            "maxLength": MAX_SUMMARY_CHARS}},
                           ("key", "mode"))),
            _entry("deleteContext", "Replace an earlier assistant message or tool result, by its message id, with "
                   "a short stub to free context. Save what you still need with note first.",
                   _schema({"msg_id": {"type": "integer", "description": "The id of the message to delete.",
                                       "minimum": 0}}, ("msg_id",))),
        ]

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool; mistakes come back as error observations (is_error=True), never as exceptions."""
        return _dispatch(self._handlers, self._allowed, "memory", name, arguments)

    def take_deletions(self) -> list[int]:
        """The message ids deleteContext accepted since the last take, in call order; empties the list."""
        taken, self._deletions = self._deletions, []
        return taken

    def _key(self, args: _Arguments, must_exist: bool) -> str:
        value = args.values.get("key")
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise _ArgError(f"{args.tool} needs key: the note's name (a non-empty string)")
        if not isinstance(value, str):
            raise _ArgError(f"key must be a string of at most {MAX_KEY_CHARS} characters")
        if len(value) > MAX_KEY_CHARS:
            raise _ArgError(f"key is {len(value)} characters long; write at most {MAX_KEY_CHARS}")
        _check_text(value, "key")
        if must_exist and value not in self.notes:
            known = list(self.notes)
            listing = ", ".join(repr(k) for k in known[:20]) + (", ..." if len(known) > 20 else "")
            raise _ArgError(f"there is no note {value!r}; " + (f"the notes are {listing}" if known
                                                                 else "no notes exist yet: create one with note"))
        return value

    def _check_budget(self, args: _Arguments) -> ToolResult:
        return _ok(dict(self.budget()))

    def _note(self, args: _Arguments) -> ToolResult:
        key = self._key(args, must_exist=False)
        summary = args.text("summary", MAX_SUMMARY_CHARS)
        if not args.present("content"):
            raise _ArgError("note needs content: the information to keep (text or JSON)")
        content, _ = _json_value(args.values["content"], "content", MAX_CONTENT_BYTES)
        if key not in self.notes and len(self.notes) >= MAX_NOTES:
            raise _ArgError(f"there are already {MAX_NOTES} notes: merge or delete some with updateNote first")
        replaced = key in self.notes
        self.notes[key] = {"summary": summary, "content": content}
        return _ok({"status": "success", "key": key,
                    "message": f"Note {key!r} {'replaced' if replaced else 'saved'}."})

    def _read_note(self, args: _Arguments) -> ToolResult:
        key = self._key(args, must_exist=True)
        note = self.notes[key]
        return _ok({"summary": note["summary"], "full_content": note["content"]})

    def _update_note(self, args: _Arguments) -> ToolResult:
        key = self._key(args, must_exist=True)
        mode = args.text("mode", 16).strip().lower()
        if mode not in ("append", "overwrite", "delete"):
            raise _ArgError(f"mode must be 'append', 'overwrite' or 'delete', not {mode!r}")
        if mode == "delete":
            del self.notes[key]
            return _ok({"status": "success", "key": key, "message": f"Note {key!r} deleted."})
        if not args.present("new_content"):
            raise _ArgError(f"updateNote in mode {mode!r} needs new_content")
        new_content, _ = _json_value(args.values["new_content"], "new_content", MAX_CONTENT_BYTES)
        new_summary = args.text("new_summary", MAX_SUMMARY_CHARS, required=False, default="") \
            if args.present("new_summary") else None
        note = self.notes[key]
        if mode == "append":
            content, _ = _json_value(_as_text(note["content"]) + "\n" + _as_text(new_content), "the appended note",
                                     MAX_CONTENT_BYTES)
        else:
            content = new_content
        note["content"] = content
        if new_summary is not None:
            note["summary"] = new_summary
        return _ok({"status": "success", "key": key,
                    "message": f"Note {key!r} {'appended' if mode == 'append' else 'overwritten'}."})

    def _delete_context(self, args: _Arguments) -> ToolResult:
        value = args.values.get("msg_id")
        if value is None:
            raise _ArgError("deleteContext needs msg_id: the id of an earlier assistant message or tool result")
        msg_id = args.integer("msg_id", 0, MAX_MSG_ID)
        if msg_id in self._deletions:
            raise _ArgError(f"message {msg_id} is already deleted")
        reason = self.deletable(msg_id)
        if reason is not None:
            raise _ArgError(str(reason))
        self._deletions.append(msg_id)
        return _ok({"status": "success", "deleted_msg_id": msg_id})
