"""Prompt sources: `DataSource` (the interface), `RolloutDataSource` (prompts in a deterministic,
resumable order), `RolloutDataSourceWithBuffer` (plus put-back groups served first) and `pop_first`,
the default buffer filter (`fn(args, rollout_id, buffer, num_samples) -> list[list[Sample]]`,
`--buffer-filter-path`).

Both classes are built as slime builds them, from the argument namespace alone (`cls(args)`, what
`--data-source-path` classes take), or (ours) from prompts already loaded with `load_prompts`.

The prompt order is a permutation per epoch seeded by `--rollout-seed` (identity without
`--rollout-shuffle`) whose position is a small JSON state saved in checkpoints, so a resumed run
draws exactly the prompts an uninterrupted run would have drawn.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


@dataclass
class Prompt:
    """One dataset row, tokenised once at load time when it is text.

    `prompt` is what the row holds under `--input-key` (rendered with the chat template when one is
    applied): text, chat messages or any other JSON value, as slime's Dataset keeps it. `token_ids`
    is empty for a prompt that is not text (a generate function reads `sample.prompt` itself then).
    `label` is the row's `--label-key` value unchanged (a dict stays a dict).
    """

    index: int
    prompt: Any
    token_ids: list[int]
    label: Any
    metadata: dict[str, Any]


def _split_row_slice(path: str) -> tuple[str, slice | None]:
    """slime's `file@[start:end]` spelling: the rows start..end of `file` (Python slice bounds)."""
    head, sep, tail = path.rpartition("@[")
    if not sep or not tail.endswith("]") or tail.count(":") != 1:
        return path, None
    bounds = tail[:-1].split(":")
    try:
        start, stop = (int(b) if b.strip() else None for b in bounds)
    except ValueError:
        return path, None
    return head, slice(start, stop)


def _read_parquet(real: str, rows_slice: slice | None) -> list[tuple[str, Any]]:
    """(`file row i` for messages, row dict) of a parquet prompt file; every failure is a ValueError.

    Rows are numbered from 0, as the `file@[start:end]` bounds count them. A parquet struct column gives
    each row a dict holding all of the column's fields (None where a row lacks one); maps become dicts.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ValueError(f"{real} is a parquet file, which needs pyarrow (pip install pyarrow, or bash "
                         "setup.sh); or convert it to JSONL, one JSON object per line") from exc
    try:
        table = pq.read_table(real)
        numbers = range(table.num_rows)[rows_slice] if rows_slice is not None else range(table.num_rows)
        table = table.slice(numbers.start, len(numbers))
        rows = table.to_pylist(maps_as_pydicts="strict")
    except (pa.ArrowException, OSError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise ValueError(f"{real} cannot be read as a parquet file ({why}): give a parquet file, or a JSONL "
                         "file (one JSON object per line) under a name not ending in .parquet") from exc
    return [(f"{real} row {number}", row) for number, row in zip(numbers, rows, strict=True)]


def _read_jsonl(real: str, rows_slice: slice | None) -> list[tuple[str, Any]]:
    """(`file:line` for messages, row) of a JSONL prompt file (blank lines skipped)."""
    rows: list[tuple[str, Any]] = []
    number = 0
    try:
        with open(real, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((f"{real}:{number}", json.loads(line)))
                except ValueError as exc:
                    raise ValueError(f"{real}:{number} is not a JSON object ({exc}): the prompt file must hold "
                                     "one JSON object per line") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{real}:{number + 1} is not UTF-8 text ({exc.reason}): --prompt-data takes JSONL "
                         "(one JSON object per line) or a .parquet file") from exc
    return rows if rows_slice is None else rows[rows_slice]


def _read_rows(path: str) -> list[tuple[str, Any]]:
    """(where, row) of a .jsonl (or .parquet, with pyarrow) prompt file; `where` names the file and row."""
    real, rows_slice = _split_row_slice(str(path))
    if not Path(real).is_file():
        raise FileNotFoundError(f"prompt data {real} does not exist: check --prompt-data / "
                                "--eval-prompt-data")
    if real.endswith(".parquet"):
        return _read_parquet(real, rows_slice)
    return _read_jsonl(real, rows_slice)


def _json_value(value: Any, what: str, where: str) -> Any:
    """`value`, parsed when it is a JSON string (metadata and tools may be stored as JSON text)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ValueError(f"{where}: {what} is a string but not valid JSON ({exc})") from exc


