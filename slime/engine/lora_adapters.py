"""LoRA on the engine side: SGLang's launch flags and request fields, and the CPU engine's adapters.

Why here: a LoRA run trains only an adapter (peft's format: `adapter_config.json` +
`adapter_model.safetensors`) and the engines serve base + adapter. SGLang does that with its own
launch flags (`--enable-lora --max-lora-rank R --lora-target-modules M.. --max-loras-per-batch N`), the `/load_lora_adapter` / `/unload_lora_adapter` routes (bodies
`{"lora_name", "lora_path"}` / `{"lora_name"}`) and `lora_path` (the adapter's *name*) in a /generate
body. tests/slime/test_sglang_lora_conformance.py checks all of it against both pinned sglangs' own code.

The CPU engine (`slime.engine.batcher`) serves the same routes with `AdapterSet`: each loaded adapter
keeps its low-rank factors beside the untouched base weights, and a forward hook on every targeted
Linear adds `scale * x @ A^T @ B^T` to the rows of the batch whose request named that adapter (base
rows are left alone), so base and adapter requests share one batch. An adapter folder is data from a
trainer and is read bounded: the config as JSON of at most MAX_CONFIG_BYTES, the weights from
safetensors only (never pickle), at most MAX_ADAPTER_BYTES and MAX_ADAPTER_TENSORS; a folder the
engine cannot serve exactly is an `AdapterError` (HTTP 400) that says why.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where adapters are served: the rollout's helpers here stay light
    import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20
MAX_ADAPTER_BYTES = 4 << 30
MAX_ADAPTER_TENSORS = 1 << 16
MAX_NAME_CHARS = 256
# The name slime loads its trained adapter under and names in `lora_path` (one adapter per run).
DEFAULT_ADAPTER_NAME = "slime-lora"
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# SGLang's --lora-target-modules values that both pinned versions accept (tested). The engines get the
# trainer's exact list (`--target-modules` less `--exclude-modules`, as slime.backends.lora reads them),
# never sglang's `all`, whose meaning is sglang's per architecture.
SGLANG_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj",
                         "gate_up_proj")
# sglang counts base-only requests as one of the adapters of a batch: the policy adapter + base.
DEFAULT_MAX_LORAS_PER_BATCH = 2


class AdapterError(ValueError):
    """An adapter folder or adapter request the engine cannot serve; HTTP 400 with this message."""


# ---- launch flags and request fields (SGLang's names) ------------------------------------------------


def _values(args: Any) -> dict[str, Any]:
    if args is None:
        return {}
    return dict(args) if isinstance(args, Mapping) else dict(vars(args))


def lora_rank(args: Any) -> int:
    """The run's LoRA rank (`--lora-rank`; 0 or absent: no LoRA)."""
    rank = _values(args).get("lora_rank") or 0
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError(f"lora_rank must be a non-negative int (0: no LoRA), got {rank!r}")
    return rank


def adapter_name(args: Any) -> str | None:
    """The name the run's adapter is loaded under and requested by (`lora_path`); None without LoRA."""
    if not lora_rank(args):
        return None
    name = _values(args).get("lora_adapter_name") or DEFAULT_ADAPTER_NAME
    if not isinstance(name, str) or "=" in name or len(name) > MAX_NAME_CHARS:
        raise ValueError(f"the LoRA adapter name {name!r} must be a string without '=' (sglang's --lora-paths "
                         f"reads NAME=PATH) of at most {MAX_NAME_CHARS} characters")
    return name


