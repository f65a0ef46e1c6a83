"""LoRA on the torch backend: peft adapters on a frozen base; what is trained, synced, saved and merged.

    W' = W + (alpha / r) * B @ A        A: [r, in], B: [out, r], B = 0 at the start (peft's init)

`apply_lora` injects peft's LoRA layers into the HF model in place (`get_peft_model`): the model keeps
its class and module names, the targeted `nn.Linear`s become peft `lora.Linear`s whose weights are
named `<module>.base_layer.weight` (frozen) and `<module>.lora_{A,B}.default.weight` (the only
parameters that require grad, so the only ones the trainer's optimizer gets). The trainer then wraps
and shards the model as without LoRA: FSDP2 shards the adapters with their decoder layer.

What leaves the trainer:
- the adapter (`adapter_tensors`, `save_adapter`): peft's own format, the keys peft's
  `save_pretrained` writes (`base_model.model.<module>.lora_A.weight`, no adapter name) and the folder
  it writes (adapter_config.json + adapter_model.safetensors), which SGLang's `--lora-paths` and
  `/load_lora_adapter` and peft's `PeftModel.from_pretrained` read;
- merged weights (`merge_state`, `merged_named_tensors`): plain HF names and shapes with the update
  folded in, as peft's `merge_and_unload` computes it, for engines or a release without peft.
Never the base weights under peft's names: an engine would not know them.

Flags (slime/arguments.py) follow upstream slime's FSDP backend: --lora-rank (0: off), --lora-alpha,
--target-modules ("all-linear" or a comma list), --exclude-modules, --lora-adapter-path; and
--lora-dropout (upstream's Megatron-bridge flag).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from slime.engine.lora_adapters import (  # the flags' meaning, shared with the engines
    ALL_LINEAR,
    parse_target_modules,
)

ADAPTER_NAME = "default"  # peft's name of the adapter inside the model; adapter files do not carry it
# What upstream slime's --target-modules all-linear stands for: every projection of a Llama/Qwen block.
PEFT_PREFIX = "base_model.model."  # the keys of a PeftModelForCausalLM's state dict and adapter files
ROOT_PREFIX = "lm."  # the trainer's LogProbForward root keeps the HF model as `self.lm`
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
INIT_SEED = 0  # the RNG seed of the adapters' initialisation (the caller's RNG state is left as it was)
ADAPTER_DIR = "adapter"  # the adapter folder inside a LoRA checkpoint's iter_* directory


@dataclass(frozen=True)
class LoraSettings:
    """The adapter's shape: rank r, alpha (scale alpha / r), the module names it adapts, dropout.

    `adapter_path`: start from this peft adapter folder (its rank, alpha and targets must be these).
    """

    rank: int
    alpha: float = 16.0
    target_modules: tuple[str, ...] = ALL_LINEAR
    dropout: float = 0.0
    adapter_path: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r} (rank 0 means no LoRA: "
                             "build no LoraSettings)")
        if not (self.alpha > 0 and float(self.alpha) != float("inf")):
            raise ValueError(f"--lora-alpha must be > 0 and finite, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--lora-dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules:
            raise ValueError("LoRA needs at least one target module: --target-modules all-linear or a comma list "
                             "such as q_proj,v_proj")

    @property
    def scaling(self) -> float:
        """What B @ A is multiplied by in the forward (and in the merge): alpha / r, as peft without rslora."""
        return float(self.alpha) / self.rank

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoraSettings | None:
        """The settings of slime's flags, or None when --lora-rank is 0 (full fine-tuning)."""
        rank = int(getattr(args, "lora_rank", 0) or 0)
        if rank == 0:
            return None
        targets = parse_target_modules(getattr(args, "target_modules", "all-linear"),
                                       getattr(args, "exclude_modules", None))
        return cls(rank=rank, alpha=float(getattr(args, "lora_alpha", 16.0)), target_modules=targets,
                   dropout=float(getattr(args, "lora_dropout", 0.0)),
                   adapter_path=getattr(args, "lora_adapter_path", None))

    def describe(self) -> dict[str, Any]:
        """JSON of what must match for a checkpoint to resume: rank, alpha, targets (sorted), dropout."""
        return {"rank": self.rank, "alpha": float(self.alpha), "target_modules": sorted(self.target_modules),
                "dropout": float(self.dropout)}

    def peft_config(self) -> Any:
        """peft's LoraConfig of these settings (plain LoRA: no bias, no rslora, no DoRA)."""
        from peft import LoraConfig

        return LoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=list(self.target_modules),
                          lora_dropout=self.dropout, bias="none", task_type="CAUSAL_LM")


