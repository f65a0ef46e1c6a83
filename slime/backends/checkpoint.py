"""Trainer checkpoints on disk: written atomically, by every rank in parallel, pruned to the newest K.

Layout (format 2; the shape of slime's Megatron checkpoints, with an HF folder inside):

    <save_dir>/
      latest_checkpointed_iteration.txt   # the last complete iteration, e.g. "20"
      iter_0000020/
        model/              # HF folder in the serving dtype (config.json "dtype" names it), plus the
                            #   tokenizer files of the run's HF checkpoint: servable and evaluable as is
        trainer/            # torch.distributed.checkpoint (DCP): the optimizer state by parameter name
                            #   and, when model/ is not the trainer's exact weights (bf16 serving, fp32
                            #   training), the fp32 master weights; each rank writes its own shard file
        adapter/            # LoRA runs only: the peft adapter (adapter_config.json + adapter_model.safetensors,
                            #   servable with SGLang's --lora-paths); model/ then holds the merged weights and
                            #   trainer/ the adapter (the exact weights, the base being frozen) and its moments
        scheduler.pt        # LR-scheduler state dict
        rng.pt              # torch CPU (and CUDA) generator states
        trainer_state.json  # format, step, iteration, python/numpy RNG, caller's data position, sizes

Any world size and sharding loads any checkpoint: DCP reshards on load (FSDP2 shards, replicas and
one process alike). Format 1 (model/ in fp32 + optimizer.pt holding optimizer and scheduler, written
by rank 0 alone) still loads.

An iteration is written into `iter_XXXXXXX.tmp-<pid of rank 0>`, fsynced, checked, renamed into
place, and only then named in `latest_checkpointed_iteration.txt` (itself replaced atomically), so a
crash at any moment leaves the previous checkpoint and the pointer to it untouched. With `keep` K,
the iterations older than the newest K are deleted after that (with their critic and data-position
files). A save that fails with an OSError (a full disk) removes its temporary folder and raises
`CheckpointSaveError`, whose message names the folder, what was being written, the bytes needed and
free, and what to do.

A checkpoint damaged afterwards (a disk error, a partial copy, a hand edit) is found before it is
loaded: trainer_state.json carries the size and CRC-32 of every other file of the iteration (its
"files" manifest, written by rank 0 after every rank wrote) and a CRC-32 of its own content
("state_crc32"), and its fields are checked for type; then each file's framing is checked (JSON
parses, safetensors headers match their sizes, torch zip archives open, every DCP shard file is as
long as its metadata says). So damage inside tensor data that keeps the framing is found too. Loading
then falls back to the newest older iteration that passes, and the log names the damaged file. The
cost: every byte is read once more at save (rank 0) and at load (each rank), CRC-32 at about 7 GB/s
a core. Checkpoints written before the manifest existed get the framing check only (logged).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import struct
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
TRAINER_DIR = "trainer"
SCHEDULER_FILE = "scheduler.pt"
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
# trainer_state.json "master_weights": where the trainer's exact weights are.
MASTER_IN_MODEL = "model"  # model/ holds them (its dtype is the parameters' dtype)
MASTER_IN_TRAINER = "trainer"  # trainer/ holds them under "model" (model/ is a lower-precision copy)
# Format 1: optimizer.pt's "optimizer_format" when its state is keyed by parameter name (portable
# across world sizes and FSDP); absent: torch's `optimizer.state_dict()` keyed by parameter index.
OPTIMIZER_BY_NAME = "by_name"
# What a Hugging Face folder needs besides the weights to tokenize and chat (whichever of them exist).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "generation_config.json")
# What `--keep-checkpoints` advice names; the launcher's knob and variable set it.
KEEP_ADVICE = ("free space there, keep fewer checkpoints (KEEP_CHECKPOINTS / --keep-checkpoints), or point "
               "SAVE_DIR (--save) at a larger disk")


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


# ---- sizes ---------------------------------------------------------------------------------------


def dtype_of(name: str | torch.dtype) -> torch.dtype:
    """torch.bfloat16 for "bfloat16" (or the dtype itself)."""
    if isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}: use bfloat16, float16 or float32")
    return dtype


def dtype_name(dtype: str | torch.dtype) -> str:
    """"bfloat16" for torch.bfloat16 (what config.json's "dtype" holds)."""
    return str(dtype_of(dtype)).removeprefix("torch.")


def save_sizes(parameters: int, serving_dtype: str | torch.dtype, *, master_dtype: str | torch.dtype = "float32",
               optimizer_moments: int = 2, adapter: int = 0) -> dict[str, int]:
    """Bytes of one save of a model with `parameters` (unique) weights, trained in `master_dtype` with
    AdamW (`optimizer_moments` tensors per weight): model/ in the serving dtype, the master weights in
    trainer/ unless model/ already is exact, and the optimizer moments. Files below 1 MB not counted.

    `adapter` > 0 (LoRA, that many adapter parameters on the frozen `parameters`): model/ holds the merged
    weights, adapter/ the peft folder and trainer/ the adapter with its moments, all in `master_dtype`;
    nothing of the base is trainer state."""
    serving, master = dtype_of(serving_dtype), dtype_of(master_dtype)
    size = torch.empty(0, dtype=master).element_size()
    model = parameters * torch.empty(0, dtype=serving).element_size()
    if adapter:
        return {"model": model, "adapter": adapter * size, "master": adapter * size,
                "optimizer": adapter * size * optimizer_moments}
    return {"model": model, "master": 0 if serving == master else parameters * size,
            "optimizer": parameters * size * optimizer_moments}


def parameter_count(model_dir: str | os.PathLike) -> int:
    """Unique weights of the HF model whose config.json is in `model_dir` (a tied head counted once),
    counted on a meta-device model built from the config: no weight is read or allocated."""
    return sum(p.numel() for p in meta_model(model_dir).parameters())


def meta_model(model_dir: str | os.PathLike) -> torch.nn.Module:
    """The HF model of `model_dir`'s config.json built on the meta device: its shapes, no weight read or
    allocated (to size saves and adapters before a run starts)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def human_bytes(n: float) -> str:
    """1.5 GB, 320.0 MB, 12.0 KB (decimal units, as disks are sold and `df -H` prints)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


# ---- saving --------------------------------------------------------------------------------------


class CheckpointSaveError(OSError):
    """A save failed (full disk, quota, unwritable or unshared folder); the message says what to do."""


def failure_message(save_dir: str | os.PathLike, iteration: int, what: str | None, exc: BaseException | str,
                    needed: int | None) -> str:
    """The sentence a failed save raises: the folder, what was being written (None: refused before
    writing anything), bytes needed and free, which checkpoint is intact, and what to do."""
    save_dir = Path(save_dir)
    free = free_text(save_dir)
    previous = latest_iteration(save_dir)
    intact = (f"the previous checkpoint {iteration_dir(save_dir, previous)} is intact and `--load {save_dir}` "
              "resumes from it" if previous is not None else f"no earlier checkpoint exists in {save_dir}")
    failed = f"failed while writing {what}" if what else "was refused before writing anything"
    return (f"saving checkpoint iteration {iteration} into {save_dir} {failed}: {exc}. "
            f"{'' if needed is None else f'One save needs {human_bytes(needed)}; '}{free} is free on that "
            f"filesystem. Nothing of this save was committed (its temporary folder is removed) and {intact}. To go "
            f"on: {KEEP_ADVICE}.")


def latest_iteration(save_dir: str | os.PathLike) -> int | None:
    """The iteration `latest_checkpointed_iteration.txt` names, or None."""
    try:
        return int((Path(save_dir) / LATEST_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def nearest_existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists: the folder whose filesystem `path` will be on."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_text(path: Path) -> str:
    """The free space of the filesystem `path` is (or will be) on, for a message."""
    try:
        return human_bytes(shutil.disk_usage(nearest_existing(path)).free)
    except OSError:
        return "an unknown amount"


def start_save(save_dir: str | os.PathLike, iteration: int, needed: int) -> Path:
    """Rank 0, before anything is written: clean up after killed saves, refuse when the filesystem has
    less than `needed` bytes free (nothing written, the previous save untouched), create and return the
    temporary folder the ranks write into."""
    save_dir = Path(save_dir)
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(save_dir)
        usage = shutil.disk_usage(save_dir)
        tmp = iteration_dir(save_dir, iteration)
        tmp = tmp.with_name(f"{tmp.name}.tmp-{os.getpid()}")
        short = usage.total > 0 and usage.free < needed  # a FUSE mount may report 0 total: no check there
        if not short:
            tmp.mkdir()
    except OSError as exc:
        raise CheckpointSaveError(failure_message(save_dir, iteration, "the temporary folder", exc, needed)) from exc
    if short:
        raise CheckpointSaveError(failure_message(save_dir, iteration, None, "not enough free space for it", needed))
    return tmp


@contextlib.contextmanager
def writing(save_dir: str | os.PathLike, iteration: int, tmp: Path | None, what: str, needed: int) -> Iterator[None]:
    """Turn an OSError (or DCP's CheckpointException around one) while writing `what` into a
    `CheckpointSaveError`; `tmp` (rank 0's) is removed first. Other exceptions pass unchanged: a
    KeyboardInterrupt leaves `tmp` for the next save to clean up, as a killed process would."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except (OSError, CheckpointException) as exc:
        if isinstance(exc, CheckpointSaveError):
            raise
        cause = _root_cause(exc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointSaveError(failure_message(save_dir, iteration, what, cause, needed)) from None


def _root_cause(exc: BaseException) -> str:
    """A DCP CheckpointException's first OSError (with its rank); else the exception itself."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        for rank, (error, _trace) in sorted(failures.items()):
            if isinstance(error, OSError):
                return f"rank {rank}: {error}"
        rank, (error, _trace) = sorted(failures.items())[0]
        text = f"{type(error).__name__}: {str(error).strip()}"
        if "unexpected pos" in text:  # torch's archive writer (DCP writes through it) reports a short write so
            text += " (a write came up short: the disk is full, or a quota or file-size limit was reached)"
        return f"rank {rank}: {text}"
    return str(exc)


def write_trainer_state(tmp: Path, state: dict[str, Any], process_group: Any = None) -> None:
    """Every rank: write its shard of `state` (tensors, DTensors, small objects) to `tmp/trainer` with
    DCP. Collective when a process group exists; replicated tensors are written once, by one rank."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    no_dist = not (dist.is_available() and dist.is_initialized())
    with _single_process_quietly():
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp / TRAINER_DIR), sync_files=True),
                 process_group=process_group, no_dist=no_dist)


def read_trainer_state(found: Path, state: dict[str, Any], process_group: Any = None) -> None:
    """Every rank: fill `state` (same keys as saved, any sharding) in place from `found/trainer`."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    no_dist = not (dist.is_available() and dist.is_initialized())
    with _single_process_quietly():
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(found / TRAINER_DIR)), process_group=process_group,
                 no_dist=no_dist)


@contextlib.contextmanager
def _single_process_quietly() -> Iterator[None]:
    """DCP warns on every call without a process group that it assumes one process: that is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def write_model_folder(folder: Path, writer: Any, state_dict: dict[str, torch.Tensor], dtype: str | torch.dtype,
                       tokenizer: Any = None, tokenizer_dir: str | os.PathLike | None = None) -> None:
    """save_pretrained of `state_dict` cast to `dtype`, with config.json's "dtype" saying so (sglang
    serves a float32 config as float16 under --dtype auto); tokenizer files from either source."""
    writer.save_pretrained(folder, state_dict=cast_state(state_dict, dtype))
    set_config_dtype(folder, dtype)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if tokenizer_dir is not None:
        copy_tokenizer_files(tokenizer_dir, folder)


def cast_state(state_dict: dict[str, torch.Tensor], dtype: str | torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors in `dtype`, on the CPU (a GPU holds one tensor's copy at a time, not the whole
    model's); tensors that shared storage still do (a tied head stays written once)."""
    dtype = dtype_of(dtype)
    done: dict[tuple[int, tuple[int, ...], torch.dtype], torch.Tensor] = {}
    out = {}
    for name, tensor in state_dict.items():
        if not tensor.is_floating_point() or tensor.dtype == dtype:
            out[name] = tensor
            continue
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key not in done:
            done[key] = tensor.detach().to("cpu", dtype)
        out[name] = done[key]
    return out