def parse_target_modules(text: str | list[str] | tuple[str, ...] | None, exclude: str | None = None
                         ) -> tuple[str, ...]:
    """--target-modules / --exclude-modules as upstream reads them: "all-linear" (the seven projections of
    a Llama/Qwen block) or comma-separated module names, less the excluded ones."""
    if text is None or text == "all-linear":
        names = list(ALL_LINEAR)
    elif isinstance(text, str):
        names = [n.strip() for n in text.split(",") if n.strip()]
    else:
        names = [str(n).strip() for n in text if str(n).strip()]
    dropped = {n.strip() for n in (exclude or "").split(",") if n.strip()}
    kept = tuple(n for n in names if n not in dropped)
    if not kept:
        raise ValueError(f"--target-modules {text!r} less --exclude-modules {exclude!r} leaves no module to adapt")
    return kept


def sglang_target_modules(targets: Any, exclude: str | None = None) -> list[str]:
    """The run's `--target-modules` less `--exclude-modules` (read by slime.backends.lora, as the trainer
    reads them: "all-linear" or comma-separated names) as sglang's `--lora-target-modules` values; a module
    sglang cannot adapt is a ValueError that lists those it can."""

    names = list(parse_target_modules(targets, exclude))
    unknown = [n for n in names if n not in SGLANG_TARGET_MODULES]
    if unknown:
        raise ValueError(f"LoRA target modules {unknown} cannot be served by SGLang: use 'all-linear' or names "
                         f"from {list(SGLANG_TARGET_MODULES)}")
    return sorted(set(names), key=SGLANG_TARGET_MODULES.index)


def lora_server_fields(args: Any) -> dict[str, Any]:
    """SGLang ServerArgs fields for a LoRA run (`lora_rank` > 0; empty otherwise): enable_lora,
    max_lora_rank, lora_target_modules (from `target_modules` / `exclude_modules`), max_loras_per_batch.
    `sglang_<field>` arguments still override each.

    No `--lora-paths`: an engine starts without adapters and gets each one from the trainer's sync
    (/load_lora_adapter), also the first and the one of `--lora-adapter-path`; an engine restarted
    mid-run would otherwise serve a launch-time folder under the name of the current adapter."""
    rank = lora_rank(args)
    if not rank:
        return {}
    values = _values(args)
    fields: dict[str, Any] = {
        "enable_lora": True,
        "max_lora_rank": rank,
        "lora_target_modules": sglang_target_modules(values.get("target_modules"), values.get("exclude_modules")),
        "max_loras_per_batch": DEFAULT_MAX_LORAS_PER_BATCH,
    }
    return fields


def generate_lora_fields(args: Any) -> dict[str, Any]:
    """What a /generate body adds in a LoRA run: {"lora_path": <adapter name>} (sglang's field takes
    the name an adapter was loaded under); {} otherwise."""
    name = adapter_name(args)
    return {} if name is None else {"lora_path": name}


def load_adapter_body(name: str, path: str | os.PathLike) -> dict[str, Any]:
    """The /load_lora_adapter body (sglang's LoadLoRAAdapterReqInput)."""
    return {"lora_name": name, "lora_path": str(path)}


def unload_adapter_body(name: str) -> dict[str, Any]:
    """The /unload_lora_adapter body (sglang's UnloadLoRAAdapterReqInput)."""
    return {"lora_name": name}


# ---- reading a peft adapter folder --------------------------------------------------------------------


@dataclass
class Adapter:
    """One adapter's factors per module path: (A [r, in], B [out, r], scale)."""

    name: str
    path: str
    rank: int
    layers: dict[str, tuple[torch.Tensor, torch.Tensor, float]]
    generation: int = 0  # set by AdapterSet.add: which load this is (the prefix cache keys KV by it)


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
        raise AdapterError(f"lora_name must be a non-empty string of at most {MAX_NAME_CHARS} characters, "
                           f"got {name!r}")
    return name


