"""Fetch the AgentWorldModel-1K release (about 500 MB of JSONL) from the Hugging Face Hub.

huggingface_hub does the transfer (parallel files, resume, progress bars, `HF_TOKEN`,
`HF_ENDPOINT` mirrors). We add what it leaves open: one repo-info call up front, so that a
missing network, a refused token or a file absent from the repo fails at once with a message
saying what to do (`snapshot_download` alone would fall back to whatever sits in `dest`),
and a check afterwards that every file landed and starts with a JSON line.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import httpx
from huggingface_hub import HfApi, constants, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RevisionNotFoundError,
)

log = logging.getLogger(__name__)

AWM1K_REPO = "Snowflake/AgentWorldModel-1K"
AWM1K_FILES = ("gen_scenario.jsonl", "gen_tasks.jsonl", "gen_db.jsonl", "gen_sample.jsonl", "gen_spec.jsonl",
               "gen_envs.jsonl", "gen_verifier.pure_code.jsonl", "gen_verifier.jsonl")
SQL_VERIFIER_FILE = "gen_verifier.jsonl"  # 248 MB, only read by the LLM-judge (sql) verifier mode


class DownloadError(RuntimeError):
    """The download failed for a reason the user can fix; the message says how."""


@dataclass(frozen=True)
class DownloadResult:
    """What landed on disk: file name -> size in bytes, and the commit it came from."""

    dest: Path
    files: dict[str, int]
    commit: str | None


def download_awm1k(dest: str | Path, *, repo_id: str = AWM1K_REPO, revision: str | None = None,
                   endpoint: str | None = None, token: str | None = None, files: list[str] | None = None,
                   include_sql_verifiers: bool = True) -> DownloadResult:
    """Download the AWM-1K JSONL files into `dest` (a plain folder, loadable by `AWMDataset`).

    `endpoint` defaults to $HF_ENDPOINT (a mirror), else huggingface.co; `token` to $HF_TOKEN or
    the stored login. `files` narrows the set; `include_sql_verifiers=False` drops
    gen_verifier.jsonl either way. Files already in `dest` at the same commit are not fetched again.
    """
    dest = Path(dest).expanduser().resolve()
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    names = [n for n in (AWM1K_FILES if files is None else files) if include_sql_verifiers or n != SQL_VERIFIER_FILE]
    if not names:
        raise ValueError("no files to download: `files` is empty after dropping gen_verifier.jsonl")
    where = f"dataset {repo_id} (revision {revision or 'main'}) on {endpoint}"
    try:
        info = HfApi(endpoint=endpoint, token=token).dataset_info(
            repo_id, revision=revision, timeout=constants.HF_HUB_ETAG_TIMEOUT)
        if info.siblings is not None:  # a mirror may omit the listing; the check below still runs
            absent = [n for n in names if n not in {s.rfilename for s in info.siblings}]
            if absent:
                raise DownloadError(f"{where} has no file {', '.join(absent)}: check `files` and `revision`")
        log.info("downloading %d files of %s (commit %s) into %s", len(names), where, info.sha, dest)
        snapshot_download(repo_id, repo_type="dataset", revision=info.sha, local_dir=dest,
                          allow_patterns=names, endpoint=endpoint, token=token)
    except (httpx.HTTPError, OfflineModeIsEnabled, LocalEntryNotFoundError) as exc:
        raise _explain(exc, where, endpoint, dest, names) from exc
    return DownloadResult(dest=dest, files={n: _check_jsonl(dest / n) for n in names}, commit=info.sha)


def _explain(exc: Exception, where: str, endpoint: str, dest: Path, names: list[str]) -> DownloadError:
    """Turn a huggingface_hub / httpx failure into a message that says what to do next."""
    if isinstance(exc, LocalEntryNotFoundError) and isinstance(exc.__cause__, HfHubHTTPError):
        exc = exc.__cause__  # hf_hub_download wraps HTTP errors on a file (e.g. a plain 403) this way
    if isinstance(exc, RevisionNotFoundError):
        return DownloadError(f"{where}: this revision does not exist; pass a branch, tag or commit of the data set")
    if isinstance(exc, RemoteEntryNotFoundError):
        return DownloadError(f"{where}: {exc.response.url} vanished during the download; retry, or pin "
                             "`revision` to a commit")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return DownloadError(f"{where} refused access (HTTP {status}): set HF_TOKEN (or pass token=) to a "
                                 "token that can read this data set, and accept its terms on the Hub if it is gated")
        if status == 404:
            return DownloadError(f"{where} was not found (HTTP 404): check repo_id, and that the endpoint mirrors "
                                 "Hugging Face data sets")
        return DownloadError(f"{where} failed with HTTP {status}: retry later or set HF_ENDPOINT to a mirror ({exc})")
    offline = " (HF_HUB_OFFLINE is set)" if isinstance(exc, OfflineModeIsEnabled) else ""
    return DownloadError(f"cannot reach {endpoint}{offline}; set HF_ENDPOINT to a mirror or copy the files into "
                         f"{dest} by hand (file names: {', '.join(names)}). Cause: {type(exc).__name__}: {exc}")


def _check_jsonl(path: Path) -> int:
    """Return the size of a downloaded file after checking it is non-empty JSONL; raise otherwise."""
    if not path.is_file():
        raise DownloadError(f"{path} is missing after the download: re-run it, or copy the file in by hand")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        first = fh.readline()
    try:
        ok = size > 0 and isinstance(json.loads(first), dict)
    except ValueError:
        ok = False
    if not ok:
        raise DownloadError(f"{path} is empty or its first line is not a JSON object: delete it and download "
                            "again")
    return size
