"""The recipe's configuration: one table of knobs, one precedence rule, one resolver.

Every knob has a dotted key in `config.yaml` (`training.num_rollout`), an environment variable
(`NUM_ROLLOUT`, the reference recipe's names) and a target: a `python -m slime.train` flag, a key of
the runtime YAML the rollout reads (`awm_*`), or the launcher itself. A value is taken from the first
of these that sets it (the value `auto` sets nothing):

    launcher CLI (--set KEY=VALUE, --profile)  >  environment variable  >  --config file  >  profile

Profiles (`cpu`, `a100-40gb`, `h100`, `h200`) come from the first GPU's memory as reported by
`nvidia-smi`; no GPU -> `cpu`, the embedded default (bundled scenarios, small local model, CPU
engine). A value above the profile's budget is kept but warned about. No `.env` file is read.

Relative paths resolve against the working directory (CLI, environment), the config file's folder
(file) or the repository root (profile defaults).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from awm_grpo.launch.knobs import BUDGETS, KNOBS, PROFILES, REPO, SECTIONS, Derived, Knob

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "config.yaml"
AUTO = "auto"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """The configuration is broken; the message names where (file:line, variable or flag)."""


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """GPUs from `nvidia-smi --query-gpu=memory.total,name --format=csv,noheader[,nounits]` output."""
    gpus = []
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        memory, _, name = line.partition(",")
        number = memory.strip().split()[0] if memory.strip() else ""
        try:
            mib = float(number)
        except ValueError:
            raise ConfigError(f"cannot read GPU memory from nvidia-smi line {line!r}") from None
        gpus.append(Gpu(name.strip(), mib / 1024))
    return gpus


def detect_gpus() -> list[Gpu]:
    """The GPUs nvidia-smi reports; [] when there is no nvidia-smi or it finds no GPU."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(out)


def profile_for(gpus: list[Gpu]) -> str:
    """cpu (no GPU); h200 (>= 120 GiB); h100 (>= 70 GiB: H100, A100-80GB); a100-40gb (otherwise)."""
    if not gpus:
        return "cpu"
    memory = gpus[0].memory_gib
    return "h200" if memory >= 120 else "h100" if memory >= 70 else "a100-40gb"