def _row_tools(row: dict[str, Any], tool_key: str | None, where: str) -> list[Any] | None:
    """The row's tool list under `--tool-key` (a JSON string is parsed), or None when it has none."""
    if not tool_key or row.get(tool_key) is None:
        return None
    tools = _json_value(row[tool_key], f"{tool_key!r}", where)
    if not isinstance(tools, list):
        raise ValueError(f"{where}: {tool_key!r} must be a list of tool schemas, got {type(tools).__name__}")
    return tools


def _present_keys(row: dict[str, Any]) -> list[str]:
    """The row's keys with a value: a parquet row holds every column, null where the row has none."""
    return sorted(k for k, v in row.items() if v is not None)


def _row_metadata(args: Any, row: dict[str, Any], where: str) -> tuple[dict[str, Any], list[Any] | None]:
    """The sample metadata of a row and its `--tool-key` tools (None: none). The metadata: `--metadata-key`
    (an object or its JSON string), the tools as "tools", and (ours) each `--extra-metadata-keys` column
    under its own name."""
    metadata_key = getattr(args, "metadata_key", "metadata")
    metadata = _json_value(row.get(metadata_key) or {}, f"{metadata_key!r}", where) or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}: {metadata_key!r} must be an object (or a JSON string of one), "
                         f"got {type(metadata).__name__}: set --metadata-key")
    metadata = dict(metadata)
    tools = _row_tools(row, getattr(args, "tool_key", None), where)
    if tools is not None:
        metadata["tools"] = tools
    for key in getattr(args, "extra_metadata_keys", None) or ():
        if row.get(key) is None:
            raise ValueError(f"{where} has no key {key!r} (or it is null), which --extra-metadata-keys "
                             f"copies into the metadata (the row has {_present_keys(row)})")
        if key in metadata and metadata[key] != row[key]:
            raise ValueError(f"{where}: --extra-metadata-keys {key!r} would overwrite a different {key!r} in "
                             f"the row's {metadata_key!r}: rename one of them")
        metadata[key] = row[key]
    return metadata, tools


def load_prompts(args: Any, path: str | Path, tokenizer: Any) -> list[Prompt]:
    """Read a prompt file (JSONL, or parquet with pyarrow; `file@[start:end]` takes a row slice).

    Each row gives `--input-key` (the prompt), `--label-key` (kept as is) and `--metadata-key` (an
    object, or a JSON string of one); (ours) `--extra-metadata-keys` columns join the metadata under
    their own names. With `--apply-chat-template`, messages (or a bare string, as one
    user turn) are rendered with the tokenizer's template, the row's `--tool-key` tools and a generation
    prompt. Without it a string is the prompt text and any other value is kept for the generate function
    (slime's Dataset does the same; tau-bench's `--input-key index` gives an int). Text prompts over
    `--rollout-max-prompt-len` tokens are dropped. A bad row is a ValueError naming the file and row;
    a null value counts as missing, as in parquet, where every row has every column.
    """
    prompts: list[Prompt] = []
    dropped = 0
    input_key, label_key = args.input_key, getattr(args, "label_key", None)
    template = bool(getattr(args, "apply_chat_template", False))
    max_len = getattr(args, "rollout_max_prompt_len", None)
    for where, row in _read_rows(str(path)):
        if not isinstance(row, dict):
            raise ValueError(f"{where} holds a {type(row).__name__}, not a JSON object with key {input_key!r}")
        if row.get(input_key) is None:
            raise ValueError(f"{where} has no key {input_key!r} (or it is null; the row has "
                             f"{_present_keys(row)}): set --input-key to the key that holds the prompt")
        raw = row[input_key]
        metadata, tools = _row_metadata(args, row, where)
        if template:
            messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
            if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
                raise ValueError(f"{where}: {input_key!r} holds a {type(raw).__name__}; --apply-chat-template "
                                 "needs a string or a list of chat messages ({'role': ..., 'content': ...})")
            extra = {"tools": tools} if tools is not None else {}
            prompt: Any = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **extra,
                **(getattr(args, "apply_chat_template_kwargs", None) or {}),
            )
        else:
            prompt = raw
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] if isinstance(prompt, str) else []
        if isinstance(prompt, str) and max_len is not None and len(ids) > max_len:
            dropped += 1
            continue
        label = row.get(label_key) if label_key else None
        prompts.append(Prompt(len(prompts), prompt, ids, label, metadata))
    if dropped:
        logger.warning("%s: dropped %d prompts longer than --rollout-max-prompt-len", path, dropped)
    if not prompts:
        raise ValueError(f"{path} holds no usable prompts")
    return prompts


