"""awm_grpo.eval_bfcl: bfcl-eval's own generation and checker against our three kinds of target.

The BFCL venv (.venv-bfcl) is created through `bash setup.sh --bfcl` when missing or stale, so these
tests run on a fresh CI machine (PyPI needed once); they never skip.
"""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from awm_grpo import eval_bfcl
from awm_grpo.bfcl.chat_server import ChatServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bfcl_python() -> Path:
    """The BFCL venv's interpreter, installed by setup.sh's own flag (a no-op when up to date)."""
    done = subprocess.run(["bash", str(ROOT / "setup.sh"), "--bfcl"], capture_output=True, text=True)
    assert done.returncode == 0, f"bash setup.sh --bfcl failed:\n{done.stdout}\n{done.stderr}"
    python = ROOT / ".venv-bfcl" / "bin" / "python"
    assert python.exists()
    return python


def _score_file(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


# Hand-written answers (read off the task texts): simple_python_0 asks for the area of a triangle with
# base 10 and height 5; multi_turn_base_0 is four user turns on a file system. simple_python_1
# ("factorial of 5") gets a wrong argument on purpose.
SCRIPT = {
    "area of a triangle with a base of 10": [_call("calculate_triangle_area", base=10, height=5)],
    "factorial of 5": [_call("math_factorial", number=6)],
    "Move 'final_report.pdf' within document": [_call("cd", folder="document"), _call("mkdir", dir_name="temp"),
                                                 _call("mv", source="final_report.pdf", destination="temp")],
    "Perform a detailed search using grep": [_call("cd", folder="temp"),
                                             _call("grep", file_name="final_report.pdf", pattern="budget analysis")],
    "sort the 'final_report.pdf' by line": [_call("sort", file_name="final_report.pdf")],
    "Move 'previous_report.pdf' in document": [
        _call("cd", folder=".."), _call("mv", source="previous_report.pdf", destination="temp"),
        _call("cd", folder="temp"), _call("diff", file_name1="final_report.pdf", file_name2="previous_report.pdf")],
}


class ScriptedOpenAI:
    """A real OpenAI-compatible server on 127.0.0.1: the calls of SCRIPT for the user turn it matches,
    then (once the tool results are back) a plain answer that ends the turn; records every request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                scripted.requests.append(body)
                data = json.dumps(scripted.answer(body)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        calls = next((c for needle, c in SCRIPT.items() if needle in user), [])
        message: dict[str, Any] = {"role": "assistant", "content": "Done."}
        if messages[-1]["role"] == "user" and calls:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for i, c in enumerate(calls)]}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    def close(self) -> None:
        self.httpd.shutdown()


def test_openai_endpoint_correct_calls_score_one_through_bfcls_checker(bfcl_python, tmp_path, capsys):
    server = ScriptedOpenAI()
    try:
        assert eval_bfcl.main(["--openai-base-url", server.base_url, "--openai-model", "scripted", "--categories",
                               "simple", "multi_turn_base", "--limit", "2", "--concurrency", "1",
                               "--out", str(tmp_path), "--bfcl-python", str(bfcl_python)]) == 0
    finally:
        server.close()
    record = json.loads((tmp_path / "bfcl_results.json").read_text())
    simple, multi = record["categories"]["simple_python"], record["categories"]["multi_turn_base"]
    assert (simple["correct"], simple["total"]) == (1, 2)  # the triangle right, the factorial wrong
    assert (multi["correct"], multi["total"]) == (1, 2)  # multi_turn_base_0 scripted right, _1 not
    # bfcl's checker wrote the failures with its own error types; the right answers are not among them
    failures = _score_file(simple["score_file"])
    assert failures[0] == {"accuracy": 0.5, "correct_count": 1, "total_count": 2}
    assert [f["id"] for f in failures[1:]] == ["simple_python_1"]
    assert failures[1]["error_type"].startswith("value_error")
    assert "multi_turn_base_0" not in {f["id"] for f in _score_file(multi["score_file"])[1:]}
    # the calls ran on bfcl's stateful file system: grep's result came back as a tool message
    tool_texts = [m["content"] for r in server.requests for m in r["messages"] if m["role"] == "tool"]
    assert any("budget analysis" in t and "matching_lines" in t for t in tool_texts)
    assert "simple_python" in capsys.readouterr().out


@pytest.mark.slow
def test_checkpoint_on_the_cpu_engine_runs_every_requested_category(bfcl_python, tiny_model_dir, tmp_path):
    categories = ["simple_python", "multiple", "parallel", "multi_turn_base"]
    assert eval_bfcl.main(["--model", str(tiny_model_dir), "--categories", "simple", "multiple", "parallel",
                           "multi_turn_base", "--limit", "2", "--max-tokens-per-turn", "24",
                           "--out", str(tmp_path), "--bfcl-python", str(bfcl_python)]) == 0
    record = json.loads((tmp_path / "bfcl_results.json").read_text())
    assert record["target"]["kind"] == "checkpoint" and record["limit"] == 2
    assert sorted(record["categories"]) == sorted(categories)
    for name, row in record["categories"].items():
        assert (row["total"], row["requested"], row["inference_errors"]) == (2, 2, 0), name
        header = _score_file(row["score_file"])[0]  # written by bfcl's checker
        assert header["total_count"] == 2 and header["correct_count"] == row["correct"]
    multi = [json.loads(line) for line in Path(record["categories"]["multi_turn_base"]["result_file"])
             .read_text().splitlines()]
    # bfcl's multi-turn loop ran every user turn and logged its backends' state
    assert all(len(r["result"]) >= 1 for r in multi)
    assert any(step.get("role") == "state_info" for r in multi for log in r["inference_log"]
               if isinstance(log, list) for step in log)


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def test_chat_server_turns_tool_call_blocks_into_openai_tool_calls(tokenizer, tiny_model_dir, scripted):
    scripted.reset()
    scripted.reply('<tool_call>\n{"name": "ls", "arguments": {"a": true}}\n</tool_call>', "All done.")
    server = ChatServer(scripted.url, str(tiny_model_dir), max_new_tokens=64)
    url = server.start() + "/chat/completions"
    try:
        tools = [{"type": "function", "function": {"name": "ls", "description": "list",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        messages = [{"role": "user", "content": "list the files"}]
        choice = _post(url, {"model": "m", "messages": messages, "tools": tools})["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        calls = choice["message"]["tool_calls"]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("ls", {"a": True})]
        history = messages + [choice["message"], {"role": "tool", "content": "a.txt", "tool_call_id": calls[0]["id"]}]
        second = _post(url, {"model": "m", "messages": history, "tools": tools})["choices"][0]
        assert second["message"] == {"role": "assistant", "content": "All done."}
        bad = urllib.request.Request(url, json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode())
        with pytest.raises(urllib.error.HTTPError, match="400"):
            urllib.request.urlopen(bad, timeout=30)
    finally:
        server.shutdown()
    # the engine got the chat template's render: tools in the system turn, the call and its result
    sent = tokenizer.decode(scripted.requests[1]["input_ids"])
    assert '"name": "ls"' in sent and "<tool_response>\na.txt\n</tool_response>" in sent
    assert sent.endswith("<|im_start|>assistant\n")
    assert scripted.requests[1]["sampling_params"]["stop_token_ids"] == [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_unknown_category_says_what_exists():
    with pytest.raises(SystemExit, match="unsupported BFCL category 'memory_kv'"):
        eval_bfcl.resolve_categories(["memory_kv"])
    assert eval_bfcl.resolve_categories(["simple", "simple_python", "parallel"]) == ["simple_python", "parallel"]


def test_missing_bfcl_venv_names_the_setup_flag(tmp_path):
    with pytest.raises(SystemExit, match="bash setup.sh --bfcl"):
        eval_bfcl.main(["--openai-base-url", "http://127.0.0.1:9/v1", "--openai-model", "m",
                        "--bfcl-python", str(tmp_path / "none" / "python"), "--out", str(tmp_path)])