def set_config_dtype(folder: str | os.PathLike, dtype: str | torch.dtype) -> None:
    """Write `dtype` into the folder's config.json "dtype" (and transformers' older "torch_dtype" alias
    where present): save_pretrained records the model's parameter dtype, not that of the state dict."""
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = dtype_name(dtype)
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype_name(dtype)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def finish_save(save_dir: str | os.PathLike, tmp: Path, iteration: int, *, scheduler: Any, payload: dict[str, Any],
                keep: int | None = None) -> Path:
    """Rank 0, after every rank wrote trainer/ and model/ is in `tmp`: the small files, fsync, a framing
    check of the whole folder, the rename into place, the latest pointer, then pruning to `keep`."""
    torch.save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
    torch.save(_torch_rng_state(), tmp / "rng.pt")
    payload = {"format": FORMAT_VERSION, "iteration": iteration, **_host_rng_state(), **payload,
               "files": manifest(tmp)}
    payload["state_crc32"] = _state_crc(payload)
    (tmp / STATE_FILE).write_text(json.dumps(payload, indent=1))
    _fsync_tree(tmp)
    try:
        check_iteration(tmp, content=False)
    except CheckpointDamaged as exc:  # e.g. a rank wrote its shard to a folder rank 0 cannot see
        raise OSError(f"the written checkpoint does not read back: {exc}") from None
    final = iteration_dir(save_dir, iteration)
    _commit(tmp, final)
    _write_atomically(Path(save_dir) / LATEST_FILE, f"{iteration}\n")
    if keep:
        try:
            prune(save_dir, keep, newest=iteration)
        except OSError as exc:  # the new save is in place: a failed cleanup must not report the save failed
            logger.warning("checkpoint %s is saved, but deleting the older ones failed (%s): they still take disk "
                           "space; the next save tries again", final, exc)
    return final