# ---- the model -----------------------------------------------------------------------------------


def apply_lora(model: torch.nn.Module, settings: LoraSettings) -> Any:
    """Inject LoRA into the HF causal LM `model` in place (base frozen); returns peft's PeftModel around it.

    Every targeted module must be an nn.Linear (the merge here is a matrix product). With
    `settings.adapter_path` the adapter starts from that folder's weights.
    """
    from peft import get_peft_model

    target_linears(model, settings)  # refuses targets that name no module or a non-Linear one
    # A's random init from a fixed seed: every data-parallel rank (each builds its own copy before FSDP2
    # keeps its shard of it) and every run of the same settings starts from the same adapter
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(INIT_SEED)
        peft_model = get_peft_model(model, settings.peft_config())
    if settings.adapter_path:
        config, tensors = read_adapter(settings.adapter_path)
        check_adapter_config(config, settings, settings.adapter_path)
        load_adapter_tensors(model, tensors, prefix="")
    return peft_model


def target_linears(model: torch.nn.Module, settings: LoraSettings) -> dict[str, torch.nn.Linear]:
    """The Linear layers `settings` adapts, by module name: those whose last name part is a target (how peft
    matches a list of names). One rule for the injection (`apply_lora`) and for sizing an adapter before
    any weight exists (`adapter_parameter_count`). A target that names no module, or a module that is not
    an nn.Linear, is a ValueError saying how to fix --target-modules."""
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in settings.target_modules if t not in present]
    if missing:
        raise ValueError(f"LoRA target modules {missing} are not module names of {type(model).__name__} (it has "
                         f"e.g. {sorted(n for n in present if n.endswith('proj'))[:12]}): fix --target-modules")
    out: dict[str, torch.nn.Linear] = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in settings.target_modules:
            continue
        if not isinstance(module, torch.nn.Linear):
            raise ValueError(f"LoRA target {name} is a {type(module).__name__}, not an nn.Linear: only linear "
                             "layers are adapted here; drop it from --target-modules")
        out[name] = module
    return out


def adapter_parameter_count(model_dir: str | os.PathLike, settings: LoraSettings) -> int:
    """Parameters of the adapter `settings` puts on the HF model whose config.json is in `model_dir`:
    r x (in + out) per targeted Linear (A: [r, in], B: [out, r]). From the config alone, on a meta-device
    model (as `checkpoint.parameter_count`), so the launcher sizes a LoRA run's saves and adapter syncs
    before any weight is read or the trainer starts."""
    from slime.backends.checkpoint import meta_model

    linears = target_linears(meta_model(model_dir), settings).values()
    return sum(settings.rank * (m.in_features + m.out_features) for m in linears)


def is_adapter_name(name: str) -> bool:
    """Whether a parameter name (any prefix) is a LoRA factor."""
    return ".lora_A." in name or ".lora_B." in name


