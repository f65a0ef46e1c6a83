"""The disk a run will use: printed at start (and by --dry-run), refused when it cannot hold two saves.

One save (slime.backends.checkpoint.save_sizes), from the model's config.json alone (parameters
counted on a meta-device model, no weight read): model/ in the engines' serving dtype + the fp32
master weights when model/ is not fp32 + AdamW's two fp32 moments (+ the PPO critic's model and
moments). Qwen3-4B (4,022,468,096 parameters) under SGLang: 8.0 + 16.1 + 32.2 = 56.3 GB.

A LoRA save (training.lora_rank > 0) trains only the adapter, so nothing of the frozen base is in its
trainer state: model/ holds the merged weights in the serving dtype (as above), adapter/ the peft adapter
in fp32, trainer/ the fp32 adapter and its two AdamW moments; with `a` adapter parameters (r x (in + out)
per targeted Linear, `slime.backends.lora.adapter_parameter_count`, from the config alone) that is
model/ + 4a + 4a + 8a. Qwen3-4B at rank 32, all-linear (a = 66,060,288): 8.0 + 0.26 + 0.26 + 0.53 =
9.1 GB, against 56.3 GB for the full model.

While a save is written the newest K (training.keep_checkpoints) are still on disk: checkpoints
peak at K + 1 saves (every save of the run when K is 0). The disk weight sync keeps the engines'
export and writes the next beside it: two exports in the serving dtype. A LoRA run's sync moves the
adapter alone (slime.engine.pool's _sync_adapter: a peft folder in the serving dtype, the previous one
removed once the engines load the next): two adapter folders, 2 x 132 MB for Qwen3-4B r32 in bf16.
Traces: at most (max_response_len + 2,048 prompt tokens) x 8 bytes an episode (about 4 bytes of text a
token, kept twice: messages and turns); real episodes are far smaller (12 KB for 6 turns, docs/viewer.md).

The launcher refuses (exit 2) when the filesystem of save_dir has less than two saves free (one when
save_dir already holds checkpoints: the next save is written beside them), and warns when it has less
than the run's peak. docs/gpu.md (Checkpoints and disk) has the arithmetic.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from awm_grpo.launch.config import ResolvedConfig
from awm_grpo.launch.knobs import REPO

PROMPT_TOKENS = 2048  # a task + the meta tools' system prompt, for the traces bound
TRACE_BYTES_PER_TOKEN = 8  # about 4 bytes of text a token, written twice (messages and turns)


@dataclass
class DiskPlan:
    save_dir: Path
    parameters: int | None = None  # None: the model's size is unknown (why: `unknown`)
    unknown: str = ""
    architecture: str = ""
    serving_dtype: str = "float32"
    lora_rank: int = 0  # > 0: a LoRA run (adapter saves and adapter syncs)
    lora_targets: str = ""
    adapter_parameters: int = 0  # LoRA: the adapter's parameters
    save: dict[str, int] = field(default_factory=dict)  # one save's parts
    saves: int = 0  # saves in the run
    keep: int = 0
    exports: int = 0  # bytes of the weight exports at their peak
    export_each: int = 0
    episodes: int = 0
    traces: int = 0  # bytes of the traces at most
    existing: int = 0  # bytes already in save_dir's checkpoints and exports
    free: int | None = None
    total: int | None = None
    where: Path | None = None  # the existing folder whose filesystem was measured
    notes: list[str] = field(default_factory=list)

    @property
    def one_save(self) -> int:
        return sum(self.save.values())

    @property
    def checkpoint_peak(self) -> int:
        kept = self.saves if not self.keep else min(self.keep + 1, self.saves)
        return kept * self.one_save

    @property
    def peak(self) -> int:
        return self.checkpoint_peak + self.exports + self.traces


def plan(cfg: ResolvedConfig) -> DiskPlan:
    """What the run writes under save_dir, and what its filesystem has free."""
    from slime.backends.checkpoint import (  # torch: only when a run is planned
        nearest_existing,
        parameter_count,
        save_sizes,
    )
    from slime.backends.lora import LoraSettings, adapter_parameter_count
    from slime.engine.lora_adapters import parse_target_modules

    out = DiskPlan(save_dir=Path(cfg["paths.save_dir"]))
    model = Path(cfg["paths.hf_checkpoint"])
    sglang = cfg["inference.engine_type"] == "sglang"
    out.serving_dtype = (cfg.values.get("inference.sglang_dtype") or "bfloat16") if sglang else "float32"
    out.lora_rank = cfg["training.lora_rank"] or 0
    out.lora_targets = cfg["training.lora_target_modules"] or "all-linear"
    try:
        parameters = parameter_count(model)
        out.architecture = ",".join(json.loads((model / "config.json").read_text()).get("architectures") or [])
    except Exception as exc:  # noqa: BLE001 - any config transformers cannot build: report, do not refuse
        out.unknown = f"{model / 'config.json'} does not build a model here ({type(exc).__name__}: {exc})"
    else:
        try:
            if out.lora_rank:
                settings = LoraSettings(rank=out.lora_rank, target_modules=parse_target_modules(out.lora_targets))
                out.adapter_parameters = adapter_parameter_count(model, settings)
            out.parameters = parameters
        except Exception as exc:  # noqa: BLE001 - targets this model lacks: the trainer refuses them, say why
            out.unknown = (f"the LoRA adapter (rank {out.lora_rank}, {out.lora_targets}) on {model} cannot be sized "
                           f"({type(exc).__name__}: {exc})")
    steps, interval = cfg["training.num_rollout"], cfg["training.save_interval"]
    out.saves = steps // interval + (1 if steps % interval else 0) if interval else 0
    out.keep = cfg["training.keep_checkpoints"] or 0
    if out.parameters is not None:
        if out.lora_rank:
            out.save = save_sizes(out.parameters, out.serving_dtype, adapter=out.adapter_parameters)
            # each sync writes the adapter alone in the serving dtype (train_worker.export_adapter)
            out.export_each = save_sizes(out.adapter_parameters, out.serving_dtype)["model"]
        else:
            out.save = save_sizes(out.parameters, out.serving_dtype)
            out.export_each = out.save["model"]
        if cfg["grpo.advantage_estimator"] == "ppo" and cfg["recovery.credit_method"] is None:
            out.save["critic"] = sum(save_sizes(out.parameters, "float32").values())
        out.exports = 2 * out.export_each  # the engines' export and the next one beside it
    out.episodes = steps * cfg["training.rollout_batch_size"] * cfg["training.n_samples_per_prompt"]
    out.episodes += _eval_episodes(cfg)
    out.traces = out.episodes * (cfg["inference.max_response_len"] + PROMPT_TOKENS) * TRACE_BYTES_PER_TOKEN
    out.existing = _bytes_under([*out.save_dir.glob("iter_*"), out.save_dir / "weights", out.save_dir / "critic"])
    out.where = nearest_existing(out.save_dir)
    try:
        usage = shutil.disk_usage(out.where)
        out.free, out.total = usage.free, usage.total
    except OSError as exc:
        out.notes.append(f"free space unknown: {exc}")
    if _inside(out.save_dir, REPO):
        ignored = _git_ignored(out.save_dir)
        out.notes.append(f"SAVE_DIR is inside the repository ({REPO}); "
                         + ("git ignores it" if ignored else "git does NOT ignore it: add it to .gitignore"
                            if ignored is False else "whether git ignores it is unknown (no git here)")
                         + ": point SAVE_DIR at a data disk to keep runs out of the source tree")
    if cfg["hardware.actor_num_nodes"] > 1:
        out.notes.append("the trainer spans nodes: every rank writes its shard of each save into SAVE_DIR, so it "
                         "must be a filesystem all trainer nodes mount at the same path (NFS, Lustre, ...)")
    return out


def _eval_episodes(cfg: ResolvedConfig) -> int:
    interval = cfg["training.eval_interval"]
    if cfg["data.eval_prompt_file"]:
        val = Path(cfg["data.eval_prompt_file"].rpartition("@[")[0] or cfg["data.eval_prompt_file"])
    elif cfg["data.prompt_file"]:
        return 0  # prompt files without eval prompts: no evals
    else:
        val = Path(cfg["paths.splits_dir"]) / "val.jsonl"
    if not interval or not val.is_file():
        return 0
    prompts = _count_rows(val)
    evals = cfg["training.num_rollout"] // interval + (0 if cfg["training.skip_eval_before_train"] else 1)
    return evals * prompts * cfg["training.n_samples_per_eval_prompt"]


def _count_rows(path: Path) -> int:
    """Rows of a prompt file: a parquet file's row count (from its footer), else its non-blank lines."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        except Exception:  # no pyarrow, or not parquet: the launcher's layout check says so
            return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _bytes_under(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        files = [path] if path.is_file() else path.rglob("*") if path.is_dir() else []
        total += sum(f.stat().st_size for f in files if f.is_file())
    return total


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def _git_ignored(path: Path) -> bool | None:
    """Whether git ignores `path` in the repository (None: git cannot tell)."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "--no-index", str(path.resolve())],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: True, 1: False}.get(done.returncode)


def report(p: DiskPlan) -> str:
    """The lines the launcher prints under `disk:`."""
    from slime.backends.checkpoint import human_bytes

    lines = [f"disk (SAVE_DIR {p.save_dir}):"]
    if p.parameters is None:
        lines.append(f"  one save: unknown: {p.unknown}")
    elif p.lora_rank:
        parts = [f"model/ {human_bytes(p.save['model'])} ({p.serving_dtype}, merged weights)",
                 f"adapter/ {human_bytes(p.save['adapter'])} (fp32)",
                 f"fp32 adapter in trainer/ {human_bytes(p.save['master'])}",
                 f"its AdamW moments {human_bytes(p.save['optimizer'])}"]
        if "critic" in p.save:
            parts.append(f"PPO critic {human_bytes(p.save['critic'])}")
        lines.append(f"  one save (LoRA rank {p.lora_rank}, {p.lora_targets}: no base weights in trainer/): "
                     f"{human_bytes(p.one_save)} = {' + '.join(parts)} ({p.architecture or 'model'}, "
                     f"{p.parameters:,} parameters, {p.adapter_parameters:,} in the adapter)")
    else:
        parts = [f"model/ {human_bytes(p.save['model'])} ({p.serving_dtype})"]
        if p.save["master"]:
            parts.append(f"fp32 master weights {human_bytes(p.save['master'])}")
        parts.append(f"AdamW moments {human_bytes(p.save['optimizer'])}")
        if "critic" in p.save:
            parts.append(f"PPO critic {human_bytes(p.save['critic'])}")
        lines.append(f"  one save: {human_bytes(p.one_save)} = {' + '.join(parts)} "
                     f"({p.architecture or 'model'}, {p.parameters:,} parameters)")
    if p.parameters is not None:
        on_disk = min(p.keep + 1, p.saves)
        kept = (f"the newest {p.keep} kept (KEEP_CHECKPOINTS): {human_bytes(p.checkpoint_peak)} at the peak"
                + (f", {on_disk} saves while the next is written" if on_disk > p.keep else "") if p.keep else
                f"all kept (KEEP_CHECKPOINTS=0): {human_bytes(p.checkpoint_peak)}")
        lines.append(f"  checkpoints: {_count(p.saves, 'save')} in the run, {kept}")
        if p.lora_rank:
            lines.append(f"  weight exports (LoRA: the adapter alone each sync, SAVE_DIR/weights): "
                         f"{human_bytes(p.exports)} at the peak (2 x {human_bytes(p.export_each)}, {p.serving_dtype})")
        else:
            lines.append(f"  weight exports (disk sync, SAVE_DIR/weights): {human_bytes(p.exports)} at the peak "
                         f"(2 x {human_bytes(p.export_each)})")
    lines.append(f"  traces: at most {human_bytes(p.traces)} ({p.episodes:,} episodes, each at most its "
                 f"response budget + {PROMPT_TOKENS:,} prompt tokens x {TRACE_BYTES_PER_TOKEN} bytes)")
    if p.parameters is not None:
        everything = p.saves * p.one_save + p.exports + p.traces
        lines.append(f"  the run's peak: {human_bytes(p.peak)}"
                     + (f" (keeping every save it would be {human_bytes(everything)})" if p.keep else ""))
    if p.existing:
        lines.append(f"  already there: {human_bytes(p.existing)} of checkpoints and exports (a resumed run)")
    if p.free is not None:
        lines.append(f"  free: {human_bytes(p.free)} on the filesystem of {p.where}")
    lines += [f"  note: {note}" for note in p.notes]
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def check(p: DiskPlan) -> tuple[str | None, str | None]:
    """(refusal, warning): a refusal when save_dir's filesystem cannot hold two saves (one beside the
    checkpoints already there), a warning when it holds less than the run's peak."""
    from slime.backends.checkpoint import human_bytes

    if p.parameters is None or p.free is None or not p.total or not p.saves:
        return None, None  # nothing to compare (size unknown, a filesystem that reports no size, or no saves)
    need = (1 if p.existing else 2) * p.one_save
    what = "one save beside the checkpoints already there" if p.existing else "two saves"
    if p.free < need:
        return (f"SAVE_DIR {p.save_dir}: {human_bytes(p.free)} free on its filesystem ({p.where}), less than {what} "
                f"({human_bytes(need)}; one save is {human_bytes(p.one_save)}, and the run peaks at "
                f"{human_bytes(p.peak)}). Free space there, point SAVE_DIR at a larger disk, or save less: "
                "KEEP_CHECKPOINTS (the newest K kept), SAVE_INTERVAL"), None
    if p.free + p.existing < p.peak:
        return None, (f"SAVE_DIR {p.save_dir}: {human_bytes(p.free)} free, the run peaks at {human_bytes(p.peak)}: "
                      "a save will fail (the run then stops, its previous checkpoint intact) unless space is freed "
                      "meanwhile")
    return None, None
