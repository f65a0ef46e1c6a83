"""Where a run's metrics go: JSONL (one line a step), TensorBoard event files, wandb.

TensorBoard files are written by hand (no tensorboard package needed); wandb is optional and
offline unless `--wandb-mode online`.

Resume: a run that resumes from a checkpoint repeats the steps logged after that checkpoint was
saved. The JSONL keeps each step once: the first step a writer logs drops every earlier line of
that step or later (they belong to the run that died), so the file reads as one run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def _masked_crc(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return _varint(tag) + _varint(len(payload)) + payload


class TensorBoardWriter:
    """Scalars as TensorBoard event files (TFRecord framing of `Event` protos), written by hand.

    Event{wall_time=1 (double), step=2 (int64), file_version=3 | summary=5}; Summary{value=1};
    Value{tag=1, simple_value=2 (float)}. Each record: len u64, masked crc32c(len), data, crc(data).
    """

    def __init__(self, log_dir: str | Path):
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self._file = open(self.dir / name, "ab")  # noqa: SIM115 - kept open for the run
        self._write_event(_field(3 << 3 | 2, b"brain.Event:2"), step=0)

    def _write_event(self, body: bytes, step: int) -> None:
        event = b"\x09" + struct.pack("<d", time.time()) + b"\x10" + _varint(step) + body
        header = struct.pack("<Q", len(event))
        self._file.write(header + struct.pack("<I", _masked_crc(header)) + event
                         + struct.pack("<I", _masked_crc(event)))
        self._file.flush()

    def add_scalars(self, metrics: dict[str, float], step: int) -> None:
        values = b"".join(
            _field(1 << 3 | 2, _field(1 << 3 | 2, tag.encode()) + b"\x15" + struct.pack("<f", value))
            for tag, value in metrics.items()
        )
        self._write_event(_field(5 << 3 | 2, values), step)

    def close(self) -> None:
        self._file.close()


class MetricsWriter:
    """The one writer of a run: JSONL always (when a path is known), TensorBoard and wandb on request."""

    def __init__(self, args: argparse.Namespace):
        path = args.metrics_path or (str(Path(args.save) / "metrics.jsonl") if args.save else None)
        self.path = Path(path) if path else None
        self.jsonl = None  # opened at the first log, after the lines it repeats are dropped
        self.tb = None
        if args.use_tensorboard:
            tb_dir = args.tensorboard_dir or (str(Path(args.save) / "tensorboard") if args.save else "tensorboard")
            self.tb = TensorBoardWriter(tb_dir)
        self.wandb = None
        if args.use_wandb:
            try:
                import wandb
            except ImportError:
                raise SystemExit(
                    "--use-wandb needs the wandb package, which is not installed here (setup.sh installs it: "
                    "`bash setup.sh --deps-only`), or drop --use-wandb; --use-tensorboard and the JSONL "
                    "metrics work without it"
                ) from None
            key = getattr(args, "wandb_key", None)
            if key and args.wandb_mode == "online":  # upstream's --wandb-key: log in with it, not the environment's
                wandb.login(key=key, relogin=True)
            config = {k: v for k, v in _plain(vars(args)).items() if k != "wandb_key"}  # never logged
            self.wandb = wandb.init(project=args.wandb_project, group=args.wandb_group, dir=args.wandb_dir,
                                    mode=args.wandb_mode, config=config)

    def log(self, step: int, metrics: dict[str, Any], kind: str = "train") -> None:
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        if self.path is not None and self.jsonl is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            dropped = drop_steps_from(self.path, step)
            if dropped:
                logger.info("%s: dropped %d lines of steps >= %d (logged after the checkpoint this run resumed "
                            "from)", self.path, dropped, step)
            self.jsonl = open(self.path, "a")  # noqa: SIM115 - kept open for the run
        if self.jsonl is not None:
            self.jsonl.write(json.dumps({"kind": kind, "step": step, **metrics}) + "\n")
            self.jsonl.flush()
        if self.tb is not None:
            self.tb.add_scalars(scalars, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        for sink in (self.jsonl, self.tb):
            if sink is not None:
                sink.close()
        if self.wandb is not None:
            self.wandb.finish()


def drop_steps_from(path: Path, step: int) -> int:
    """Rewrite the JSONL at `path` without its lines of `step` or later (atomically); returns how many of
    those went.

    A damaged line (bytes that are not UTF-8, not a JSON object with an integer step, a torn last line
    of a killed run) is kept out of the rewritten file too, but never silently: each is named by
    file:line in a warning and its bytes are appended to `<path>.damaged`, so nothing is lost.
    """
    if not path.is_file():
        return 0
    kept: list[bytes] = []
    dropped = 0
    damaged: list[tuple[int, str, bytes]] = []
    data = path.read_bytes()
    lines = [line + b"\n" for line in data.split(b"\n")[:-1]] + ([data.rsplit(b"\n", 1)[-1]] if data and not
                                                                   data.endswith(b"\n") else [])
    for lineno, line in enumerate(lines, start=1):
        line_step, reason = _step_of(line)
        if reason is not None:
            damaged.append((lineno, reason, line))
        elif line_step < step:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
        else:
            dropped += 1
    if damaged:
        side = path.with_name(path.name + ".damaged")
        with open(side, "ab") as f:
            f.write(b"".join(line if line.endswith(b"\n") else line + b"\n" for _, _, line in damaged))
        for lineno, reason, _ in damaged:
            logger.warning("%s:%d: damaged metrics line (%s): left out of the resumed file, its bytes appended to "
                           "%s", path, lineno, reason, side)
    if dropped or damaged:
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)
    return dropped


def _step_of(line: bytes) -> tuple[int, str | None]:
    """A metrics line's step, or why the line is damaged (not a JSON object with an integer step)."""
    if not line.endswith(b"\n"):
        return -1, "torn last line: the run that wrote it was killed mid-write"
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return -1, f"byte {exc.object[exc.start]:#04x} at column {exc.start + 1} is not UTF-8"
    except ValueError as exc:
        return -1, f"not JSON: {exc}"
    except RecursionError:
        return -1, "JSON nested too deeply"
    if not isinstance(record, dict) or type(record.get("step")) is not int:
        return -1, "not a JSON object with an integer 'step'"
    return record["step"], None


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if isinstance(v, str | int | float | bool | type(None) | list)}