def adapter_parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The LoRA factors of `module` (the trainer's root or the HF model), by name, in module order."""
    return [(name, p) for name, p in module.named_parameters() if is_adapter_name(name)]


def _peft_key(param_name: str, prefix: str) -> str:
    """`lm.model.layers.0.self_attn.q_proj.lora_A.default.weight` -> peft's file key
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`."""
    name = param_name.removeprefix(prefix)
    for factor in ("lora_A", "lora_B"):
        name = name.replace(f".{factor}.{ADAPTER_NAME}.", f".{factor}.")
    return PEFT_PREFIX + name


def _param_name(peft_key: str, prefix: str) -> str:
    """The inverse of `_peft_key`."""
    if not peft_key.startswith(PEFT_PREFIX):
        raise ValueError(f"adapter key {peft_key!r} does not start with {PEFT_PREFIX!r}: not a peft LoRA adapter of "
                         "a causal LM")
    name = peft_key.removeprefix(PEFT_PREFIX)
    for factor in ("lora_A", "lora_B"):
        name = name.replace(f".{factor}.weight", f".{factor}.{ADAPTER_NAME}.weight")
    return prefix + name


def adapter_tensors(root: torch.nn.Module, *, prefix: str = ROOT_PREFIX, dtype: torch.dtype | None = None
                    ) -> dict[str, Tensor]:
    """The adapter as peft writes it: {peft key: full tensor}, copies on the parameters' device (in `dtype`).

    Collective under FSDP2 (each factor is all-gathered; every rank gets the full tensors): call it on
    every rank. `prefix`: what the parameter names of `root` have before the HF names ("lm." for the
    trainer's root, "" for the HF model itself).
    """
    out: dict[str, Tensor] = {}
    for name, param in adapter_parameters(root):
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        else:
            tensor = tensor.clone()
        out[_peft_key(name, prefix)] = tensor if dtype is None else tensor.to(dtype)
    return out


def tensor_bytes(tensors: Mapping[str, Tensor]) -> int:
    """Bytes the tensors hold (what a sync of them sends)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def load_adapter_tensors(root: torch.nn.Module, tensors: Mapping[str, Tensor], *, prefix: str = ROOT_PREFIX,
                         broadcast: bool = False) -> None:
    """Copy a peft adapter ({peft key: full tensor}) into the LoRA factors of `root`, exactly.

    The keys must be exactly this model's factors (same targets, same layers) and the shapes its shapes.
    `broadcast` (FSDP2 with several ranks): rank 0 passes the tensors, the others pass {} and receive.
    Collective under FSDP2.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    params = dict(adapter_parameters(root))
    state = {_param_name(key, prefix): value for key, value in tensors.items()}
    if state or not broadcast:
        extra = sorted(set(state) - set(params))
        lacking = sorted(set(params) - set(state))
        if extra or lacking:
            raise ValueError(f"the adapter does not fit this model's LoRA layers: {len(extra)} unknown tensors "
                             f"(e.g. {extra[:3]}), {len(lacking)} missing (e.g. {lacking[:3]}); it was trained with "
                             "other --target-modules or on another model")
        for name, value in state.items():
            if tuple(value.shape) != tuple(params[name].shape):
                raise ValueError(f"adapter tensor {name} has shape {tuple(value.shape)}, the model's is "
                                 f"{tuple(params[name].shape)}: another --lora-rank or another model")
        state = {name: value.to(params[name].dtype) for name, value in state.items()}
    set_model_state_dict(root, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=broadcast,
                                                               strict=False))


def base_fingerprint(root: torch.nn.Module, dp: Any = None) -> float:
    """Sum of |w| over the frozen (base) weights in float64: what tells a checkpoint's base model from
    another (an adapter resumed onto another --hf-checkpoint would train something else). Under FSDP2
    each rank sums its shards and `dp` adds them up (collective)."""
    total = 0.0
    for _, param in root.named_parameters():
        if param.requires_grad:
            continue
        tensor = param.detach()
        tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        for chunk in tensor.reshape(-1).split(1 << 24):  # no float64 copy of a whole embedding
            total += float(chunk.abs().sum(dtype=torch.float64))
    if dp is not None and getattr(dp, "fsdp", False):
        total = dp.sum([total])[0]
    return total


def same_base(saved: float, now: float) -> bool:
    """Whether two `base_fingerprint`s are of the same weights (summation order differs across shardings)."""
    return abs(saved - now) <= 1e-9 * max(abs(saved), abs(now), 1.0)


# ---- adapter folders -----------------------------------------------------------------------------