def discard(tmp: Path | None) -> None:
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def prune(save_dir: str | os.PathLike, keep: int, *, newest: int) -> list[Path]:
    """Delete the iterations older than the newest `keep` committed ones at or below `newest` (and
    their `critic/iter_N.pt` and `rollout/global_dataset_state_dict_N.pt`); returns what it deleted.
    Iterations above `newest` (another timeline of the same folder) are left alone."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (or None: keep all), got {keep}")
    save_dir = Path(save_dir)
    iterations = sorted(_iteration_of(p) for p in save_dir.glob("iter_*") if p.is_dir() and p.name[5:].isdigit())
    iterations = [i for i in iterations if i <= newest]
    doomed = []
    for old in iterations[:-keep]:
        doomed += [iteration_dir(save_dir, old), save_dir / "critic" / f"iter_{old:07d}.pt",
                   save_dir / "rollout" / f"global_dataset_state_dict_{old}.pt"]
    removed = []
    for path in doomed:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(path)
    if removed:
        logger.info("kept the newest %d checkpoints: deleted %s", keep, ", ".join(p.name for p in removed
                                                                                  if p.name.startswith("iter_")))
    return removed


# ---- checking ------------------------------------------------------------------------------------


class CheckpointDamaged(ValueError):
    """A checkpoint file is missing or unreadable; the message names it."""


def check_iteration(found: Path, *, content: bool = True) -> dict[str, Any]:
    """Check the content (manifest CRCs, when saved with one), fields and framing of every file of
    iteration directory `found`; returns its trainer_state payload. `content` False: not the CRCs (the
    save that just computed them)."""
    state = found / STATE_FILE
    try:
        payload = json.loads(state.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointDamaged(f"{state}: unreadable ({exc})") from None
    if not isinstance(payload, dict) or payload.get("format") not in READABLE_FORMATS:
        got = payload.get("format") if isinstance(payload, dict) else payload
        raise CheckpointDamaged(f"{state}: checkpoint format {got!r}, this code reads {READABLE_FORMATS}")
    if "state_crc32" in payload and payload["state_crc32"] != _state_crc(payload):
        raise CheckpointDamaged(f"{state}: its content changed after the save (CRC-32 {_state_crc(payload)}, saved "
                                f"{payload['state_crc32']!r})")
    _check_payload(state, payload)
    if "files" in payload:
        if content:
            verify_manifest(found, payload["files"])
    else:
        logger.info("%s has no file manifest (saved by an older version): only the framing of its files is "
                    "checked", found)
    archives = ("optimizer.pt", "rng.pt") if payload["format"] == 1 else (SCHEDULER_FILE, "rng.pt")
    for name in archives:
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
    if payload["format"] >= 2:
        _check_dcp(found / TRAINER_DIR)
    return payload


def manifest(folder: Path) -> dict[str, list[int]]:
    """{relative path: [size, CRC-32]} of every file under `folder` but trainer_state.json."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != STATE_FILE:
            out[path.relative_to(folder).as_posix()] = [path.stat().st_size, _file_crc(path)]
    return out


