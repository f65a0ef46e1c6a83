"""The context-management tools (awm_grpo/context/tools.py) over a real tokenizer: Qwen3's vocabulary."""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import pytest

from awm_grpo.context import tools as ctx
from awm_grpo.context.tools import DOCUMENT_TOOL_NAMES, MEMORY_TOOL_NAMES, STUB, DocumentTools, MemoryTools
from slime.models.qwen_vocab import build_qwen_tokenizer

TOWNS = ["Avalon", "Brixton", "Camden", "Dorset", "Ealing", "Fulham", "Greenwich", "Hackney"]


@pytest.fixture(scope="module")
def qwen() -> Any:
    return build_qwen_tokenizer()


@pytest.fixture(scope="module")
def codec(qwen: Any) -> tuple[Any, Any]:
    return (lambda text: qwen.encode(text, add_special_tokens=False)), (lambda ids: qwen.decode(ids))


def report(town: str, i: int) -> str:
    return f"Report {i} from {town}: the market opened at nine and the weather stayed mild all day."


@pytest.fixture(scope="module")
def document() -> str:
    lines = [report(TOWNS[i % len(TOWNS)], i) for i in range(120)]
    lines[77] += " The vault combination is zebra quartz; only the Camden clerk knows it."
    return "\n".join(lines)


def tools_for(document: str, codec: tuple[Any, Any], **kwargs: Any) -> DocumentTools:
    encode, decode = codec
    return DocumentTools(document, encode, decode, **kwargs)


def ok(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.text
    assert result.kind == "ok"
    return json.loads(result.text)


def error(result: Any, kind: str = "invalid_arguments") -> str:
    assert result.is_error, result.text
    assert result.kind == kind
    payload = json.loads(result.text)
    assert set(payload) == {"error"} and payload["error"]
    return payload["error"]


# -- interface ------------------------------------------------------------------------------------------------


def test_constants_and_schemas(document: str, codec: tuple[Any, Any]) -> None:
    assert STUB == "Content has been deleted to save space."
    doc_tools = tools_for(document, codec)
    memory = MemoryTools(lambda: {}, lambda msg_id: None)
    assert [t["name"] for t in doc_tools.tools] == list(DOCUMENT_TOOL_NAMES)
    assert [t["name"] for t in memory.tools] == list(MEMORY_TOOL_NAMES)
    assert doc_tools.names == frozenset(DOCUMENT_TOOL_NAMES) and memory.names == frozenset(MEMORY_TOOL_NAMES)
    required = {}
    for entry in doc_tools.tools + memory.tools:
        assert set(entry) == {"name", "description", "inputSchema"} and entry["description"]
        schema = entry["inputSchema"]
        assert schema["type"] == "object"
        assert set(schema["required"]) <= set(schema["properties"])
        json.dumps(entry)  # JSON-able, as MCP tool listings are
        required[entry["name"]] = sorted(schema["required"])
    assert required == {"analyzeText": [], "loadDocument": [], "buildIndex": [], "readChunk": ["chunk_id"],
                        "searchEngine": ["keyword"], "finish": ["answer"], "checkBudget": [],
                        "note": ["content", "key", "summary"], "readNote": ["key"], "updateNote": ["key", "mode"],
                        "deleteContext": ["msg_id"]}


def test_constructor_rejects_bad_setup(codec: tuple[Any, Any]) -> None:
    encode, decode = codec
    with pytest.raises(TypeError, match="document must be a str"):
        DocumentTools(b"bytes", encode, decode)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="default_chunk_tokens"):
        DocumentTools("text", encode, decode, default_chunk_tokens=4)
    with pytest.raises(TypeError, match="callables"):
        MemoryTools({}, lambda msg_id: None)  # type: ignore[arg-type]


def test_tokenizing_is_lazy_and_once(document: str, codec: tuple[Any, Any]) -> None:
    encode, decode = codec
    calls = []

    def counting(text: str) -> list[int]:
        calls.append(len(text))
        return encode(text)

    tools = DocumentTools(document, counting, decode)
    assert calls == []
    ok(tools.call("analyzeText", {}))
    ok(tools.call("buildIndex", {"chunk_size": 64}))
    ok(tools.call("buildIndex", {"chunk_size": 128, "overlap": 8}))
    assert calls == [len(document)]


# -- document tools ---------------------------------------------------------------------------------------------


