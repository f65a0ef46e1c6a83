"""download_awm1k against a fake Hugging Face Hub served on 127.0.0.1.

The fake speaks the part of the Hub protocol that huggingface_hub (1.x) uses for a data set
snapshot: repo info (`sha`, `siblings`), the recursive tree listing, and `resolve` with HEAD
and GET. Small files answer HEAD with 200 + ETag + Content-Length + X-Repo-Commit, like git
files; the others, like LFS files, answer with a 302 to a "CDN" on another host name
(`localhost`) carrying X-Linked-Etag / X-Linked-Size, and the CDN serves the bytes without
auth. File contents are the real AWM-1K records in ../shared/awm_1k_excerpt, read in place.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from awm.data import AWMDataset
from awm.download import AWM1K_FILES, AWM1K_REPO, DownloadError, download_awm1k
from huggingface_hub import constants

EXCERPT = Path(__file__).resolve().parents[2].parent / "shared" / "awm_1k_excerpt"


@pytest.fixture(autouse=True)
def _excerpt_present() -> None:
    if not EXCERPT.is_dir():
        pytest.fail(f"AWM-1K excerpt not found at {EXCERPT}: the shared folder beside the repository holds it")

COMMIT = "0123456789abcdef0123456789abcdef01234567"
GIT_FILES = {"gen_scenario.jsonl", "gen_tasks.jsonl"}  # everything else is served the LFS way
# Invented for this test (no sql-mode row is in the excerpt).
SQL_VERIFIER_ROW = {
    "scenario": "e_commerce_33",
    "task_idx": 0,
    "task": "invented task",
    "verification": {
        "code": "def verify_task(initial_db_path, final_db_path):\n    return {'result': 'others'}\n",
        "raw_response": "{}",
    },
}

API_INFO = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
API_TREE = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)$")
RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
CDN = re.compile(r"^/cdn/(?P<sha256>[0-9a-f]{64})$")


def awm_files() -> dict[str, bytes]:
    """The eight release files: the excerpt's per-scenario shards concatenated, plus one invented sql row."""

    def joined(stage: str) -> bytes:
        parts = [p.read_bytes() for p in sorted(EXCERPT.glob(f"{stage}*.jsonl"))]
        return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in parts)

    out = {name: joined(name.removesuffix(".jsonl")) for name in AWM1K_FILES if name != "gen_verifier.jsonl"}
    out["gen_verifier.jsonl"] = (json.dumps(SQL_VERIFIER_ROW) + "\n").encode()
    return out


class FakeHub:
    """One data set repo at one commit, served over HTTP; `requests` logs (method, path)."""

    def __init__(
        self, files: dict[str, bytes], token: str | None = None, files_forbidden: bool = False
    ) -> None:
        self.files, self.token, self.files_forbidden = files, token, files_forbidden
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub.handle(self, head=False)

            def do_HEAD(self) -> None:
                hub.handle(self, head=True)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _send(
        req: BaseHTTPRequestHandler, status: int, body: bytes = b"", head: bool = False, **headers: str
    ) -> None:
        req.send_response(status)
        headers.setdefault("Content-Length", str(len(body)))
        for key, value in headers.items():
            req.send_header(key.replace("_", "-"), value)
        req.end_headers()
        if not head:
            req.wfile.write(body)

    def handle(self, req: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlsplit(req.path).path)
        self.requests.append((req.command, path))
        if m := CDN.match(path):  # signed-URL storage: no auth, just bytes
            body = next(b for b in self.files.values() if hashlib.sha256(b).hexdigest() == m["sha256"])
            return self._send(req, 200, body, head)
        if self.token and req.headers.get("authorization") != f"Bearer {self.token}":
            return self._send(req, 401, b'{"error": "unauthorized"}', head)
        m = API_INFO.match(path) or API_TREE.match(path) or RESOLVE.match(path)
        if m is None or m["repo"] != AWM1K_REPO:
            return self._send(req, 404, head=head, X_Error_Code="RepoNotFound")
        if (m["rev"] or "main") not in ("main", COMMIT):
            return self._send(req, 404, head=head, X_Error_Code="RevisionNotFound")
        if m.re is API_INFO:
            info = {
                "id": AWM1K_REPO,
                "sha": COMMIT,
                "private": False,
                "siblings": [{"rfilename": n} for n in [".gitattributes", *self.files]],
            }
            return self._send(req, 200, json.dumps(info).encode(), head, Content_Type="application/json")
        if m.re is API_TREE:
            return self._send(
                req,
                200,
                json.dumps([self._tree_entry(n) for n in self.files]).encode(),
                head,
                Content_Type="application/json",
            )
        if self.files_forbidden:  # e.g. a gated repo whose terms were not accepted: info is public, files not
            return self._send(req, 403, head=head)
        body = self.files.get(m["file"])
        if body is None:
            return self._send(req, 404, head=head, X_Error_Code="EntryNotFound", X_Repo_Commit=COMMIT)
        entry = self._tree_entry(m["file"])
        if "lfs" in entry:
            return self._send(
                req,
                302,
                head=head,
                Location=f"http://localhost:{self.port}/cdn/{entry['lfs']['oid']}",
                X_Repo_Commit=COMMIT,
                ETag=f'"{entry["oid"]}"',
                X_Linked_Etag=f'"{entry["lfs"]["oid"]}"',
                X_Linked_Size=str(len(body)),
            )
        return self._send(req, 200, body, head, X_Repo_Commit=COMMIT, ETag=f'"{entry["oid"]}"')

    def _tree_entry(self, name: str) -> dict:
        body = self.files[name]
        entry = {
            "type": "file",
            "path": name,
            "size": len(body),
            "oid": hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest(),
        }
        if name not in GIT_FILES:
            entry["lfs"] = {"oid": hashlib.sha256(body).hexdigest(), "size": len(body), "pointerSize": 134}
        return entry

    def fetched(self) -> list[str]:
        """Paths whose bytes were sent (GETs of files), in request order."""
        return [p for m, p in self.requests if m == "GET" and (p.startswith("/cdn/") or "/resolve/" in p)]


