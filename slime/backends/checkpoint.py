"""Trainer checkpoints on disk, written atomically: a killed save never leaves a half checkpoint.

Layout (the shape of slime's Megatron checkpoints, with HF safetensors inside):

    <save_dir>/
      latest_checkpointed_iteration.txt   # the last complete iteration, e.g. "20"
      iter_0000020/
        model/                            # save_pretrained: config.json + *.safetensors (+ the tokenizer
                                          #   files of the run's HF checkpoint: servable and evaluable as is)
        optimizer.pt                      # optimizer and LR-scheduler state dicts
        rng.pt                            # torch CPU (and CUDA) generator states
        trainer_state.json                # step, iteration, python/numpy RNG, caller's data position

An iteration is written into `iter_XXXXXXX.tmp-<pid>`, fsynced, renamed into place, and only then
named in `latest_checkpointed_iteration.txt` (itself replaced atomically), so a crash at any moment
leaves the previous checkpoint and the pointer to it untouched.

A checkpoint damaged afterwards (a disk error, a partial copy, a hand edit) is found before it is
loaded: each file's framing is checked (JSON parses, safetensors headers match their sizes, torch
zip archives open). Loading then falls back to the newest older iteration that passes, and the log
names the damaged file. Damage inside tensor data that leaves the framing intact is not detected.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
FORMAT_VERSION = 1
# optimizer.pt's "optimizer_format" when its state is keyed by parameter name (portable across
# world sizes and FSDP); absent: torch's `optimizer.state_dict()` keyed by parameter index.
OPTIMIZER_BY_NAME = "by_name"
# What a Hugging Face folder needs besides the weights to tokenize and chat (whichever of them exist).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "generation_config.json")


def iteration_dir(save_dir: str | os.PathLike, iteration: int) -> Path:
    return Path(save_dir) / f"iter_{iteration:07d}"


def copy_tokenizer_files(src: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Copy the tokenizer files of HF folder `src` that `dest` lacks; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file() and not (Path(dest) / name).exists():
            shutil.copyfile(Path(src) / name, Path(dest) / name)
            copied.append(name)
    return copied


def save_checkpoint(
    save_dir: str | os.PathLike,
    iteration: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    model_state_dict: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
) -> Path:
    """Write iteration `iteration` under `save_dir` atomically and point the latest file at it.

    `state` must be JSON-serialisable (step counters, the data source's position). Sharded or
    replicated trainers pass the gathered full `model_state_dict` (HF names) and `optimizer_state`
    (keyed by parameter name, `torch.distributed.checkpoint.state_dict` style) and call this on
    rank 0 only; by default both are taken from `model` and `optimizer`. `tokenizer_dir` (the run's
    HF checkpoint): its tokenizer files are copied into `model/`, so the folder is a complete model.
    """
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(save_dir)
    final = iteration_dir(save_dir, iteration)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    model.save_pretrained(tmp / "model", state_dict=model_state_dict)
    if tokenizer_dir is not None:
        copy_tokenizer_files(tokenizer_dir, tmp / "model")
    opt: dict[str, Any] = {"scheduler": scheduler.state_dict()}
    if optimizer_state is None:
        opt["optimizer"] = optimizer.state_dict()
    else:
        opt.update(optimizer=optimizer_state, optimizer_format=OPTIMIZER_BY_NAME)
    torch.save(opt, tmp / "optimizer.pt")
    torch.save(_torch_rng_state(), tmp / "rng.pt")
    payload = {"format": FORMAT_VERSION, "iteration": iteration, **_host_rng_state(), "state": state}
    (tmp / STATE_FILE).write_text(json.dumps(payload, indent=1))
    _fsync_tree(tmp)
    _commit(tmp, final)
    _write_atomically(save_dir / LATEST_FILE, f"{iteration}\n")
    return final


class CheckpointDamaged(ValueError):
    """A checkpoint file is missing or unreadable; the message names it."""


def check_iteration(found: Path) -> dict[str, Any]:
    """Check the framing of every file of iteration directory `found`; returns its trainer_state payload."""
    state = found / STATE_FILE
    try:
        payload = json.loads(state.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointDamaged(f"{state}: unreadable ({exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        got = payload.get("format") if isinstance(payload, dict) else payload
        raise CheckpointDamaged(f"{state}: checkpoint format {got!r}, expected {FORMAT_VERSION}")
    for name in ("optimizer.pt", "rng.pt"):
        try:
            with zipfile.ZipFile(found / name) as archive:
                archive.namelist()
        except (OSError, zipfile.BadZipFile) as exc:
            raise CheckpointDamaged(f"{found / name}: not a readable torch archive ({exc})") from None
    weights = sorted((found / "model").glob("*.safetensors"))
    if not weights:
        raise CheckpointDamaged(f"{found / 'model'}: no *.safetensors")
    for file in weights:
        _check_safetensors(file)
    return payload


def _check_safetensors(file: Path) -> None:
    """The header (u64 length + JSON) parses and the last tensor ends exactly at the end of the file."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise ValueError(f"header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        if 8 + length + end != size:
            raise ValueError(f"{size} bytes, the header describes {8 + length + end}")
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise CheckpointDamaged(f"{file}: damaged safetensors file ({exc})") from None


def _candidates(save_dir: Path) -> list[Path]:
    """Iteration directories to try, newest first: the one the latest file names, then older ones."""
    named: Path | None = None
    latest = save_dir / LATEST_FILE
    try:
        named = iteration_dir(save_dir, int(latest.read_text().strip()))
        if not named.exists():
            # Killed while re-saving this iteration: the complete old copy was moved aside.
            named = next(iter(sorted(save_dir.glob(f"{named.name}.old-*"))), named)
    except (OSError, ValueError) as exc:
        logger.warning("%s is unreadable (%s): looking for the newest good iteration", latest, exc)
    others = sorted((p for p in save_dir.glob("iter_*") if p.is_dir() and p.name[5:].isdigit()),
                    key=_iteration_of, reverse=True)
    if named is None:
        return others
    return [named] + [p for p in others if _iteration_of(p) < _iteration_of(named)]


def _iteration_of(path: Path) -> int:
    """7 in `iter_0000007` and in `iter_0000007.old-123`."""
    return int(path.name[5:].split(".")[0])


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """The iteration directory to load: `path` itself if it is one, else the newest good one under `path`."""
    return _resolve(Path(path))[0]


def _resolve(path: Path) -> tuple[Path, dict[str, Any]]:
    if (path / STATE_FILE).is_file():
        return path, check_iteration(path)
    if not (path / LATEST_FILE).is_file():
        raise FileNotFoundError(
            f"{path} is neither a checkpoint iteration (no {STATE_FILE}) nor a save directory "
            f"(no {LATEST_FILE}): point at the directory given to save_checkpoint"
        )
    damaged = []
    for found in _candidates(path):
        try:
            payload = check_iteration(found)
        except CheckpointDamaged as exc:
            damaged.append(str(exc))
            logger.warning("checkpoint %s is damaged: %s; trying the previous iteration", found.name, exc)
            continue
        if damaged:
            logger.warning("resuming from %s instead: the newer checkpoint is damaged (%s)", found, damaged[0])
        return found, payload
    raise CheckpointDamaged(f"no loadable checkpoint under {path}: " + ("; ".join(damaged) or
                            f"{LATEST_FILE} names no iteration directory that exists"))


def load_checkpoint(
    path: str | os.PathLike, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and RNG states in place; returns the trainer_state payload."""
    found, payload = read_state(path)
    load_hf_weights(model, found / "model")
    opt = read_optimizer(found)
    if opt.get("optimizer_format") == OPTIMIZER_BY_NAME:
        raise ValueError(f"{found} holds a by-name optimizer state: load it with TorchTrainer.load_checkpoint")
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    restore_rng(found, payload)
    return payload


def read_state(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The iteration directory to load (see `resolve_checkpoint`) and its trainer_state payload."""
    found, payload = _resolve(Path(path))
    payload["path"] = str(found)
    return found, payload


def read_optimizer(found: Path) -> dict[str, Any]:
    """optimizer.pt of an iteration directory: optimizer and scheduler states (+ optimizer_format)."""
    return torch.load(found / "optimizer.pt", weights_only=True)


def read_hf_weights(model_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files of a save_pretrained folder."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}: was it written by save_pretrained?")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(file))
    return weights


def restore_rng(found: Path, payload: dict[str, Any]) -> None:
    """Restore torch, python and numpy RNG states saved with an iteration."""
    _set_torch_rng_state(torch.load(found / "rng.pt", weights_only=True))
    _set_host_rng_state(payload)


def load_hf_weights(model: torch.nn.Module, model_dir: str | os.PathLike) -> None:
    """Copy the safetensors weights of a save_pretrained folder into `model` (same architecture).

    Keys missing from the files are accepted only when tied to a loaded tensor (e.g. lm_head.weight
    tied to the embeddings, which save_pretrained writes once).
    """
    weights = read_hf_weights(model_dir)
    result = model.load_state_dict(weights, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{model_dir} holds weights the model lacks: {result.unexpected_keys[:5]}")
    params = model.state_dict()
    loaded = {params[k].data_ptr() for k in weights}
    untied = [k for k in result.missing_keys if params[k].data_ptr() not in loaded]
    if untied:
        raise ValueError(f"{model_dir} lacks weights for {untied[:5]}: it was saved from another model")


def export_hf(model: torch.nn.Module, out_dir: str | os.PathLike, tokenizer: Any = None,
              state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """save_pretrained (and the tokenizer, when given) into `out_dir`, atomically; replaces an old export.

    `state_dict`: the gathered full weights (HF names) of a sharded model; default the model's own.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    _fsync_tree(tmp)
    _commit(tmp, out_dir)
    return out_dir


def _commit(tmp: Path, final: Path) -> None:
    """Publish a finished directory under its final name (rename is atomic within a filesystem)."""
    old = None
    if final.exists():
        # Re-saving the same name: move the old one aside first, since rename cannot replace a
        # non-empty directory; it is deleted only once the new one is in place.
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old)


def _remove_leftovers(save_dir: Path) -> None:
    """Clean up after killed saves (one writer per save_dir is assumed).

    A `.tmp-*` directory never got its rename: delete it. An `.old-*` directory was moved aside to
    re-save its iteration: put it back if the new one never arrived, else delete it.
    """
    for leftover in save_dir.glob("iter_*.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for moved in save_dir.glob("iter_*.old-*"):
        final = save_dir / moved.name.split(".old-")[0]
        if final.exists():
            shutil.rmtree(moved, ignore_errors=True)
        else:
            os.rename(moved, final)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _torch_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_torch_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _host_rng_state() -> dict[str, Any]:
    """Python's and numpy's global RNG states as JSON (data shuffles and plugins may draw from them)."""
    version, internal, gauss = random.getstate()
    out: dict[str, Any] = {"python_rng": [version, list(internal), gauss]}
    try:
        import numpy as np
    except ImportError:
        return out
    name, keys, pos, has_gauss, cached = np.random.get_state()
    out["numpy_rng"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    return out


def _set_host_rng_state(payload: dict[str, Any]) -> None:
    version, internal, gauss = payload["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy_rng" in payload:
        import numpy as np

        name, keys, pos, has_gauss, cached = payload["numpy_rng"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