# ---- reading values from one source --------------------------------------------------------------
def coerce(knob: Knob, value: Any, where: str) -> Any:
    """A value of the knob's kind; strings (environment, --set) are parsed. Raises ConfigError.

    null / none / ~ / "" mean null (e.g. DYNAMIC_SAMPLING_FILTER_PATH= turns the filter off), which
    only nullable knobs accept.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("null", "none", "~", "")):
        if knob.nullable:
            return None
        raise ConfigError(f"{where}: {knob.key} cannot be null")
    try:
        if knob.kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE | _FALSE:
                return text in _TRUE
            raise ValueError("expected true/false/1/0")
        if knob.kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError("expected an integer")
            return int(value)
        if knob.kind == "float":
            if isinstance(value, bool):
                raise ValueError("expected a number")
            return float(value)
        if knob.kind in ("str", "path"):
            text = str(value)
            if knob.choices and text not in knob.choices:
                raise ValueError(f"expected one of {', '.join(knob.choices)}")
            return text
        if knob.kind == "list":
            if isinstance(value, str):
                text = value.strip()
                value = yaml.safe_load(text) if text.startswith("[") else [p.strip() for p in text.split(",")
                                                                            if p.strip()]
            if not isinstance(value, list):
                raise ValueError("expected a list (YAML list, or comma-separated in a variable)")
            return [str(v) for v in value]
        if knob.kind == "dict":
            if isinstance(value, str):
                value = yaml.safe_load(value)
            if not isinstance(value, dict):
                raise ValueError('expected a mapping, e.g. {"rounds": [10, 20, 30], "every": 100}')
            return value
    except (ValueError, TypeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{where}: {knob.key} = {value!r}: {exc}") from None
    raise AssertionError(knob.kind)


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def load_file(path: str | Path) -> dict[str, tuple[Any, int]]:
    """{dotted key: (raw value, line)} of a config file; broken YAML or unknown keys raise with file:line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}:{root.start_mark.line + 1}: expected sections (a YAML mapping)")
    out: dict[str, tuple[Any, int]] = {}
    sections = {k.key.split(".")[0] for k in KNOBS}
    for sec_node, body in root.value:
        line, section = sec_node.start_mark.line + 1, sec_node.value
        if section not in sections:
            raise ConfigError(f"{path}:{line}: unknown section {section!r} (known: {', '.join(sorted(sections))})")
        if body.tag == "tag:yaml.org,2002:null":
            continue
        if not isinstance(body, yaml.MappingNode):
            raise ConfigError(f"{path}:{line}: section {section!r} must be a mapping of keys")
        for key_node, value_node in body.value:
            key, kline = f"{section}.{key_node.value}", key_node.start_mark.line + 1
            if key not in KNOB_BY_KEY:
                raise ConfigError(f"{path}:{kline}: unknown key {key!r}{_suggest(key)}")
            if key in out:
                raise ConfigError(f"{path}:{kline}: {key!r} is set twice (first at line {out[key][1]})")
            out[key] = (yaml.safe_load(yaml.serialize(value_node)), kline)
    return out


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(KNOB_BY_KEY) + list(KNOB_BY_ENV), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def parse_sets(items: list[str]) -> dict[str, str]:
    """`--set KEY=VALUE` items (KEY: dotted key or variable name) -> {dotted key: raw string}."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        knob = KNOB_BY_KEY.get(name.strip()) or KNOB_BY_ENV.get(name.strip())
        if not sep or knob is None:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a known key{_suggest(name.strip())}")
        out[knob.key] = value
    return out


# ---- resolution ----------------------------------------------------------------------------------
@dataclass
class ResolvedConfig:
    """Every knob's value and where it came from; `warnings` lists budget and consistency issues."""

    profile: str
    gpus: list[Gpu]
    values: dict[str, Any]
    sources: dict[str, str]
    warnings: list[str] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def table(self) -> str:
        """The resolved config, one knob a line, for the log of every run."""
        width = max(len(k) for k in self.values)
        lines = [f"resolved config (profile {self.profile}; precedence: CLI > environment > file > profile)"]
        lines += [f"  {k:<{width}} = {_show(v):<28} [{self.sources[k]}]" for k, v in self.values.items()]
        return "\n".join(lines + [f"  WARNING: {w}" for w in self.warnings])