@pytest.fixture(autouse=True)
def isolated_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep huggingface_hub away from ~/.cache, stored tokens and the real Hub."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    # constants are read at import time, so the env vars alone come too late.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 2)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 5)


@pytest.fixture
def hub():
    server = FakeHub(awm_files())
    yield server
    server.close()


def test_downloads_every_file_byte_for_byte(hub: FakeHub, tmp_path: Path) -> None:
    dest = tmp_path / "awm"

    result = download_awm1k(dest, endpoint=hub.url)

    assert result.dest == dest.resolve() and result.commit == COMMIT
    assert set(result.files) == set(AWM1K_FILES)
    for name, body in hub.files.items():
        assert (dest / name).read_bytes() == body, name
        assert result.files[name] == len(body)
    assert sum(p.startswith("/cdn/") for p in hub.fetched()) == 6  # the LFS redirect was followed


def test_second_download_fetches_nothing(hub: FakeHub, tmp_path: Path) -> None:
    download_awm1k(tmp_path / "awm", endpoint=hub.url)
    hub.requests.clear()

    result = download_awm1k(tmp_path / "awm", endpoint=hub.url)

    assert hub.fetched() == [] and len(result.files) == 8


def test_without_sql_verifiers_skips_gen_verifier(hub: FakeHub, tmp_path: Path) -> None:
    result = download_awm1k(tmp_path / "awm", endpoint=hub.url, include_sql_verifiers=False)

    assert "gen_verifier.jsonl" not in result.files
    assert not (tmp_path / "awm" / "gen_verifier.jsonl").exists()
    assert (tmp_path / "awm" / "gen_verifier.pure_code.jsonl").read_bytes() == hub.files[
        "gen_verifier.pure_code.jsonl"
    ]
    assert not any("gen_verifier.jsonl" in p for _, p in hub.requests)


def test_hf_endpoint_env_var_selects_the_mirror(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)

    result = download_awm1k(tmp_path / "awm", files=["gen_tasks.jsonl"])

    assert result.files == {"gen_tasks.jsonl": len(hub.files["gen_tasks.jsonl"])}


def test_unreachable_endpoint_says_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()

    with pytest.raises(DownloadError) as err:
        download_awm1k(tmp_path / "awm", endpoint=f"http://127.0.0.1:{port}")

    msg = str(err.value)
    assert time.monotonic() - start < 5
    assert f"cannot reach http://127.0.0.1:{port}" in msg and "set HF_ENDPOINT to a mirror" in msg
    assert str((tmp_path / "awm").resolve()) in msg and "gen_verifier.pure_code.jsonl" in msg


def test_401_asks_for_a_token_and_the_token_works(tmp_path: Path) -> None:
    hub = FakeHub(awm_files(), token="hf_right")
    try:
        with pytest.raises(DownloadError, match="HTTP 401.*set HF_TOKEN"):
            download_awm1k(tmp_path / "awm", endpoint=hub.url)
        result = download_awm1k(
            tmp_path / "awm", endpoint=hub.url, token="hf_right", files=["gen_envs.jsonl"]
        )
    finally:
        hub.close()
    assert result.files == {"gen_envs.jsonl": len(hub.files["gen_envs.jsonl"])}


def test_403_on_the_files_asks_for_a_token(tmp_path: Path) -> None:
    hub = FakeHub(awm_files(), files_forbidden=True)
    try:
        with pytest.raises(DownloadError, match="HTTP 403.*set HF_TOKEN"):
            download_awm1k(tmp_path / "awm", endpoint=hub.url, files=["gen_tasks.jsonl"])
    finally:
        hub.close()


def test_file_missing_from_repo_is_named(tmp_path: Path) -> None:
    files = awm_files()
    del files["gen_spec.jsonl"]
    hub = FakeHub(files)
    try:
        with pytest.raises(DownloadError, match=r"has no file gen_spec\.jsonl"):
            download_awm1k(tmp_path / "awm", endpoint=hub.url)
    finally:
        hub.close()
    assert hub.fetched() == []


def test_unknown_revision_is_named(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match=r"revision v9\) on .*this revision does not exist"):
        download_awm1k(tmp_path / "awm", endpoint=hub.url, revision="v9")


def test_a_file_that_is_not_jsonl_is_reported(tmp_path: Path) -> None:
    hub = FakeHub({**awm_files(), "gen_tasks.jsonl": b"<html>mirror error page</html>\n"})
    try:
        with pytest.raises(DownloadError, match=r"gen_tasks\.jsonl is empty or its first line is not a JSON"):
            download_awm1k(tmp_path / "awm", endpoint=hub.url, files=["gen_tasks.jsonl"])
    finally:
        hub.close()


def test_downloaded_folder_loads_as_a_dataset(hub: FakeHub, tmp_path: Path) -> None:
    result = download_awm1k(tmp_path / "awm", endpoint=hub.url)

    summary = AWMDataset(result.dest, cache_dir=tmp_path / "awm-cache").summary()

    # 3 scenarios named only in gen_scenario, 3 in gen_tasks, plus communication_messaging_1 (envs/sample only).
    assert summary["scenarios"] == 7
    # content_platform_1 and code_hosting_2 have tasks, schema and environment code.
    assert summary["runnable_scenarios"] == 2
    assert set(summary["files"]) == {n.removesuffix(".jsonl") for n in AWM1K_FILES}
