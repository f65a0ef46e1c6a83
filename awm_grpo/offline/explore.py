"""Exploration for the offline methods: a checkpoint plays prompt records through the training rollout.

The episodes run exactly as a GRPO step's do (`awm_grpo.eval.policy_runtime` + `play_records`: a CPU
engine serves the checkpoint in this process, `awm_grpo.rollout.generate` plays token-in/token-out,
the same runtime YAML), at the rollout temperature and seed given. Each episode is kept as a
`Trajectory`: the token ids the model saw and produced, the loss mask (1 on the model's tokens, 0 on
tool observations), the engine's log-probs of its tokens, the verdict and the reward
(`awm_grpo.reward.score`). An infrastructure failure (environment or verifier crash / timeout, an engine
abort) is not the agent's doing: it is counted and dropped, never labelled a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from awm_grpo import reward, traces
from awm_grpo.eval import play_records, policy_runtime
from slime.utils.types import Sample

RUNTIME_YAML = "awm_runtime.yaml"


@dataclass
class Trajectory:
    """One played episode, as trained on: `sample` holds tokens, loss_mask, response_length and
    rollout_log_probs (slime's Sample, the structure awm_grpo.warmstart.sft trains on)."""

    sample: Sample
    scenario: str
    task_idx: int
    verdict: str | None
    reward: float
    stop_reason: str
    turns: int

    @property
    def task(self) -> tuple[str, int]:
        return self.scenario, self.task_idx

    @property
    def success(self) -> bool:
        """Verified success: the task's verifier said `complete`."""
        return self.verdict == "complete"

    def record(self) -> dict[str, Any]:
        """What the run's JSON keeps of it (no token ids)."""
        s = self.sample
        return {"scenario": self.scenario, "task_idx": self.task_idx, "index": s.index, "verdict": self.verdict,
                "reward": self.reward, "stop_reason": self.stop_reason, "turns": self.turns,
                "tokens": len(s.tokens), "model_tokens": int(sum(s.loss_mask or []))}


@dataclass
class Exploration:
    """The kept trajectories of one exploration, in play order, and what was dropped."""

    trajectories: list[Trajectory] = field(default_factory=list)
    played: int = 0
    infra_failures: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def successes(self) -> int:
        return sum(t.success for t in self.trajectories)

    def summary(self) -> dict[str, Any]:
        kept = len(self.trajectories)
        return {"played": self.played, "kept": kept, "infra_failures": len(self.infra_failures),
                "successes": self.successes, "success_rate": self.successes / kept if kept else None,
                "mean_reward": sum(t.reward for t in self.trajectories) / kept if kept else None,
                "wall_s": round(self.wall_s, 1)}


def read_prompts(path: str | Path, limit: int = 0) -> list[dict[str, Any]]:
    """The prompt records of an awm_grpo.data_prep split (first `limit` only when > 0)."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--prompts {path} does not exist: write the splits with `python -m awm_grpo.data_prep "
                         "--out DIR` and pass DIR/train.jsonl")
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--prompts {path} is not JSONL ({exc}): pass a split of awm_grpo.data_prep") from None
    if limit:
        records = records[:limit]
    if not records:
        raise SystemExit(f"--prompts {path} holds no task: pass a non-empty split of awm_grpo.data_prep")
    for record in records:
        meta = record.get("metadata") if isinstance(record, dict) else None
        if not isinstance(meta, dict) or "scenario" not in meta or "task_idx" not in meta or "text" not in record:
            raise SystemExit(f"--prompts {path}: a record without text / metadata.scenario / metadata.task_idx; "
                             "pass a split of awm_grpo.data_prep")
    return records


def check_checkpoint(path: str | Path) -> Path:
    """An HF model folder, or a clear stop."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise SystemExit(f"--model {path} is not a Hugging Face model folder (no config.json): build a warm start "
                         "with `python -m awm_grpo.warmstart --data SPLITS --out DIR` and pass DIR")
    return path