def verify_manifest(found: Path, files: Any) -> None:
    """Every file the manifest names is there with its saved size and CRC-32; else CheckpointDamaged naming it."""
    if not isinstance(files, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v) for v in files.values()):
        raise CheckpointDamaged(f"{found / STATE_FILE}: its 'files' manifest is not {{path: [size, crc32]}}")
    for name, (size, crc) in sorted(files.items()):
        path = found / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise CheckpointDamaged(f"{found / STATE_FILE}: the manifest names {name!r}, outside the checkpoint")
        try:
            got = path.stat().st_size
            if got != size:
                raise CheckpointDamaged(f"{path}: {got} bytes, saved as {size} (truncated or overwritten)")
            got_crc = _file_crc(path)
        except OSError as exc:
            raise CheckpointDamaged(f"{path}: unreadable ({exc})") from None
        if got_crc != crc:
            raise CheckpointDamaged(f"{path}: its content changed after the save (CRC-32 {got_crc}, saved {crc}): "
                                    "a disk error, a partial copy or an edit")


def _file_crc(path: Path, chunk: int = 16 << 20) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def _state_crc(payload: dict[str, Any]) -> int:
    """CRC-32 of trainer_state's content without its own CRC (canonical JSON: key order does not matter)."""
    body = {k: v for k, v in payload.items() if k != "state_crc32"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def _check_payload(state: Path, payload: dict[str, Any]) -> None:
    """The fields loading reads have their types: damage that keeps the JSON valid is named here, not
    met later as a bare KeyError or TypeError."""
    def bad(field: str, expected: str) -> CheckpointDamaged:
        return CheckpointDamaged(f"{state}: field {field!r} is {payload.get(field)!r:.80}, expected {expected}")

    if type(payload.get("iteration")) is not int or payload["iteration"] < 0:
        raise bad("iteration", "a non-negative integer")
    inner = payload.get("state")
    if not isinstance(inner, dict) or type(inner.get("step")) is not int or "data_state" not in inner:
        raise bad("state", "an object with an integer 'step' and a 'data_state'")
    rng = payload.get("python_rng")
    if not (isinstance(rng, list) and len(rng) == 3 and type(rng[0]) is int and isinstance(rng[1], list)
            and all(type(x) is int for x in rng[1]) and (rng[2] is None or isinstance(rng[2], float))):
        raise bad("python_rng", "[version, [ints], gauss]")
    numpy_rng = payload.get("numpy_rng")
    if numpy_rng is not None and not (isinstance(numpy_rng, list) and len(numpy_rng) == 5
                                      and isinstance(numpy_rng[1], list)):
        raise bad("numpy_rng", "[name, [keys], pos, has_gauss, cached]")
    if payload["format"] >= 2 and payload.get("master_weights") not in (MASTER_IN_MODEL, MASTER_IN_TRAINER):
        raise bad("master_weights", f"{MASTER_IN_MODEL!r} or {MASTER_IN_TRAINER!r}")


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


def _check_dcp(folder: Path) -> None:
    """DCP's .metadata unpickles and every shard file it names holds every item it places there."""
    import torch.distributed.checkpoint as dcp

    try:
        metadata = dcp.FileSystemReader(str(folder)).read_metadata()
        ends: dict[str, int] = {}
        for info in (metadata.storage_data or {}).values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    except Exception as exc:  # noqa: BLE001 - a truncated pickle raises anything from EOFError to KeyError
        raise CheckpointDamaged(f"{folder / '.metadata'}: unreadable DCP metadata ({type(exc).__name__}: "
                                f"{exc})") from None
    for name, end in sorted(ends.items()):
        try:
            size = (folder / name).stat().st_size
        except OSError as exc:
            raise CheckpointDamaged(f"{folder / name}: missing shard ({exc}); a rank that wrote to a folder "
                                    "the others cannot see leaves this") from None
        if size < end:
            raise CheckpointDamaged(f"{folder / name}: {size} bytes, its items end at {end} (truncated)")


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


# ---- loading -------------------------------------------------------------------------------------


def read_state(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The iteration directory to load (see `resolve_checkpoint`) and its trainer_state payload."""
    found, payload = _resolve(Path(path))
    payload["path"] = str(found)
    return found, payload


def _torch_load(path: Path) -> Any:
    """torch.load (weights only); a file that does not load names itself (checkpoints without a manifest)."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged archive raises RuntimeError, UnpicklingError, EOFError...
        raise CheckpointDamaged(f"{path}: does not load ({type(exc).__name__}: {exc}); resume from an older "
                                "iteration (point --load at its iter_* folder) or repair the file") from None


def read_optimizer(found: Path) -> dict[str, Any]:
    """Format 1's optimizer.pt: optimizer and scheduler states (+ optimizer_format)."""
    return _torch_load(found / "optimizer.pt")


def read_scheduler(found: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """The LR-scheduler state of an iteration directory of either format."""
    if payload["format"] == 1:
        return read_optimizer(found)["scheduler"]
    return _torch_load(found / SCHEDULER_FILE)


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
    _set_torch_rng_state(_torch_load(found / "rng.pt"))
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


# ---- HF exports ------------------------------------------------------------------------------------


def export_hf(model: Any, out_dir: str | os.PathLike, tokenizer: Any = None,
              state_dict: dict[str, torch.Tensor] | None = None, dtype: str | torch.dtype | None = None) -> Path:
    """save_pretrained (and the tokenizer, when given) into `out_dir`, atomically; replaces an old export.

    `state_dict`: the gathered full weights (HF names) of a sharded model; default the model's own.
    `dtype`: the dtype to write (and to name in config.json), e.g. the engines' serving dtype; default
    the weights' own. A failed write (a full disk) removes the temporary folder and names `out_dir`.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if dtype is None:
            model.save_pretrained(tmp, state_dict=state_dict)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
        else:
            weights = state_dict if state_dict is not None else model.state_dict()
            write_model_folder(tmp, model, weights, dtype, tokenizer=tokenizer)
        _fsync_tree(tmp)
        _commit(tmp, out_dir)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointSaveError(f"exporting the weights to {out_dir} failed: {exc}. {free_text(out_dir)} is free "
                                  f"on that filesystem; the temporary folder was removed. To go on: {KEEP_ADVICE}.") from exc
    return out_dir


# ---- files ---------------------------------------------------------------------------------------


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
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        _fsync_dir(folder)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- RNG -----------------------------------------------------------------------------------------


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


def timeout_minutes(save_bytes: int, configured: float, *, slowest_bytes_per_s: float = 50e6) -> float:
    """The process group's collective timeout for a run that saves `save_bytes` at a time: at least
    `configured`, and long enough for a whole save at `slowest_bytes_per_s` (a busy network
    filesystem), since ranks wait in a collective while others write (docs/gpu.md has the arithmetic)."""
    return max(configured, math.ceil(save_bytes / slowest_bytes_per_s / 60))