def save_adapter(peft_model: Any, tensors: Mapping[str, Tensor], out_dir: str | os.PathLike) -> Path:
    """Write `tensors` (from `adapter_tensors`) as peft's adapter folder, by peft's own `save_pretrained`:
    adapter_config.json + adapter_model.safetensors (fp32 unless the tensors are another dtype).

    Atomic: written beside `out_dir`, then renamed over it (an older adapter there is replaced).
    Call it on one rank (rank 0) with the gathered tensors.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # peft's save_pretrained takes the model's state dict names (with the adapter name) and writes its own keys
    state = {_param_name(key, PEFT_PREFIX): value.detach().cpu().contiguous() for key, value in tensors.items()}
    try:
        peft_model.save_pretrained(str(tmp), state_dict=state, save_embedding_layers=False)
        (tmp / "README.md").unlink(missing_ok=True)  # peft's model-card stub: nothing an engine reads
        old = out_dir.with_name(f"{out_dir.name}.old-{os.getpid()}")
        if out_dir.exists():
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def read_adapter(folder: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(adapter_config.json, {peft key: tensor}) of a peft adapter folder."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config_file, weights_file = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_file.is_file() or not weights_file.is_file():
        raise FileNotFoundError(f"{folder} is not a peft LoRA adapter folder: it needs {CONFIG_FILE} and "
                                f"{WEIGHTS_FILE} (what save_adapter / PeftModel.save_pretrained write)")
    return json.loads(config_file.read_text()), load_file(str(weights_file))


def check_adapter_config(config: Mapping[str, Any], settings: LoraSettings, where: Any) -> None:
    """Refuse an adapter whose kind, rank, alpha or targets differ from `settings`, saying which flag to change."""
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where}: a {config.get('peft_type')} adapter; only LoRA adapters load here")
    if config.get("use_dora") or config.get("use_rslora") or config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"{where}: DoRA, rsLoRA and per-module ranks or alphas are not supported here")
    targets = config.get("target_modules")
    targets = sorted([targets] if isinstance(targets, str) else (targets or []))
    wrong = []
    if config.get("r") != settings.rank:
        wrong.append(f"r={config.get('r')} (--lora-rank {settings.rank})")
    if float(config.get("lora_alpha", 0)) != float(settings.alpha):
        wrong.append(f"lora_alpha={config.get('lora_alpha')} (--lora-alpha {settings.alpha:g})")
    if targets != sorted(settings.target_modules):
        wrong.append(f"target_modules={targets} (--target-modules {','.join(settings.target_modules)})")
    if wrong:
        raise ValueError(f"{where}: the adapter has {', '.join(wrong)}: pass the adapter's values to these flags")


# ---- merged weights ------------------------------------------------------------------------------


def merge_state(state: Mapping[str, Tensor], scaling: float) -> dict[str, Tensor]:
    """HF-named weights with every adapter folded in: `<m>.weight = <m>.base_layer.weight + (B @ A) * scaling`,
    `<m>.base_layer.bias` -> `<m>.bias`, the factors dropped; other tensors as they are.

    `state`: the full weights of the LoRA-injected HF model under its names (`state_dicts.full_model_state`
    of the trainer's root). The arithmetic is peft's merge (`merge_and_unload`) in the weights' dtype.
    """
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if is_adapter_name(name):
            continue
        if ".base_layer." not in name:
            out[name] = tensor
            continue
        module, leaf = name.rsplit(".base_layer.", 1)
        if leaf == "weight":
            a, b = state[f"{module}.lora_A.{ADAPTER_NAME}.weight"], state[f"{module}.lora_B.{ADAPTER_NAME}.weight"]
            tensor = tensor + (b.to(tensor) @ a.to(tensor)) * scaling
        out[f"{module}.{leaf}"] = tensor
    return out


def merged_named_tensors(model: torch.nn.Module, scaling: float) -> Iterator[tuple[str, Tensor]]:
    """(HF name, merged full tensor) of the LoRA-injected HF `model`, one module at a time, for tensor
    weight syncs: `slime.weight_sync.hf_named_tensors` (DTensors gathered, tied head skipped) with each
    adapted weight merged as `merge_state` does. Collective under FSDP2."""
    from slime.weight_sync import hf_named_tensors

    pending: dict[str, dict[str, Tensor]] = {}
    for name, tensor in hf_named_tensors(model):
        if ".base_layer." in name:
            module, leaf = name.rsplit(".base_layer.", 1)
            if leaf != "weight":
                yield f"{module}.{leaf}", tensor
                continue
            part = "W"
        elif is_adapter_name(name):
            module, rest = name.split(".lora_", 1)
            part = rest[0]  # "A" or "B"
        else:
            yield name, tensor
            continue
        parts = pending.setdefault(module, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[module]
            w = parts["W"]
            yield f"{module}.weight", w + (parts["B"].to(w) @ parts["A"].to(w)) * scaling
    if pending:
        raise RuntimeError(f"LoRA modules without all of base weight, A and B: {sorted(pending)[:3]}")
