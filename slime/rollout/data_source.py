"""Prompt sources: `DataSource` (the interface), `RolloutDataSource` (prompts in a deterministic,
resumable order), `RolloutDataSourceWithBuffer` (plus put-back groups served first) and `pop_first`,
the default buffer filter (`fn(args, rollout_id, buffer, num_samples) -> list[list[Sample]]`).

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

from slime.utils.plugins import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


@dataclass
class Prompt:
    """One dataset row, tokenised once at load time."""

    index: int
    prompt: str | list[dict[str, Any]]
    token_ids: list[int]
    label: str | None
    metadata: dict[str, Any]


def load_prompts(args: argparse.Namespace, path: str | Path, tokenizer: Any) -> list[Prompt]:
    """Read a JSONL prompt file: `--input-key` (text or messages), `--label-key`, `--metadata-key`.

    With `--apply-chat-template` messages (or a bare string, as one user turn) are rendered with the
    tokenizer's template and a generation prompt. Rows over `--rollout-max-prompt-len` are dropped.
    """
    prompts: list[Prompt] = []
    dropped = 0
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if args.input_key not in row:
                raise KeyError(f"{path}:{line_no} has no key {args.input_key!r}: set --input-key")
            raw = row[args.input_key]
            if args.apply_chat_template:
                messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
                text = tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True, **args.apply_chat_template_kwargs
                )
            elif isinstance(raw, str):
                text = raw
            else:
                raise ValueError(f"{path}:{line_no}: {args.input_key!r} holds messages; pass --apply-chat-template")
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if args.rollout_max_prompt_len is not None and len(ids) > args.rollout_max_prompt_len:
                dropped += 1
                continue
            label = row.get(args.label_key) if args.label_key else None
            metadata = row.get(args.metadata_key) or {}
            if isinstance(metadata, str):
                metadata = json.loads(metadata)
            prompts.append(Prompt(len(prompts), text, ids, None if label is None else str(label), dict(metadata)))
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


class RolloutDataSource(DataSource):
    """Groups of `n_samples_per_prompt` fresh samples in a deterministic, resumable order.

    Order: epoch e visits prompts in `random.Random(seed + e).shuffle(range(N))` (or 0..N-1).
    Groups given back with `put_back` (kept but not needed this step) are served first next time.
    `state()` / `load_state()` hold everything needed to continue exactly.
    """

    def __init__(self, prompts: Sequence[Prompt], n_samples_per_prompt: int, *, shuffle: bool, seed: int,
                 save_dir: str | Path | None = None, load_dir: str | Path | None = None):
        self.prompts = list(prompts)
        self.save_dir = save_dir  # slime's --save
        self.load_dir = load_dir if load_dir is not None else save_dir  # slime's --load
        self.n = n_samples_per_prompt
        self.shuffle, self.seed = shuffle, seed
        self.epoch, self.offset = 0, 0
        self.group_counter, self.sample_counter = 0, 0
        self.pending: list[int] = []
        self._order = self._epoch_order(0)

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
        return [self.make_group(self._next_prompt_index()) for _ in range(num_groups)]

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
                "num_prompts": len(self.prompts), "shuffle": self.shuffle, "seed": self.seed}

    def load_state(self, state: dict[str, Any]) -> None:
        if state.get("num_prompts") != len(self.prompts):
            raise ValueError(
                f"checkpoint data state is for {state.get('num_prompts')} prompts but --prompt-data has "
                f"{len(self.prompts)}: resume with the same prompt file"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.group_counter, self.sample_counter = int(state["group_counter"]), int(state["sample_counter"])
        self.pending = [int(i) for i in state["pending"]]
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

    def __init__(self, prompts: Sequence[Prompt], n_samples_per_prompt: int, *, shuffle: bool, seed: int,
                 save_dir: str | Path | None = None, args: argparse.Namespace | None = None,
                 buffer_filter: Callable[..., list[list[Sample]]] | None = None,
                 load_dir: str | Path | None = None):
        super().__init__(prompts, n_samples_per_prompt, shuffle=shuffle, seed=seed, save_dir=save_dir,
                         load_dir=load_dir)
        self.args = args
        path = getattr(args, "buffer_filter_path", None)
        self.buffer_filter = buffer_filter or (load_function(path) if path else pop_first)
        self.buffer: list[list[Sample]] = []

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        groups = self.buffer_filter(self.args, None, self.buffer, num_samples) if self.buffer else []
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

