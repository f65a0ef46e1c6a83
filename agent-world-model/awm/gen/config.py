"""Settings of one synthesis run, and the file each stage writes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

STAGE_ORDER = ("scenario", "task", "db", "sample", "spec", "env", "verifier")
# Output file of each stage (the names AWMDataset reads; the verifier stage writes code mode).
STAGE_FILES = {
    "scenario": "gen_scenario.jsonl",
    "task": "gen_tasks.jsonl",
    "db": "gen_db.jsonl",
    "sample": "gen_sample.jsonl",
    "spec": "gen_spec.jsonl",
    "env": "gen_envs.jsonl",
    "verifier": "gen_verifier.pure_code.jsonl",
}
SQL_VERIFIER_FILE = "gen_verifier.jsonl"  # sql mode: evidence programs for the LLM judge
VERIFIER_MODES = ("code", "sql")
# Not an AWM stage name, so the data loader never mistakes rejects for records.
REJECTS_FILE = "rejects.jsonl"
SUMMARY_FILE = "gen_summary.json"
TASKS_PER_SCENARIO = 10


@dataclasses.dataclass
class GenConfig:
    """One typed place for every knob of `awm gen` (the CLI fills it from flags)."""

    output_dir: Path
    model: str = ""
    temperature: float = 1.0
    max_tokens: int = 16384
    retries: int = 3  # validation retries per record, after the first attempt
    concurrency: int = 8  # records in flight per stage
    env_concurrency: int = 2  # environment validations at once (each starts a worker process)
    scenarios: tuple[str, ...] = ()  # only these scenarios (default: all available)
    # scenario stage
    count: int = 10  # scenarios wanted in gen_scenario.jsonl
    batch: int = 5  # scenarios asked for per call
    max_rounds: int = 0  # 0: 3 x the rounds the count needs
    seeds: Path | None = None  # JSONL of {name, description}: few-shot examples
    embedding_model: str = ""  # set: also de-duplicate by embedding cosine
    embed_threshold: float = 0.85
    # validation
    insert_failure_threshold: float = 0.1  # upstream's limit on failed / total INSERTs
    tool_timeout_s: float = 10.0
    load_timeout_s: float = 60.0
    verifier_timeout_s: float = 10.0
    verifier_mode: str = "code"  # code: verify_task_completion -> verdict; sql: verify_task -> evidence
    retry_rejected: bool = False  # re-attempt keys already in rejects.jsonl
    progress: bool = True

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if not 0 <= self.insert_failure_threshold < 1:
            raise ValueError("insert_failure_threshold must be in [0, 1)")
        if not 0 < self.embed_threshold <= 1:
            raise ValueError("embed_threshold must be in (0, 1]")
        if self.verifier_mode not in VERIFIER_MODES:
            raise ValueError(f"verifier_mode must be one of {VERIFIER_MODES}, got {self.verifier_mode!r}")

    def path(self, stage: str) -> Path:
        if stage == "verifier" and self.verifier_mode == "sql":
            return self.output_dir / SQL_VERIFIER_FILE
        return self.output_dir / STAGE_FILES[stage]

    def reject_label(self, stage: str) -> str:
        """The `stage` field of this stage's rows in rejects.jsonl (sql verifiers are kept apart)."""
        return "verifier.sql" if stage == "verifier" and self.verifier_mode == "sql" else stage