class DataSource(ABC):
    """What a rollout function draws prompt groups from (slime's `--data-source-path` interface)."""

    @abstractmethod
    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """`num_samples` groups of fresh samples (one group per prompt)."""

    @abstractmethod
    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Give groups back (e.g. aborted ones) to be served again."""

    @abstractmethod
    def save(self, rollout_id: int) -> None:
        """Persist the position after step `rollout_id`."""

    @abstractmethod
    def load(self, rollout_id: int | None = None) -> None:
        """Restore the position saved after step `rollout_id`."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of prompts."""


def _is_prompt_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(p, Prompt) for p in value)


def prompts_from_args(args: Any) -> list[Prompt]:
    """slime's global dataset: `--prompt-data` read with the `--hf-checkpoint` tokenizer, or no prompts
    under `--disable-rollout-global-dataset` (or without `--prompt-data`)."""
    if not getattr(args, "rollout_global_dataset", True) or not getattr(args, "prompt_data", None):
        return []
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint, trust_remote_code=True)
    return load_prompts(args, args.prompt_data, tokenizer)


class RolloutDataSource(DataSource):
    """Groups of `n_samples_per_prompt` fresh samples in a deterministic, resumable order.

    Built as slime builds it, `RolloutDataSource(args)`: prompts from `--prompt-data` (none under
    `--disable-rollout-global-dataset`: each group is then `n` empty samples for a rollout function that
    brings its own data), `--n-samples-per-prompt`, `--rollout-shuffle`, `--rollout-seed`, `--save`,
    `--load`. Or (ours) from prompts already loaded: `RolloutDataSource(prompts, n, shuffle=, seed=)`.

    Order: epoch e visits prompts in `random.Random(seed + e).shuffle(range(N))` (or 0..N-1).
    Groups given back with `put_back` (kept but not needed this step) are served first next time.
    `state()` / `load_state()` hold everything needed to continue exactly.
    """

    def __init__(self, args: Any, /, n_samples_per_prompt: int | None = None, *, shuffle: bool | None = None,
                 seed: int | None = None, save_dir: str | Path | None = None,
                 load_dir: str | Path | None = None, **options: Any):
        unknown = sorted(set(options) - {"args"})
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected keyword arguments {unknown}")
        if _is_prompt_list(args):  # ours: prompts loaded by the caller; `args=` optionally the namespace
            prompts, self.args = list(args), options.get("args")
            if n_samples_per_prompt is None or shuffle is None or seed is None:
                raise TypeError("RolloutDataSource(prompts, ...) needs n_samples_per_prompt, shuffle= and seed=")
        else:  # slime's: everything from the namespace
            if "args" in options:
                raise TypeError("pass the namespace once: RolloutDataSource(args)")
            self.args = args
            prompts = prompts_from_args(args)
            n_samples_per_prompt = args.n_samples_per_prompt if n_samples_per_prompt is None else n_samples_per_prompt
            shuffle = bool(getattr(args, "rollout_shuffle", False)) if shuffle is None else shuffle
            seed = int(getattr(args, "rollout_seed", 42)) if seed is None else seed
            save_dir = getattr(args, "save", None) if save_dir is None else save_dir
            load_dir = getattr(args, "load", None) if load_dir is None else load_dir
        self.prompts = prompts
        self.save_dir = save_dir  # slime's --save
        self.load_dir = load_dir if load_dir is not None else save_dir  # slime's --load
        self.n = n_samples_per_prompt
        self.shuffle, self.seed = shuffle, seed
        self.epoch, self.offset = 0, 0
        self.group_counter, self.sample_counter = 0, 0
        self.pending: list[int] = []
        self.metadata: dict[str, Any] = {}  # slime's free-form data-source metadata (update_metadata)
        self._order = self._epoch_order(0)

    @property
    def n_samples_per_prompt(self) -> int:
        return self.n

    def __len__(self) -> int:
        return len(self.prompts)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def _next_prompt_index(self) -> int:
        if self.pending:
            return self.pending.pop(0)
        if self.offset >= len(self._order):
            self.epoch += 1
            self.offset = 0
            self._order = self._epoch_order(self.epoch)
        index = self._order[self.offset]
        self.offset += 1
        return index

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        if not self.prompts:  # no global dataset: empty samples for the rollout function to fill, as slime
            return [self._empty_group() for _ in range(num_groups)]
        return [self.make_group(self._next_prompt_index()) for _ in range(num_groups)]

    def _empty_group(self) -> list[Sample]:
        group = [Sample(group_index=self.group_counter, index=self.sample_counter + i) for i in range(self.n)]
        self.sample_counter += self.n
        self.group_counter += 1
        return group

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """slime's: merge into the data source's metadata (saved with its state)."""
        self.metadata.update(metadata)

    def get_metadata(self) -> dict[str, Any]:
        return self.metadata

    def make_group(self, prompt_index: int, n: int | None = None) -> list[Sample]:
        p = self.prompts[prompt_index]
        group = []
        for _ in range(self.n if n is None else n):
            metadata = copy.deepcopy(p.metadata)
            metadata["prompt_index"] = p.index
            group.append(Sample(
                group_index=self.group_counter, index=self.sample_counter, prompt=copy.deepcopy(p.prompt),
                tokens=list(p.token_ids), label=p.label, metadata=metadata,
            ))
            self.sample_counter += 1
        self.group_counter += 1
        return group

    def put_back(self, prompt_indices: Sequence[int]) -> None:
        self.pending = list(prompt_indices) + self.pending

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "group_counter": self.group_counter,
                "sample_counter": self.sample_counter, "pending": list(self.pending),
                "num_prompts": len(self.prompts), "shuffle": self.shuffle, "seed": self.seed,
                "metadata": copy.deepcopy(self.metadata)}

    def load_state(self, state: dict[str, Any]) -> None:
        if state.get("num_prompts") != len(self.prompts):
            raise ValueError(
                f"checkpoint data state is for {state.get('num_prompts')} prompts but --prompt-data has "
                f"{len(self.prompts)}: resume with the same prompt file"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.group_counter, self.sample_counter = int(state["group_counter"]), int(state["sample_counter"])
        self.pending = [int(i) for i in state["pending"]]
        self.metadata = dict(state.get("metadata") or {})
        self._order = self._epoch_order(self.epoch)

    def add_samples(self, samples: list[list[Sample]]) -> None:
        raise NotImplementedError(
            "RolloutDataSource keeps no sample buffer: use RolloutDataSourceWithBuffer to give groups back"
        )

    def _state_path(self, rollout_id: int, root: str | Path | None) -> Path:
        if root is None:
            raise ValueError("this data source has no save_dir/load_dir: pass them (slime's --save / --load)")
        return Path(root) / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt"

    def save(self, rollout_id: int, state: dict[str, Any] | None = None) -> None:
        """Write `state()` to `{save_dir}/rollout/global_dataset_state_dict_{rollout_id}.pt`.

        `state` (ours) writes that position instead of the current one: the async loop saves the
        position before the draws of the step already in flight. Written atomically (rename).
        """
        import torch

        path = self._state_path(rollout_id, self.save_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.state() if state is None else state, tmp)
        tmp.replace(path)

    def load(self, rollout_id: int | None = None) -> None:
        """Restore what `save(rollout_id)` wrote under `load_dir` (the newest saved step when None)."""
        import torch

        if rollout_id is None:
            folder = self._state_path(0, self.load_dir).parent
            saved = sorted(int(p.stem.rsplit("_", 1)[1]) for p in folder.glob("global_dataset_state_dict_*.pt"))
            if not saved:
                logger.info("no data-source state under %s: starting from the beginning", folder)
                return
            rollout_id = saved[-1]
        path = self._state_path(rollout_id, self.load_dir)
        if not path.is_file():
            raise FileNotFoundError(f"no data-source state {path}: was step {rollout_id} saved with --save there?")
        self.load_state(torch.load(path, weights_only=False))


PromptDataSource = RolloutDataSource  # the name this package used before slime's module layout


def pop_first(
    args: argparse.Namespace | None, rollout_id: int | None, buffer: list[list[Sample]], num_samples: int
) -> list[list[Sample]]:
    """slime's default buffer filter: remove and return the oldest `num_samples` groups (or all)."""
    taken = buffer[: max(num_samples, 0)]
    del buffer[: len(taken)]
    return taken


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """`RolloutDataSource` plus a buffer of groups given back with `add_samples`.

    `get_samples(n)` first takes groups from the buffer through the buffer filter (`buffer_filter`,
    else `args.buffer_filter_path` when set, else `pop_first`), then draws fresh prompts for the rest.
    Buffered groups keep their samples (and their group and sample indices) as they were given back.
    The buffer is part of `state()`, as `Sample.to_dict` dumps.
    """

    def __init__(self, args: Any, /, n_samples_per_prompt: int | None = None, *, shuffle: bool | None = None,
                 seed: int | None = None, save_dir: str | Path | None = None,
                 buffer_filter: Callable[..., list[list[Sample]]] | None = None,
                 load_dir: str | Path | None = None, **options: Any):
        super().__init__(args, n_samples_per_prompt, shuffle=shuffle, seed=seed, save_dir=save_dir,
                         load_dir=load_dir, **options)
        path = getattr(self.args, "buffer_filter_path", None)
        self.buffer_filter = buffer_filter or (load_function(path) if path else pop_first)
        self.buffer: list[list[Sample]] = []

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        groups = self.buffer_filter(self.args, None, self.buffer, num_samples) if self.buffer and num_samples else []
        if len(groups) > num_samples:
            raise ValueError(f"buffer filter returned {len(groups)} groups for {num_samples} requested")
        return list(groups) + super().get_samples(num_samples - len(groups))

    def add_samples(self, samples: list[list[Sample]]) -> None:
        for group in samples:
            if not isinstance(group, list) or not all(isinstance(s, Sample) for s in group):
                raise TypeError("add_samples takes a list of groups (list[list[Sample]])")
            self.buffer.append(group)

    def get_buffer_length(self) -> int:
        return len(self.buffer)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "buffer": [[s.to_dict() for s in g] for g in self.buffer]}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.buffer = [[Sample.from_dict(d) for d in g] for g in state.get("buffer", [])]