def _show(value: Any) -> str:
    """A value as YAML writes it (null, true, [a, b]), so the log, the knob table and config.yaml agree."""
    if value is None or isinstance(value, (bool, list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n").removesuffix("\n...")
    return str(value)


PROFILE_NAMES = ("cpu", "a100-40gb", "h100", "h200")


def _cell(value: Any) -> str:
    return value.text if isinstance(value, Derived) else _show(value)


def knob_table() -> str:
    """Every knob with its variable, target and per-profile default, as Markdown (docs/knobs.md).

    Generated, not hand-kept: `bash awm_grpo/run_awm_grpo.sh --knobs > docs/knobs.md`, and a test
    fails when the file and this table disagree."""
    lines = ["# The recipe's knobs", "",
             "Generated by `bash awm_grpo/run_awm_grpo.sh --knobs` from `awm_grpo/launch/knobs.py`; do not edit by hand.",
             "Precedence: `--set KEY=VALUE` / `--profile` > environment variable > `--config` file > auto-profile.",
             "Targets: `--flag` goes to `python -m slime.train` (or `slime.train_async`, same flags); `yaml:awm_x` to",
             "the runtime YAML (`--custom-config-path`); `launcher` is used by the launcher itself.", "",
             "| knob | variable | goes to | " + " | ".join(PROFILE_NAMES) + " | what |",
             "|---" * (len(PROFILE_NAMES) + 4) + "|"]
    for knob in KNOBS:
        values = [_cell({**PROFILES["base"], **PROFILES[p]}.get(knob.key)).replace("|", "\\|") for p in PROFILE_NAMES]
        names = f"`{knob.env}`" + (f" or `{knob.alias}`" if knob.alias else "")
        lines.append(f"| `{knob.key}` | {names} | `{knob.target}` | " + " | ".join(values)
                     + f" | {knob.doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


CONFIG_HEADER = """\
# awm_grpo: multi-turn GRPO on AWM environments.
#
#   bash awm_grpo/run_awm_grpo.sh [--config FILE] [--set KEY=VALUE ...] [--profile P] [--dry-run] [-- slime flags]
#
# Precedence, one rule for every knob:
#   launcher CLI (--set, --profile)  >  environment variable  >  this file  >  auto-profile default
# `auto` means "not set here": the auto-profile decides. The profile comes from the first GPU's memory
# (nvidia-smi): h200 (>= 120 GiB), h100 (>= 70 GiB: H100, A100-80GB), a100-40gb (otherwise), and cpu
# when there is no GPU (the embedded default: bundled scenarios, a small local model, the CPU engine).
# Values above a GPU profile's budget are kept and warned about. No .env file is ever read.
# Relative paths in this file are relative to this file's folder. Unknown keys are errors.
# Every run prints each value with its source; `--dry-run` prints the command without running it.
#
# Each comment: VARIABLE -> where the value goes: what it is. Default: one value, "cpu: X; GPU: Y",
# or "cpu | a100-40gb | h100 | h200". Generated from awm_grpo/launch/knobs.py by
# `bash awm_grpo/run_awm_grpo.sh --config-template` (a test keeps them equal): set values in a copy
# passed with --config, or here.
"""


def _default_text(key: str) -> str:
    """A knob's default per profile, as short as the profiles allow."""
    values = [_cell({**PROFILES["base"], **PROFILES[p]}.get(key)) for p in PROFILE_NAMES]
    if len(set(values)) == 1:
        return values[0]
    if len(set(values[1:])) == 1:
        return f"cpu: {values[0]}; GPU: {values[1]}"
    return " | ".join(values)


def config_template(width: int = 118) -> str:
    """awm_grpo/config.yaml: every knob set to `auto`, its variable, target, meaning and defaults as a comment."""
    lines = [CONFIG_HEADER]
    for section, note in SECTIONS.items():
        lines.append(f"{section}:".ljust(27) + f"# {note}" if note else f"{section}:")
        for knob in (k for k in KNOBS if k.key.split(".")[0] == section):
            goes = "" if knob.target == "launcher" else f" -> {knob.target.removeprefix('yaml:')}"
            names = knob.env + (f" (or {knob.alias})" if knob.alias else "")
            text = f"# {names}{goes}: {knob.doc.rstrip('.')}. Default: {_default_text(knob.key)}"
            head = f"  {knob.key.split('.', 1)[1]}: auto"
            indent = max(27, len(head) + 1)
            wrapped = textwrap.wrap(text, width - indent, subsequent_indent="#   ", break_on_hyphens=False)
            lines.append(head.ljust(indent) + wrapped[0])
            lines += [" " * indent + more for more in wrapped[1:]]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def resolve(config_path: str | Path | None = None, *, sets: Mapping[str, str] | None = None,
            env: Mapping[str, str] | None = None, gpus: list[Gpu] | None = None,
            cwd: str | Path | None = None) -> ResolvedConfig:
    """Resolve every knob (see the module docstring). `gpus=None` runs nvidia-smi."""
    env = os.environ if env is None else env
    sets = dict(sets or {})
    cwd = Path(cwd or os.getcwd())
    file_path = Path(config_path) if config_path else DEFAULT_CONFIG
    file_values = load_file(file_path)
    def env_var(knob: Knob) -> str:
        """The variable that sets the knob: its own, or its alias when only the alias is set."""
        if not knob.alias or knob.alias not in env:
            return knob.env
        if knob.env in env and env[knob.env] != env[knob.alias]:
            raise ConfigError(f"env {knob.env}={env[knob.env]!r} and {knob.alias}={env[knob.alias]!r} set the same "
                              f"knob ({knob.key}) differently: unset one")
        return knob.env if knob.env in env else knob.alias

    layers: list[tuple[str, Callable[[Knob], Any], Path]] = [
        ("cli --set", lambda k: sets.get(k.key), cwd),
        ("env", lambda k: env.get(env_var(k)), cwd),
        ("file", lambda k: file_values[k.key][0] if k.key in file_values else None, file_path.parent),
    ]

    def explicit(knob: Knob) -> tuple[Any, str] | None:
        for name, read, base in layers:
            raw = read(knob)
            if name == "file" and knob.key in file_values:
                where = f"{file_path}:{file_values[knob.key][1]}"
            elif raw is None:
                continue
            else:
                where = f"env {env_var(knob)}" if name == "env" else f"cli --set {knob.key}"
            if _is_auto(raw):
                continue
            value = coerce(knob, raw, where)
            if knob.kind == "path" and value is not None:
                value = str((base / Path(value).expanduser()).resolve())
            return value, where
        return None

    profile_knob = KNOB_BY_KEY["hardware.profile"]
    chosen = explicit(profile_knob)
    if gpus is None and (chosen is None or chosen[0] != "cpu"):
        gpus = detect_gpus()
    gpus = gpus or []
    profile = chosen[0] if chosen else profile_for(gpus)
    defaults = {**PROFILES["base"], **PROFILES[profile]}
    values: dict[str, Any] = {"hardware.profile": profile}
    sources = {"hardware.profile": chosen[1] if chosen else f"detected ({len(gpus)} GPU)"}
    resolving: list[str] = []

    def get(key: str) -> Any:
        if key in values:
            return values[key]
        if key in resolving:
            raise ConfigError(f"derived defaults form a cycle: {' -> '.join(resolving + [key])}")
        resolving.append(key)
        knob = KNOB_BY_KEY[key]
        found = explicit(knob)
        if found is None:
            default = defaults[key]
            if isinstance(default, Derived):
                value = default.fn(get, gpus)
                source = f"profile {profile}: {default.text}"
            else:
                value = default
                source = f"profile {profile}"
            value = coerce(knob, value, source)
            if knob.kind == "path" and value is not None:
                value = str((REPO / value).resolve())
            found = (value, source)
        resolving.pop()
        values[key], sources[key] = found
        return found[0]

    for knob in KNOBS:
        get(knob.key)
    ordered = [k.key for k in KNOBS]
    cfg = ResolvedConfig(profile, gpus, {k: values[k] for k in ordered}, {k: sources[k] for k in ordered})
    cfg.warnings = check(cfg)
    return cfg


def check(cfg: ResolvedConfig) -> list[str]:
    """Budget warnings (values above the profile's) and consistency errors (raised)."""
    v = cfg.values
    warnings = []
    for key, limit in BUDGETS.get(cfg.profile, {}).items():
        if v[key] is not None and v[key] > limit:
            warnings.append(f"{key} = {v[key]} exceeds the {cfg.profile} budget ({limit}) [{cfg.sources[key]}]: "
                            "expect out-of-memory errors or very slow steps")
    samples = v["training.rollout_batch_size"] * v["training.n_samples_per_prompt"]
    if samples % v["training.global_batch_size"]:
        raise ConfigError(f"training.global_batch_size = {v['training.global_batch_size']} must divide "
                          f"rollout_batch_size x n_samples_per_prompt = {samples} (steps per rollout = ratio)")
    if v["training.over_sampling_batch_size"] < v["training.rollout_batch_size"]:
        raise ConfigError("training.over_sampling_batch_size must be >= training.rollout_batch_size")
    if v["environment.transport"] == "mcp" and not v["environment.mcp_urls"] and v["environment.mcp_servers"] < 1:
        raise ConfigError("environment.transport = mcp needs environment.mcp_urls or environment.mcp_servers >= 1")
    if v["training.async"] and v["hardware.colocate"]:
        raise ConfigError("training.async (ASYNC) generates while it trains, so the engines cannot share the "
                          "trainer's devices: set hardware.colocate false (COLOCATE=false)")
    warnings += check_context(cfg)
    if cfg.profile != "cpu" and v["hardware.ray_address"] is None:  # one machine; a cluster places by itself
        used = v["hardware.train_num_gpus"] + (0 if v["hardware.colocate"] else v["hardware.rollout_num_gpus"])
        if used > v["hardware.num_gpus"]:
            warnings.append(f"{used} GPUs requested (train + rollout) but hardware.num_gpus = {v['hardware.num_gpus']}")
        if cfg.profile == "a100-40gb" and v["hardware.train_num_gpus"] < 2 and not v["training.lora_rank"]:
            warnings.append("Qwen3-4B's training state peaks at about 63 GiB on one GPU (fsdp, bf16, full recompute; "
                            "measured on an H200): a 40 GB card needs hardware.train_num_gpus >= 2 to shard it, "
                            "or LoRA adapters (training.lora_rank > 0, LORA_RANK=32)")
    return warnings


def context_managed(cfg: ResolvedConfig | Mapping[str, Any]) -> bool:
    """Whether the run uses the context-managed rollout (awm_grpo.context.loop): context.tools or
    context.limit set."""
    v = cfg.values if isinstance(cfg, ResolvedConfig) else cfg
    return bool(v["context.tools"]) or v["context.limit"] is not None


def check_context(cfg: ResolvedConfig) -> list[str]:
    """The context.* knobs: limit > reserve > 0, max_samples >= 1, and none of the per-turn features the
    context-managed rollout refuses (awm_grpo.context.loop.ContextConfig) beside it. Raises ConfigError."""
    v = cfg.values
    if v["context.reserve"] < 1:
        raise ConfigError(f"context.reserve = {v['context.reserve']} must be >= 1: it is the room kept for "
                          f"the next model turn [{cfg.sources['context.reserve']}]")
    if v["context.max_samples"] < 1:
        raise ConfigError(f"context.max_samples = {v['context.max_samples']} must be >= 1 (the episode's "
                          f"last sample is always kept) [{cfg.sources['context.max_samples']}]")
    if not context_managed(cfg):
        return []
    limit_key = "context.limit" if v["context.limit"] is not None else "inference.max_context_len"
    limit = v[limit_key]
    if limit is None:
        raise ConfigError("context.tools needs a context limit: set context.limit (AWM_CONTEXT_LIMIT), e.g. "
                          "32768 as StateLM, or inference.max_context_len (ROLLOUT_MAX_CONTEXT_LEN)")
    if limit <= v["context.reserve"]:
        raise ConfigError(f"{limit_key} = {limit} must be larger than context.reserve = "
                          f"{v['context.reserve']}: the reserve is the room kept inside the limit for the "
                          "next model turn")
    clashes = [f"{key} ({KNOB_BY_KEY[key].env})" for key in ("environment.history_window_turns",
               "recovery.predicates", "recovery.credit_method", "recovery.judge_url") if v[key] is not None]
    if clashes:
        raise ConfigError("context.tools / context.limit run the context-managed rollout, which cannot run "
                          f"with {', '.join(clashes)}: their per-turn bookkeeping assumes one token stream "
                          "an episode; unset them, or leave context.tools false and context.limit null")
    warnings = []
    if v["inference.max_context_len"] is not None and limit > v["inference.max_context_len"]:
        warnings.append(f"context.limit = {limit} exceeds inference.max_context_len = "
                        f"{v['inference.max_context_len']}: the engine's cap ends episodes before the "
                        "context budget does")
    return warnings


KNOB_BY_KEY = {k.key: k for k in KNOBS}
KNOB_BY_ENV = {**{k.alias: k for k in KNOBS if k.alias}, **{k.env: k for k in KNOBS}}