def runtime_config(config: str | None, data_dir: str | None) -> dict[str, Any]:
    """The runtime YAML's awm_* keys: `config` (e.g. a GRPO run's SAVE_DIR/awm_runtime.yaml), or the ones the
    launcher writes for a CPU run (`run_awm_grpo.sh --profile cpu`, environment variables applied), so the
    episodes here play under the keys GRPO trains under. `data_dir` sets awm_data_dir; traces are off."""
    if config:
        if not Path(config).is_file():
            raise SystemExit(f"--config {config} does not exist: pass a runtime YAML (a GRPO run writes "
                             "SAVE_DIR/awm_runtime.yaml) or leave it out for the CPU profile's keys")
        import yaml

        keys = yaml.safe_load(Path(config).read_text()) or {}
    else:
        from awm_grpo.launch.config import ConfigError, resolve
        from awm_grpo.launch.job import runtime_config as launcher_keys

        try:
            keys = launcher_keys(resolve(None, sets={"hardware.profile": "cpu"}))
        except ConfigError as exc:
            raise SystemExit(f"the CPU profile's runtime keys: {exc}") from None
    if data_dir is not None:
        keys["awm_data_dir"] = data_dir
    keys["awm_trace_dir"] = None
    if keys.get("awm_history_window_turns") is not None:
        raise SystemExit("awm_history_window_turns (B1's window) splits an episode into samples; the offline methods "
                         "train whole episodes: set it to null in the runtime YAML")
    return keys


def check_data_dir(records: list[dict[str, Any]], data_dir: str | None) -> None:
    """The prompts' tasks must be the environments' tasks: a split of the practice set played against the
    bundled data (or the reverse) would open other tasks under the same scenario names."""
    from awm.data import bundled_data_dir

    played = Path(data_dir or bundled_data_dir()).resolve()
    written = {str(r["metadata"]["data_dir"]) for r in records if r["metadata"].get("data_dir")}
    other = sorted(w for w in written if Path(w).is_dir() and Path(w).resolve() != played)  # moved splits: no check
    if other:
        raise SystemExit(f"the prompts were written from {other[0]} but the episodes would play {played}: pass "
                         f"--data-dir {other[0]} (or a runtime YAML whose awm_data_dir is it)")


