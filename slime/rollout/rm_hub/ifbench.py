"""IFBench instruction-following reward (`--rm-type ifbench`): 1.0 when a response follows every instruction.

The checkers themselves (Google's IFEval instruction checkers as extended by AllenAI's IFBench,
https://github.com/allenai/IFBench, module `evaluation_lib`) are not part of slime: they are a separate
repository with its own requirements (nltk, langdetect, ...). Upstream slime clones that repository and
pip-installs its requirements while the trainer runs; slime never does that (a training node may have no
network, and installing packages mid-run changes the environment under a running job). To use this reward,
clone IFBench, install its requirements and put the clone on PYTHONPATH; without it `--rm-type ifbench`
fails with `IFBenchUnavailable` saying so.

The sample's metadata says what to check: `instruction_id_list` (ids), `kwargs` (one dict per instruction,
or one dict for all; None values dropped), `prompt_text` and `record_id`; scoring is IFBench's strict mode.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any


class IFBenchUnavailable(ImportError):
    """IFBench's `evaluation_lib` cannot be imported."""


def _evaluation_lib() -> Any:
    try:
        return importlib.import_module("evaluation_lib")
    except ImportError as exc:
        raise IFBenchUnavailable(
            "--rm-type ifbench needs AllenAI's IFBench checkers, which slime does not bundle or install: run "
            "`git clone https://github.com/allenai/IFBench`, `pip install -r IFBench/requirements.txt`, and put "
            f"the clone on PYTHONPATH so that `import evaluation_lib` works (it failed: {exc})"
        ) from exc


def _instruction_ids(raw: Sequence[Any] | None) -> list[str]:
    return [text for text in (str(entry).strip() for entry in raw or [] if entry is not None) if text]


def _kwargs_per_instruction(raw: Any, count: int) -> list[dict[str, Any]]:
    """One kwargs dict per instruction: a list is padded with copies of its last entry (or cut), one dict
    is used for all; None values are dropped, as IFBench's own preprocessing does."""
    if isinstance(raw, list):
        entries = [dict(e) if isinstance(e, Mapping) else {} for e in raw]
    elif isinstance(raw, Mapping):
        entries = [dict(raw) for _ in range(count)]
    else:
        entries = [{} for _ in range(count)]
    entries = entries[:count] + [dict(entries[-1] if entries else {}) for _ in range(count - len(entries))]
    return [{k: v for k, v in e.items() if v is not None} for e in entries]


def compute_ifbench_reward(response: str | None, label: Any, metadata: Mapping[str, Any] | None = None) -> float:
    """1.0 when `response` follows all of the sample's instructions (IFBench strict), else 0.0; 0.0 when
    the metadata lists no instruction. Raises IFBenchUnavailable without IFBench's checkers."""
    lib = _evaluation_lib()
    if metadata is None or response is None:
        return 0.0
    ids = _instruction_ids(metadata.get("instruction_id_list"))
    if not ids:
        return 0.0
    prompt = "" if metadata.get("prompt_text") is None else str(metadata["prompt_text"])
    example = lib.InputExample(key=int(metadata.get("record_id") or 0), instruction_id_list=ids, prompt=prompt,
                               kwargs=_kwargs_per_instruction(metadata.get("kwargs"), len(ids)))
    result = lib.test_instruction_following_strict(example, {prompt: str(response)})
    return 1.0 if result.follow_all_instructions else 0.0
