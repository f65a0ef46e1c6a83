"""The trajectory viewer's data and JSON API: a real run directory (viewer_run.py), a real aiohttp server.

The per-turn database view is checked on episode A of the run: list tools, check out copy 1, return
it, check out again, answer. Its progress predicates (an active loan of copy 1; copy 1 on loan) give
Phi_0 = 0 and Phi = 0, 1, 0, 1 after the four tool turns.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from viewer_run import make_run

from awm_grpo.traces import main as traces_main
from awm_grpo.viewer.server import make_app
from awm_grpo.viewer.store import RunStore, TraceError, find_runs, trace_file, turn_views

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_root(tmp_path_factory, tiny_model_dir, scripted) -> Path:
    return make_run(tmp_path_factory.mktemp("viewer-run"), tiny_model_dir, scripted)


def test_file_names_give_series_and_step():
    assert trace_file("rollout_000012.jsonl").series == "rollout" and trace_file("rollout_000012.jsonl").step == 12
    assert (trace_file("eval_val_000004.jsonl").series, trace_file("eval_val_000004.jsonl").step) == ("eval val", 4)
    assert (trace_file("my_eval.jsonl").series, trace_file("my_eval.jsonl").step) == ("my_eval", None)


def test_turn_views_derive_what_each_turn_did_to_the_db():
    record = {"recovery": {"phi0": 0.0}, "turns": [
        {"turn": 1, "state": {"state_hash": "h0", "changes": {}}, "progress": {"phi": 0.0, "phi_b": 0.0, "rows": {}}},
        {"turn": 2, "state": {"state_hash": "h1", "changes": {"loans": {"added": 1}}},
         "progress": {"phi": 0.5, "phi_b": 0.0, "rows": {"loans": {"inserted": ["[15]"]}}}},
        {"turn": 3, "state": {"state_hash": "h1", "changes": {"loans": {"added": 1}}},
         "progress": {"phi": 0.5, "phi_b": 0.0, "rows": {}}},
        {"turn": 4, "state": {"state_hash": "h2", "changes": {"loans": {"added": 1}, "copies": {"changed": 1}}},
         "progress": {"phi": 0.25, "phi_b": 0.0, "rows": {}}},
        {"turn": 5, "assistant": "done"}]}
    views = turn_views(record)
    assert [v.get("state_changed") for v in views] == [False, True, False, True, None]
    assert [v.get("tables_changed") for v in views] == [[], ["loans"], [], ["copies"], None]
    assert [v.get("phi_delta") for v in views] == [0.0, 0.5, 0.0, -0.25, None]
    assert views[1]["rows"] == {"loans": {"inserted": ["[15]"]}} and views[4] == {"turn": 5}


def test_runs_are_found_below_the_root_and_a_bad_root_says_what_to_pass(run_root, tmp_path):
    assert list(find_runs(run_root)) == ["traces"]
    assert list(find_runs(run_root / "traces")) == ["."]
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "awm/episodes": 4}\n')  # not a trace file
    (tmp_path / "live.jsonl").write_text('{"step": 0, "scenario": "library_lending_1", "turns": 3}\n')  # live view
    assert find_runs(tmp_path) == {}
    with pytest.raises(TraceError, match="pass a run directory"):
        find_runs(tmp_path / "missing")


def test_store_summarises_steps_curves_and_filters_of_the_real_run(run_root):
    summary = RunStore(run_root).summary("traces")
    assert [(f["name"], f["step"], f["episodes"]) for f in summary["files"]] == [
        ("rollout_000000.jsonl", 0, 2), ("rollout_000001.jsonl", 1, 2)]
    curve = summary["curves"]["rollout"]
    assert [(p["step"], p["episodes"], p["success_rate"]) for p in curve] == [(0, 2, 0.5), (1, 2, 0.0)]
    assert [p["reward_mean"] for p in curve] == [0.5, 0.0]  # complete 1, others 0
    assert summary["tasks"]["library_lending_1#0"].startswith("How many copies of 'The Left Hand of Darkness'")
    assert "task" not in summary["episodes"][0]  # each task's text once, in `tasks`
    assert summary["facets"]["task_type"] == ["info_seeking", "state_mutating"]
    assert summary["facets"]["outcome"] == ["success", "failure"]
    assert [(r["task_idx"], r["outcome"], r["turns"]) for r in summary["episodes"]] == [
        (3, "failure", 5), (3, "success", 2), (3, "failure", 2), (0, "failure", 2)]


def test_an_eval_out_file_is_a_run_of_its_own_series(run_root, tmp_path):
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "test_split.jsonl").write_text((run_root / "traces" / "rollout_000001.jsonl").read_text())
    summary = RunStore(tmp_path).summary("evals")
    assert [(f["series"], f["step"]) for f in summary["files"]] == [("test_split", None)]
    # no step in the name: the records' own step (the engine's weight version: the scripted engine says 0)
    assert summary["curves"] == {"test_split": [{"step": 0, "episodes": 2, "infra": 0, "success_rate": 0.0,
                                                 "reward_mean": 0.0}]}


def test_episode_a_shows_phi_and_row_changes_turn_by_turn(run_root):
    ep = RunStore(run_root).episode("traces", "rollout_000000.jsonl:0")
    views = ep["turns"]
    assert [v.get("phi") for v in views] == [0.0, 1.0, 0.0, 1.0, None]
    assert [v.get("phi_delta") for v in views] == [0.0, 1.0, -1.0, 1.0, None]
    assert [v.get("state_changed") for v in views] == [False, True, True, True, None]
    assert "loans" in views[1]["tables_changed"] and views[1]["rows"]["loans"]["inserted"]
    assert views[2]["rows"]["loans"]["updated"] == ["[14]"]  # the return closes loan 14
    assert ep["record"]["turns"][1]["calls"][0]["name"] == "checkout_copy"


async def _serve_and_get(root: Path, paths: list[str]) -> list[tuple[int, object]]:
    from aiohttp import web

    runner = web.AppRunner(make_app(root))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    out = []
    try:
        async with aiohttp.ClientSession() as http:
            for path in paths:
                async with http.get(f"http://127.0.0.1:{port}{path}") as resp:
                    body = await resp.json() if resp.content_type == "application/json" else await resp.text()
                    out.append((resp.status, body))
    finally:
        await runner.cleanup()
    return out


def test_json_api_over_a_real_server(run_root):
    answers = asyncio.run(_serve_and_get(run_root, [
        "/api/runs", "/api/run?run=traces", "/api/episode?run=traces&id=rollout_000001.jsonl:1",
        "/api/episode?run=traces&id=rollout_000001.jsonl:9", "/api/run?run=nope", "/api/episode?run=traces",
        "/", "/static/app.js"]))
    (s1, runs), (s2, run), (s3, ep), (s4, missing), (s5, norun), (s6, noid), (s7, page), (s8, js) = answers
    assert s1 == 200 and runs["runs"] == ["traces"]
    assert s2 == 200 and len(run["episodes"]) == 4 and run["curves"]["rollout"][0]["success_rate"] == 0.5
    assert s3 == 200 and ep["record"]["task_type"] == "info_seeking" and ep["record"]["task_idx"] == 0
    assert (ep["series"], ep["step"]) == ("rollout", 1)  # the file's step, as the list shows it
    assert s4 == 404 and "has 2 episodes, no line 9" in missing["error"]
    assert s5 == 404 and "no run 'nope'" in norun["error"]
    assert s6 == 400 and "'id'" in noid["error"]
    assert s7 == 200 and "AWM trajectory viewer" in page and '<script src="/static/app.js">' in page
    assert s8 == 200 and "async function api" in js


def test_a_long_run_is_sent_gzipped_and_a_growing_file_is_read_again(run_root, tmp_path):
    """A run of many episodes: the page data goes gzipped to a client that accepts it (its decoded body is the
    plain answer), the summary cache notices a file that grew, and a record with NaN (which `json.dumps` writes
    and orjson refuses) still loads, sent as null."""
    lines = (run_root / "traces" / "rollout_000000.jsonl").read_text().splitlines()
    run = tmp_path / "run"
    run.mkdir()
    (run / "rollout_000000.jsonl").write_text("\n".join(lines * 50) + "\n")
    store = RunStore(run)
    assert store.summary(".")["files"][0]["episodes"] == 100
    record = json.loads(lines[0])
    record["reward"] = float("nan")
    with open(run / "rollout_000000.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    summary = store.summary(".")
    assert summary["files"][0]["episodes"] == 101 and len(summary["episodes"]) == 101
    with open(run / "rollout_000001.jsonl", "w") as f:  # the next step's file, caught in the middle of its write
        f.write(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    assert [f["episodes"] for f in store.summary(".")["files"]] == [101, 1]
    with open(run / "rollout_000001.jsonl", "a") as f:
        f.write(lines[1][len(lines[1]) // 2:] + "\n")
    assert [f["episodes"] for f in store.summary(".")["files"]] == [101, 2]
    (run / "rollout_000001.jsonl").unlink()

    async def get(encoding: str) -> tuple[str, bytes]:
        from aiohttp import web

        runner = web.AppRunner(make_app(run))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession(auto_decompress=False) as http:
                async with http.get(f"http://127.0.0.1:{port}/api/run?run=.", headers={"Accept-Encoding": encoding}) as r:
                    return r.headers.get("Content-Encoding", "identity"), await r.read()
        finally:
            await runner.cleanup()

    (plain_encoding, plain), (gzip_encoding, packed) = asyncio.run(get("identity")), asyncio.run(get("gzip"))
    assert (plain_encoding, gzip_encoding) == ("identity", "gzip")
    assert gzip.decompress(packed) == plain and len(packed) < len(plain) / 4
    answer = json.loads(plain)
    assert len(answer["episodes"]) == 101 and answer["episodes"][-1]["reward"] is None
    assert traces_main(["export", str(run), str(tmp_path / "out"), "--max-episodes", "3"]) == 0  # NaN there too
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    data = json.loads(page.split('<script type="application/json" id="awm-data">')[1].split("</script>")[0])
    assert data["summaries"]["."]["curves"]["rollout"][0]["reward_mean"] is None  # NaN in the mean: null
    assert len(data["summaries"]["."]["episodes"]) == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_starts_the_viewer_on_loopback(run_root):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "awm_grpo.traces", "serve", str(run_root), "--port", str(port)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, body = time.monotonic() + 30, None
        while time.monotonic() < deadline and body is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=2) as resp:
                    body = json.loads(resp.read())
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.3)
        assert body is not None and body["runs"] == ["traces"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_serve_on_a_taken_port_says_to_pick_another(run_root, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert traces_main(["serve", str(run_root), "--port", str(taken.getsockname()[1])]) == 1
    assert "pick another with --port" in capsys.readouterr().err


def test_export_writes_one_self_contained_page(run_root, tmp_path, capsys):
    assert traces_main(["export", str(run_root), str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    assert "/static/" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")  # offline
    block = page.split('<script type="application/json" id="awm-data">')[1].split("</script>")[0]
    data = json.loads(block)
    assert data["runs"] == ["traces"] and len(data["episodes"]["traces"]) == 4
    assert data["episodes"]["traces"]["rollout_000000.jsonl:0"]["turns"][1]["phi"] == 1.0


def test_summary_command_tables_success_by_scenario_and_task_type(run_root, tmp_path, capsys):
    assert traces_main(["summary", str(run_root / "traces")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["library_lending_1", "4", "1", "0.25", "0"]  # episodes, successes, rate, infra
    assert {tuple(line.split()[:3]) for line in out[4:]} == {("info_seeking", "1", "0"), ("state_mutating", "3", "1")}
    assert traces_main(["summary", str(tmp_path)]) == 1 and "no trace records" in capsys.readouterr().err


def test_serve_and_export_refuse_a_folder_without_traces(tmp_path, capsys):
    assert traces_main(["export", str(tmp_path), str(tmp_path / "out")]) == 1
    assert "no trace files under" in capsys.readouterr().err