def write_runtime_config(out: Path, keys: dict[str, Any]) -> Path:
    """OUT/awm_runtime.yaml: the keys the episodes were played with, for `python -m awm_grpo.eval --config`."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    path = out / RUNTIME_YAML
    path.write_text(yaml.safe_dump(keys, sort_keys=False))
    return path


def explore(model: str | Path, prompts: str | Path, records: list[dict[str, Any]], *, samples: int,
            temperature: float, seed: int, config: dict[str, Any], max_response_len: int = 2048,
            concurrency: int = 8, desc: str = "explore") -> Exploration:
    """`samples` episodes of every record with `model`, as a training step plays them (module docstring)."""
    started = time.perf_counter()
    result = Exploration()
    with policy_runtime(str(model), str(prompts), config=config, seed=seed, temperature=temperature,
                        rollout_temperature=temperature, max_response_len=max_response_len) as args:
        played = asyncio.run(play_records(args, records, samples, concurrency, evaluation=False, desc=desc))
        for sample in played:
            trace = sample.metadata.pop(traces.TRACE_KEY, None) or {}
            awm = sample.metadata["awm"]
            result.played += 1
            why = awm.get("infra_error") or ("engine abort" if sample.status == Sample.Status.ABORTED else None)
            if why:  # not the agent's doing: neither a success nor a failure
                result.infra_failures.append({"scenario": awm["scenario"], "task_idx": awm["task_idx"],
                                              "index": sample.index, "infra_error": str(why)[:300]})
                continue
            if len(sample.loss_mask or []) != sample.response_length:
                raise RuntimeError(f"episode {sample.index}: loss mask of {len(sample.loss_mask or [])} tokens for a "
                                   f"response of {sample.response_length}")
            result.trajectories.append(Trajectory(
                sample=sample, scenario=str(awm["scenario"]), task_idx=int(awm["task_idx"]),
                verdict=awm.get("verdict"), reward=float(reward.score(args, sample)),
                stop_reason=str(awm.get("stop_reason") or ""), turns=int(awm.get("turns") or len(trace.get("turns", [])))))
    result.wall_s = time.perf_counter() - started
    if result.infra_failures:
        print(f"[explore] {len(result.infra_failures)} of {result.played} episodes were infrastructure failures "
              "(dropped, not counted as failures)", file=sys.stderr)
    return result


def common_flags(parser: argparse.ArgumentParser, lr: float) -> None:
    """The flags both offline commands share."""
    parser.add_argument("--model", required=True, help="starting HF checkpoint (a warm start of awm_grpo.warmstart)")
    parser.add_argument("--prompts", required=True, help="prompt JSONL of awm_grpo.data_prep, e.g. SPLITS/train.jsonl")
    parser.add_argument("--out", required=True, help="output folder: OUT/model (HF folder), the run's JSON, "
                        "OUT/awm_runtime.yaml (pass it to awm_grpo.eval --config)")
    parser.add_argument("--config", default=None, help="runtime YAML with awm_* keys (default: the keys the launcher "
                        "writes for a CPU GRPO run, so both play alike)")
    parser.add_argument("--data-dir", default=None, help="AWM data folder of the prompts (default: the runtime "
                        "YAML's awm_data_dir, i.e. the bundled scenarios)")
    parser.add_argument("--temperature", type=float, default=1.0, help="exploration temperature (GRPO's CPU rollout "
                        "temperature: 1.0)")
    parser.add_argument("--max-response-len", type=int, default=2048, help="episode token budget (the CPU profile's)")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes in flight at once")
    parser.add_argument("--limit", type=int, default=0, help="only the first N tasks of --prompts (0: all)")
    parser.add_argument("--tasks", type=int, default=0, help="a random subset of N tasks of --prompts, drawn with "
                        "--seed, kept in file order (0: all; splits are ordered by scenario, so this, not --limit, "
                        "matches an episode budget fairly)")
    parser.add_argument("--lr", type=float, default=lr, help=f"learning rate (AdamW; default {lr:g})")
    parser.add_argument("--seed", type=int, default=0, help="seeds exploration (turn seeds, engine) and training")
    parser.add_argument("--threads", type=int, default=1, choices=[1, 2], help="torch threads (engine and training)")


def setup(opts: argparse.Namespace) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """Checks, threads and seeds: (out folder, prompt records, runtime keys)."""
    check_checkpoint(opts.model)
    records = read_prompts(opts.prompts, opts.limit)
    if opts.tasks < 0 or opts.limit < 0:
        raise SystemExit("--tasks and --limit count tasks: use 0 (all) or more")
    if opts.tasks:
        if opts.tasks > len(records):
            raise SystemExit(f"--tasks {opts.tasks}: --prompts has only {len(records)} tasks")
        keep = sorted(random.Random(opts.seed).sample(range(len(records)), opts.tasks))
        records = [records[i] for i in keep]
    keys = runtime_config(opts.config, opts.data_dir)
    check_data_dir(records, keys.get("awm_data_dir"))
    torch.set_num_threads(opts.threads)
    torch.manual_seed(opts.seed)
    out = Path(opts.out)
    write_runtime_config(out, keys)
    return out, records, keys


def load_model(path: str | Path) -> torch.nn.Module:
    """A checkpoint as a float32 causal LM for training."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def save_model(model: torch.nn.Module, start: str | Path, dest: Path) -> Path:
    """`model` as an HF folder with the starting checkpoint's tokenizer files (byte for byte)."""
    from slime.backends.checkpoint import copy_tokenizer_files

    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    copy_tokenizer_files(start, dest)
    return dest