def test_analyze_and_load(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    assert ok(tools.call("analyzeText", {})) == {"file_name": ctx.FILE_NAME,
                                                 "total_tokens": len(codec[0](document))}
    assert ok(tools.call("loadDocument", {})) == {"document_content": document}
    assert "empty" in error(tools_for("", codec).call("loadDocument", {}))


def test_chunks_tile_the_document_without_overlap(document: str, codec: tuple[Any, Any]) -> None:
    encode, decode = codec
    ids = encode(document)
    tools = tools_for(document, codec)
    built = ok(tools.call("buildIndex", {"chunk_size": 64}))
    expected = math.ceil(len(ids) / 64)
    assert built["index_id"] == "document_index"
    assert (built["total_chunks"], built["first_chunk_id"], built["last_chunk_id"]) == (expected, 0, expected - 1)
    chunks = [ok(tools.call("readChunk", {"chunk_id": i})) for i in range(expected)]
    for i, read in enumerate(chunks):
        assert read["chunk_id"] == i and len(read["retrieved_chunk"]) == 1
        chunk = read["retrieved_chunk"][0]
        assert set(chunk) == {"chunk_id", "content", "start_pos", "end_pos"}
        assert (chunk["start_pos"], chunk["end_pos"]) == (64 * i, min(64 * i + 64, len(ids)))
        assert chunk["content"] == decode(ids[chunk["start_pos"]:chunk["end_pos"]])
    assert "".join(read["retrieved_chunk"][0]["content"] for read in chunks) == document


def test_overlap_is_honoured(document: str, codec: tuple[Any, Any]) -> None:
    encode, decode = codec
    ids = encode(document)
    tools = tools_for(document, codec)
    built = ok(tools.call("buildIndex", {"chunk_size": 100, "overlap": 30}))
    chunks = tools.chunks
    assert built["total_chunks"] == len(chunks) == 1 + math.ceil((len(ids) - 100) / 70)
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert after["start_pos"] == before["start_pos"] + 70
        assert before["end_pos"] - after["start_pos"] == 30
        shared = decode(ids[after["start_pos"]:before["end_pos"]])
        assert before["content"].endswith(shared) and after["content"].startswith(shared)
    assert chunks[-1]["end_pos"] == len(ids)
    assert chunks[-2]["end_pos"] < len(ids)  # no chunk lies wholly inside the one before it
    # Reading each chunk past its overlap gives the document back.
    rebuilt = chunks[0]["content"] + "".join(decode(ids[a["end_pos"]:b["end_pos"]]) for a, b in zip(chunks, chunks[1:],
                                                                                                     strict=False))
    assert rebuilt == document


def test_rebuilding_replaces_the_index(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec, default_chunk_tokens=512)
    first = ok(tools.call("buildIndex", {}))
    assert tools.chunks[0]["end_pos"] == 512
    second = ok(tools.call("buildIndex", {"chunk_size": "256", "overlap": 0}))
    assert second["total_chunks"] > first["total_chunks"]
    assert tools.chunks[0]["end_pos"] == 256
    assert f"0 to {second['last_chunk_id']}" in error(tools.call("readChunk", {"chunk_id": second["total_chunks"]}))


def test_chunks_do_not_split_characters(codec: tuple[Any, Any]) -> None:
    encode, decode = codec
    text = " ".join(["naïve café déjà vu", "日本語のテキスト", "emoji 🦓🧪🎉 zebra", "Ωμέγα Σίσυφος"] * 40)
    ids = encode(text)
    assert "\ufffd" in "".join(decode(ids[i:i + 1]) for i in range(len(ids)))  # some tokens are partial characters
    tools = DocumentTools(text, encode, decode)
    ok(tools.call("buildIndex", {"chunk_size": 16}))
    assert all("\ufffd" not in chunk["content"] for chunk in tools.chunks)
    assert "".join(chunk["content"] for chunk in tools.chunks) == text
    assert all(chunk["end_pos"] - chunk["start_pos"] <= 16 + 3 for chunk in tools.chunks)


def test_read_before_index_and_bad_chunk_ids(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    assert "buildIndex" in error(tools.call("readChunk", {"chunk_id": 0}))
    assert "buildIndex" in error(tools.call("searchEngine", {"keyword": "zebra"}))
    last = ok(tools.call("buildIndex", {"chunk_size": 256}))["last_chunk_id"]
    assert ok(tools.call("readChunk", {"chunk_id": "2"}))["chunk_id"] == 2
    assert ok(tools.call("readChunk", {"chunk_id": 1.0}))["chunk_id"] == 1
    for bad in (-1, last + 1, 10**100, "10" * 1000, "two", True, 1.5, [1], {"id": 1}):
        message = error(tools.call("readChunk", {"chunk_id": bad}))
        assert "chunk_id" in message and str(last) in message
    assert "chunk_id" in error(tools.call("readChunk", {}))
    empty = tools_for("", codec)
    assert ok(empty.call("buildIndex", {}))["total_chunks"] == 0
    assert "empty" in error(empty.call("readChunk", {"chunk_id": 0}))


def test_build_index_bounds(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    assert "less than chunk_size" in error(tools.call("buildIndex", {"chunk_size": 64, "overlap": 64}))
    assert "16 to 32768" in error(tools.call("buildIndex", {"chunk_size": 8}))
    assert "16 to 32768" in error(tools.call("buildIndex", {"chunk_size": 10**9}))
    assert "integer" in error(tools.call("buildIndex", {"chunk_size": "big"}))
    assert "from 0" in error(tools.call("buildIndex", {"chunk_size": 64, "overlap": -1}))
    assert "chunk_size" in error(tools.call("buildIndex", {"chunk_sizes": 64}))  # unknown name, says what exists
    # Windows one token apart over a long document: refused up front, not built.
    long_doc = "word " * 70_000
    start = time.perf_counter()
    refused = error(tools_for(long_doc, codec).call("buildIndex", {"chunk_size": 32768, "overlap": 32767}))
    assert "larger chunk_size or a smaller overlap" in refused
    assert time.perf_counter() - start < 5  # tokenizing 70k words dominates; no window is decoded


# -- search -----------------------------------------------------------------------------------------------------


def bm25(chunks: list[dict[str, Any]], terms: list[str]) -> dict[int, float]:
    """The textbook BM25 (k1=1.2, b=0.75, Lucene's idf), computed independently of the tool."""
    words = [[w.lower() for w in re.findall(r"\w+", c["content"])] for c in chunks]
    avgdl = sum(map(len, words)) / len(words)
    scores: dict[int, float] = {}
    for term in terms:
        df = sum(term in w for w in words)
        idf = math.log(1 + (len(words) - df + 0.5) / (df + 0.5))
        for i, w in enumerate(words):
            tf = w.count(term)
            if tf:
                scores[i] = scores.get(i, 0.0) + idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(w) / avgdl))
    return scores


def test_rare_keyword_ranks_first_with_bm25_scores(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    ok(tools.call("buildIndex", {"chunk_size": 128}))
    found = ok(tools.call("searchEngine", {"keyword": "weather, ZEBRA", "size": 50}))
    assert found["keywords"] == ["weather", "ZEBRA"] and found["message"]
    hits = found["retrieved_chunks"]
    expected = bm25(tools.chunks, ["weather", "zebra"])
    assert len(hits) == len(tools.chunks) == len(expected)  # "weather" is in every chunk
    zebra_chunk = next(c["chunk_id"] for c in tools.chunks if "zebra" in c["content"])
    assert hits[0]["chunk_id"] == zebra_chunk
    assert hits[0]["relevance_score"] > 2 * hits[1]["relevance_score"]
    for hit in hits:
        assert set(hit) == {"chunk_id", "relevance_score", "highlights"}
        assert hit["relevance_score"] == pytest.approx(expected[hit["chunk_id"]], abs=1e-3)
    assert [h["relevance_score"] for h in hits] == sorted((h["relevance_score"] for h in hits), reverse=True)
    assert any("<em>zebra</em>" in fragment for fragment in hits[0]["highlights"])
    assert all("<em>weather</em>" in fragment or "<em>zebra</em>" in fragment
               for hit in hits for fragment in hit["highlights"])


def test_and_versus_or(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    ok(tools.call("buildIndex", {"chunk_size": 64}))
    words = [set(re.findall(r"\w+", c["content"].lower())) for c in tools.chunks]
    avalon = {i for i, w in enumerate(words) if "avalon" in w}
    hackney = {i for i, w in enumerate(words) if "hackney" in w}
    assert avalon & hackney and avalon - hackney and hackney - avalon  # the document makes all three cases
    either = ok(tools.call("searchEngine", {"keyword": "avalon,hackney", "mode": "or", "size": 50}))
    both = ok(tools.call("searchEngine", {"keyword": ["Avalon", "Hackney"], "mode": "AND", "size": 50}))
    assert {h["chunk_id"] for h in either["retrieved_chunks"]} == avalon | hackney
    assert {h["chunk_id"] for h in both["retrieved_chunks"]} == avalon & hackney
    # A keyword of several words needs all of them in one chunk.
    phrase = ok(tools.call("searchEngine", {"keyword": "avalon hackney", "size": 50}))
    assert {h["chunk_id"] for h in phrase["retrieved_chunks"]} == avalon & hackney
    none = ok(tools.call("searchEngine", {"keyword": "zebra, avalon", "mode": "and"}))
    zebra = {i for i, w in enumerate(words) if "zebra" in w}
    assert zebra and not zebra & avalon
    assert none["retrieved_chunks"] == [] and "No chunk matches" in none["message"] and "'or'" in none["message"]


def test_search_size_and_fragments(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    total = ok(tools.call("buildIndex", {"chunk_size": 64}))["total_chunks"]
    found = ok(tools.call("searchEngine", {"keyword": "market", "size": 3, "fragment_size": 40, "num_fragments": 2}))
    assert len(found["retrieved_chunks"]) == 3
    assert f"3 most relevant of {total}" in found["message"]
    for hit in found["retrieved_chunks"]:
        assert 1 <= len(hit["highlights"]) <= 2
        for fragment in hit["highlights"]:
            assert "<em>market</em>" in fragment
            assert len(fragment.replace("<em>", "").replace("</em>", "")) <= 40
    assert ok(tools.call("searchEngine", {"keyword": "nowhere"}))["retrieved_chunks"] == []
    assert ok(tools.call("searchEngine", {"keyword": "market"})) == ok(tools.call("searchEngine",
                                                                                  {"keyword": "market"}))


def test_search_argument_errors(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    ok(tools.call("buildIndex", {"chunk_size": 64}))
    assert "keyword" in error(tools.call("searchEngine", {}))
    assert "no words" in error(tools.call("searchEngine", {"keyword": " , ,!!"}))
    assert "mode" in error(tools.call("searchEngine", {"keyword": "market", "mode": "xor"}))
    assert "size" in error(tools.call("searchEngine", {"keyword": "market", "size": 0}))
    assert "size" in error(tools.call("searchEngine", {"keyword": "market", "size": 51}))
    assert "fragment_size" in error(tools.call("searchEngine", {"keyword": "market", "fragment_size": 5}))
    assert "num_fragments" in error(tools.call("searchEngine", {"keyword": "market", "num_fragments": 99}))
    assert "keyword" in error(tools.call("searchEngine", {"keyword": 42}))
    assert "at most 32" in error(tools.call("searchEngine", {"keyword": ",".join("k" * 33)}))
    assert "surrogate" in error(tools.call("searchEngine", {"keyword": "bad \ud800 text"}))


# -- finish -----------------------------------------------------------------------------------------------------


def test_finish(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    assert tools.answer is None
    assert "answer" in error(tools.call("finish", {}))
    assert "non-empty" in error(tools.call("finish", {"answer": "  "}))
    assert tools.answer is None
    result = tools.call("finish", {"answer": "zebra quartz"})
    assert result.done and ok(result) == {"final_answer": "zebra quartz"}
    assert tools.answer == "zebra quartz"
    structured = tools.call("finish", {"answer": {"code": ["zebra", 7]}})
    assert structured.done and tools.answer == '{"code": ["zebra", 7]}'
    assert ok(structured) == {"final_answer": tools.answer}
    assert not tools.call("analyzeText", {}).done


# -- dispatch ---------------------------------------------------------------------------------------------------


def test_unknown_tools_and_argument_shapes(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    memory = MemoryTools(lambda: {}, lambda msg_id: None)
    assert "searchEngine" in error(tools.call("search", {}), "unknown_tool")
    assert "deleteContext" in error(memory.call("finish", {"answer": "x"}), "unknown_tool")
    assert len(error(tools.call("x" * 1_000_000, {}), "unknown_tool")) < 300
    assert "JSON object" in error(tools.call("buildIndex", ["chunk_size", 64]))  # type: ignore[arg-type]
    assert "no arguments" in error(tools.call("analyzeText", {"file": "a.txt"}))
    assert ok(tools.call("analyzeText", None))["total_tokens"] > 0  # type: ignore[arg-type]


# -- memory tools -----------------------------------------------------------------------------------------------


def test_check_budget_is_verbatim() -> None:
    figures = {"conv_rounds": 3, "available_tokens": None, "available_rounds": 77}
    memory = MemoryTools(lambda: figures, lambda msg_id: None)
    assert ok(memory.call("checkBudget", {})) == figures


def test_notes_round_trip() -> None:
    memory = MemoryTools(lambda: {}, lambda msg_id: None)
    saved = ok(memory.call("note", {"key": "vault", "summary": "the vault code", "content": "zebra quartz"}))
    assert saved["status"] == "success" and saved["key"] == "vault"
    ok(memory.call("note", {"key": "towns", "summary": "towns seen", "content": {"seen": ["Avalon"], "n": 1}}))
    assert list(memory.notes) == ["vault", "towns"]
    assert ok(memory.call("readNote", {"key": "vault"})) == {"summary": "the vault code",
                                                            "full_content": "zebra quartz"}
    assert ok(memory.call("readNote", {"key": "towns"}))["full_content"] == {"seen": ["Avalon"], "n": 1}
    # append joins text on a new line; JSON content is appended as its JSON text.
    ok(memory.call("updateNote", {"key": "vault", "mode": "append", "new_content": "known to the Camden clerk"}))
    assert memory.notes["vault"] == {"summary": "the vault code", "content": "zebra quartz\nknown to the Camden clerk"}
    ok(memory.call("updateNote", {"key": "towns", "mode": "append", "new_content": "Brixton"}))
    assert memory.notes["towns"]["content"] == '{"seen": ["Avalon"], "n": 1}\nBrixton'
    ok(memory.call("updateNote", {"key": "vault", "mode": "Overwrite", "new_content": "zebra",
                                  "new_summary": "code word"}))
    assert memory.notes["vault"] == {"summary": "code word", "content": "zebra"}
    deleted = ok(memory.call("updateNote", {"key": "towns", "mode": "delete"}))
    assert deleted["status"] == "success" and deleted["key"] == "towns"
    assert list(memory.notes) == ["vault"]
    assert "'vault'" in error(memory.call("readNote", {"key": "towns"}))  # lists the notes that exist
    replaced = ok(memory.call("note", {"key": "vault", "summary": "s", "content": "new"}))
    assert "replaced" in replaced["message"] and memory.notes["vault"]["content"] == "new"


def test_note_argument_errors() -> None:
    memory = MemoryTools(lambda: {}, lambda msg_id: None)
    assert "content" in error(memory.call("note", {"key": "k", "summary": "s"}))
    assert "summary" in error(memory.call("note", {"key": "k", "content": "c"}))
    assert "key" in error(memory.call("note", {"key": " ", "summary": "s", "content": "c"}))
    assert "key" in error(memory.call("note", {"key": ["k"], "summary": "s", "content": "c"}))
    assert "no notes exist" in error(memory.call("readNote", {"key": "missing"}))
    ok(memory.call("note", {"key": 7, "summary": "s", "content": "c"}))
    assert "7" in memory.notes
    assert "mode" in error(memory.call("updateNote", {"key": "7", "mode": "merge", "new_content": "x"}))
    assert "mode" in error(memory.call("updateNote", {"key": "7", "new_content": "x"}))
    assert "new_content" in error(memory.call("updateNote", {"key": "7", "mode": "append"}))
    ok(memory.call("note", {"key": "big", "summary": "s", "content": "x" * 10_000}))
    assert "larger than" in error(memory.call("updateNote", {"key": "big", "mode": "append",
                                                             "new_content": "y" * 10_000}))
    assert memory.notes["big"]["content"] == "x" * 10_000  # unchanged by the refused append


def test_note_caps() -> None:
    memory = MemoryTools(lambda: {}, lambda msg_id: None)
    # The content cap is on the exact UTF-8 JSON size: many small items fit, and the edge is exact.
    numbers = list(range(2000))
    assert len(json.dumps(numbers)) < ctx.MAX_CONTENT_BYTES < 21 * len(numbers)
    ok(memory.call("note", {"key": "numbers", "summary": "", "content": numbers}))
    assert memory.notes["numbers"]["content"] == numbers
    ok(memory.call("note", {"key": "edge", "summary": "", "content": "x" * (ctx.MAX_CONTENT_BYTES - 2)}))
    assert "larger than" in error(memory.call("note", {"key": "edge", "summary": "",
                                                       "content": "x" * (ctx.MAX_CONTENT_BYTES - 1)}))
    assert "larger than" in error(memory.call("note", {"key": "edge", "summary": "", "content": "é" * 9000}))
    ok(memory.call("updateNote", {"key": "numbers", "mode": "delete"}))
    ok(memory.call("updateNote", {"key": "edge", "mode": "delete"}))
    for i in range(ctx.MAX_NOTES):
        ok(memory.call("note", {"key": f"k{i}", "summary": "", "content": i}))
    assert "256 notes" in error(memory.call("note", {"key": "one more", "summary": "", "content": 0}))
    ok(memory.call("note", {"key": "k0", "summary": "", "content": "still replaceable"}))
    assert len(memory.notes) == ctx.MAX_NOTES
    assert "..." in error(memory.call("readNote", {"key": "absent"}))  # a long list of keys is cut short


def test_delete_context_asks_deletable() -> None:
    asked: list[Any] = []

    def deletable(msg_id: int) -> str | None:
        asked.append(msg_id)
        return None if msg_id >= 2 else f"message {msg_id} is the system prompt or the task: it cannot be deleted"

    memory = MemoryTools(lambda: {}, deletable)
    assert ok(memory.call("deleteContext", {"msg_id": 5})) == {"status": "success", "deleted_msg_id": 5}
    assert ok(memory.call("deleteContext", {"msg_id": "7"}))["deleted_msg_id"] == 7
    assert "cannot be deleted" in error(memory.call("deleteContext", {"msg_id": 1}))
    assert "already deleted" in error(memory.call("deleteContext", {"msg_id": 5}))
    assert asked == [5, 7, 1] and all(type(m) is int for m in asked)
    for bad in (None, True, -1, "five", 2.5, 10**12, "9" * 100):
        assert "msg_id" in error(memory.call("deleteContext", {"msg_id": bad}))
    assert asked == [5, 7, 1]  # ill-typed ids never reach deletable
    assert memory.take_deletions() == [5, 7]
    assert memory.take_deletions() == []
    ok(memory.call("deleteContext", {"msg_id": 5}))  # a fresh take; the loop's deletable decides from here
    assert memory.take_deletions() == [5]


# -- hostile arguments ------------------------------------------------------------------------------------------


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_hostile_arguments_are_cheap_errors(document: str, codec: tuple[Any, Any]) -> None:
    tools = tools_for(document, codec)
    ok(tools.call("buildIndex", {"chunk_size": 64}))
    memory = MemoryTools(lambda: {}, lambda msg_id: None)
    huge = "z" * 10_000_000
    cases = [
        (tools, "searchEngine", {"keyword": huge}, "at most 512"),
        (tools, "searchEngine", {"keyword": ["a"] * 1_000_000}, "keyword"),
        (tools, "readChunk", {"chunk_id": 10**100}, "chunk_id"),
        (tools, "buildIndex", {"chunk_size": huge}, "integer"),
        (tools, "finish", {"answer": huge}, "at most"),
        (tools, "finish", {"answer": nested(100_000)}, "nested"),
        (tools, "searchEngine", {f"k{i}": i for i in range(100_000)}, "no argument"),
        (memory, "note", {"key": huge, "summary": "s", "content": "c"}, "at most 128"),
        (memory, "note", {"key": "k", "summary": huge, "content": "c"}, "at most 512"),
        (memory, "note", {"key": "k", "summary": "s", "content": huge}, "larger than"),
        (memory, "note", {"key": "k", "summary": "s", "content": nested(100_000)}, "nested"),
        (memory, "note", {"key": "k", "summary": "s", "content": list(range(1_000_000))}, "larger than"),
        (memory, "note", {"key": "k", "summary": "s", "content": {str(i): i for i in range(1_000_000)}},
         "larger than"),
        (memory, "note", {"key": "k", "summary": "s", "content": {"n": float("nan")}}, "not finite"),
        (memory, "note", {"key": "k", "summary": "s", "content": {1: "x"}}, "non-string"),
        (memory, "note", {"key": "k", "summary": "s", "content": {"x": {1, 2}}}, "JSON"),
        (memory, "note", {"key": "k", "summary": "s", "content": 10**40}, "too large"),
        (memory, "note", {"key": "k\udc00", "summary": "s", "content": "c"}, "surrogate"),
        (memory, "deleteContext", {"msg_id": huge}, "msg_id"),
    ]
    for target, name, arguments, expected in cases:
        start = time.perf_counter()
        message = error(target.call(name, arguments))
        assert time.perf_counter() - start < 0.5, (name, expected)
        assert expected in message, (message, expected)
        assert len(message) < 400
    assert memory.notes == {} and tools.answer is None