def _config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise AdapterError(f"{folder} has no {CONFIG_FILE}: send the folder peft's save_pretrained wrote")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise AdapterError(f"{path} is over {MAX_CONFIG_BYTES} bytes: not an adapter config")
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{path} must hold a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path} is a {config.get('peft_type')} adapter: the engine serves LORA adapters only")
    unsupported = {
        "use_dora": bool(config.get("use_dora")),
        "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
        "bias": config.get("bias", "none") != "none",
        "lora_bias": bool(config.get("lora_bias")),
        "modules_to_save": bool(config.get("modules_to_save")),
        "rank_pattern": bool(config.get("rank_pattern")),
        "alpha_pattern": bool(config.get("alpha_pattern")),
        "layers_to_transform": config.get("layers_to_transform") is not None,
    }
    on = sorted(k for k, v in unsupported.items() if v)
    if on:
        raise AdapterError(f"{path} sets {on}: the engine serves plain LoRA (one r and lora_alpha, no bias, no "
                           "DoRA, no extra trained modules); train without them")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(f"{path}: r must be a positive int, got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterError(f"{path}: lora_alpha must be a number, got {alpha!r}")
    return config


def _module_of(key: str) -> tuple[str, str]:
    """("model.layers.0.self_attn.q_proj", "A") from peft's "base_model.model.<module>.lora_A.weight"."""
    match = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])\.weight", key)
    if match is None:
        raise AdapterError(f"tensor {key!r} is not a LoRA factor of a Linear layer (peft names them "
                           "base_model.model.<module>.lora_A.weight / lora_B.weight)")
    return match.group(1), match.group(2)


def read_adapter(name: str, folder: str | os.PathLike, model: torch.nn.Module, dtype: torch.dtype) -> Adapter:
    """A peft LoRA folder checked against `model`: every factor pair belongs to one of its Linear
    layers with matching shapes; factors in `dtype`. Raises AdapterError saying what is wrong."""
    import torch
    from safetensors import SafetensorError, safe_open

    name = check_name(name)
    if not isinstance(folder, (str, os.PathLike)) or not str(folder):
        raise AdapterError(f"lora_path must be the path of an adapter folder, got {folder!r}")
    root = Path(folder)
    if not root.is_dir():
        raise AdapterError(f"{root} is not a folder: lora_path must name the folder peft's save_pretrained wrote")
    config = _config(root)
    rank = config["r"]
    scale = config["lora_alpha"] / (math.sqrt(rank) if config.get("use_rslora") else rank)
    weights = root / WEIGHTS_FILE
    if not weights.is_file():
        raise AdapterError(f"{root} has no {WEIGHTS_FILE} (the engine reads safetensors only, never pickled .bin)")
    if weights.stat().st_size > MAX_ADAPTER_BYTES:
        raise AdapterError(f"{weights} is over {MAX_ADAPTER_BYTES} bytes: not a LoRA adapter")
    factors: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(weights), framework="pt") as handle:
            keys = list(handle.keys())
            if not keys or len(keys) > MAX_ADAPTER_TENSORS:
                raise AdapterError(f"{weights} holds {len(keys)} tensors: expected 1 to {MAX_ADAPTER_TENSORS} "
                                   "LoRA factors")
            for key in keys:
                module, side = _module_of(key)
                factors.setdefault(module, {})[side] = handle.get_tensor(key)
    except (SafetensorError, OSError) as exc:
        raise AdapterError(f"{weights} is not a readable safetensors file: {exc}") from exc
    modules = dict(model.named_modules())
    layers = {}
    for module, pair in sorted(factors.items()):
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"{module} has lora_{''.join(pair)} without its partner: the adapter is incomplete")
        target = modules.get(module)
        if not isinstance(target, torch.nn.Linear):
            raise AdapterError(f"{module} is not a Linear layer of the served model: the adapter is for "
                               "another model")
        a, b = pair["A"], pair["B"]
        want_a, want_b = (rank, target.in_features), (target.out_features, rank)
        if tuple(a.shape) != want_a or tuple(b.shape) != want_b:
            raise AdapterError(f"{module}: lora_A {list(a.shape)} / lora_B {list(b.shape)} do not fit r={rank} on "
                               f"[{target.out_features}, {target.in_features}]: expected {list(want_a)} / "
                               f"{list(want_b)}")
        if not (a.is_floating_point() and b.is_floating_point()):
            raise AdapterError(f"{module}: LoRA factors must be floating point, got {a.dtype} / {b.dtype}")
        layers[module] = (a.to(dtype).contiguous(), b.to(dtype).contiguous(), float(scale))
    return Adapter(name=name, path=str(root), rank=rank, layers=layers)


# ---- serving: adapters on top of one base model --------------------------------------------------------


class AdapterSet:
    """The CPU engine's loaded adapters and the hooks that apply them per batch row.

    Used from the batching thread only: `rows` (one adapter name or None per row of the next forward)
    is set right before each model call, and `bind(model)` re-installs the hooks when the served model
    object changed (a weight reload that rebuilt it)."""

    def __init__(self, max_loaded: int = 8):
        self.max_loaded = max_loaded
        self.adapters: dict[str, Adapter] = {}
        self.rows: list[str | None] = []
        self._model: torch.nn.Module | None = None
        self._hooks: dict[str, Any] = {}
        self._loads = itertools.count(1)  # never reused: a reload under the same name is new weights

    def __contains__(self, name: object) -> bool:
        return name in self.adapters

    def loaded(self) -> dict[str, str]:
        """name -> folder, as sglang's LoRAUpdateOutput lists `loaded_adapters`."""
        return {name: adapter.path for name, adapter in dict(self.adapters).items()}  # a copy: any thread

    def weights_of(self, name: str | None) -> tuple[str, int] | None:
        """What computes a request's KV (the prefix cache's `Weights`): None for the base model,
        (name, load generation) for a loaded adapter."""
        return None if name is None else (name, self.adapters[name].generation)

    def add(self, adapter: Adapter, model: torch.nn.Module) -> None:
        if adapter.name in self.adapters:
            raise AdapterError(f"LoRA with name {adapter.name} already exists: unload it first "
                               f"(loaded: {sorted(self.adapters)})")
        if len(self.adapters) >= self.max_loaded:
            raise AdapterError(f"{len(self.adapters)} adapters are loaded, the most this engine holds: unload one "
                               f"of {sorted(self.adapters)} first")
        adapter.generation = next(self._loads)
        self.adapters[adapter.name] = adapter
        self.bind(model)

    def remove(self, name: str, model: torch.nn.Module) -> None:
        if name not in self.adapters:
            raise AdapterError(f"LoRA with name {name} does not exist (loaded: {sorted(self.adapters)})")
        del self.adapters[name]
        self.bind(model)

    def bind(self, model: torch.nn.Module) -> None:
        """Hook exactly the Linear layers some loaded adapter targets, on `model`."""
        wanted = {module for adapter in self.adapters.values() for module in adapter.layers}
        if model is not self._model:
            for handle in self._hooks.values():
                handle.remove()
            self._hooks, self._model = {}, model
        for module in set(self._hooks) - wanted:
            self._hooks.pop(module).remove()
        if wanted - set(self._hooks):
            modules = dict(model.named_modules())
            for module in wanted - set(self._hooks):
                self._hooks[module] = modules[module].register_forward_hook(self._hook(module))

    def _hook(self, module: str) -> Any:
        import torch

        def apply(_: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            rows = self.rows
            if not any(rows):
                return output
            if len(rows) != output.shape[0]:
                raise RuntimeError(f"LoRA rows name {len(rows)} requests for a batch of {output.shape[0]}")
            x = inputs[0]
            for name in {r for r in rows if r is not None}:
                layer = self.adapters[name].layers.get(module)
                if layer is None:
                    continue
                a, b, scale = layer
                index = torch.tensor([i for i, r in enumerate(rows) if r == name], dtype=torch.long)
                delta = (x.index_select(0, index) @ a.T) @ b.T
                output = output.index_add(0, index, delta.to(output.dtype), alpha=scale)
            return output

        return apply
