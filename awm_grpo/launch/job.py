"""Start a training run of the recipe: resolve the config, check what it needs, run slime.train.

    bash awm_grpo/run_awm_grpo.sh [--config FILE] [--set KEY=VALUE ...] [--profile P] [--dry-run] [-- slime flags]

Steps: resolve every knob (`awm_grpo.launch.config`; printed with its source), check prerequisites with
errors that say what to run (model folder, data folder, splits: written with `awm_grpo.data_prep`
when missing; or data.prompt_file / data.eval_prompt_file, JSONL or parquet, read with the flags of the
layout their first row shows), write the runtime YAML (`<save_dir>/awm_runtime.yaml`, the `awm_*` keys
the rollout reads, passed as `--custom-config-path`), check the command against slime's own parser, then run
`python -m slime.train` (`slime.train_async` under training.async) as a child in its own process
group. With `environment.transport: mcp` and no URLs it first starts `awm env start` servers. On
exit, Ctrl-C or SIGTERM it stops exactly the processes it started (`awm_grpo.launch.processes`).
Flags after `--` go to slime.train verbatim, last, so they win over the knobs (argparse keeps the
last value). With hardware.ray_address set, slime joins that Ray cluster (docs/recipe.md, Multi-node).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from awm_grpo.launch import disk
from awm_grpo.launch.config import (
    ConfigError,
    ResolvedConfig,
    config_template,
    context_managed,
    knob_table,
    parse_sets,
    resolve,
)
from awm_grpo.launch.knobs import KNOBS, REPO
from awm_grpo.launch.processes import Children, Stopped, ignore_signals, raise_on_signals, restore_signals

logger = logging.getLogger("awm_grpo.launch")

PLUGINS = [  # the recipe's seams in slime (fixed; edit awm_grpo/reward.py to change the reward)
    "--custom-generate-function-path", "awm_grpo.rollout.generate",
    "--custom-rm-path", "awm_grpo.reward.reward",
    "--custom-rollout-log-function-path", "awm_grpo.traces.log_rollout",
    "--custom-eval-rollout-log-function-path", "awm_grpo.traces.log_eval",
]
CONTEXT_GENERATE = "awm_grpo.context.loop.generate"  # context.tools / context.limit: the managed rollout
MCP_READY = re.compile(r"AWM MCP server for \S+ at (http://\S+)/mcp")
# A prompt file's layout (by the keys of its first row) -> the slime flags that read it.
LAYOUTS: dict[str, tuple[frozenset[str], list[str]]] = {
    "recipe": (frozenset({"text", "metadata"}),  # awm_grpo.data_prep's rows: chat messages + the task
               ["--input-key", "text", "--metadata-key", "metadata", "--apply-chat-template"]),
    "statelm": (frozenset({"prompt", "reward_model", "document_content"}),  # awm_grpo.context.docqa's rows
                ["--input-key", "prompt", "--label-key", "reward_model", "--metadata-key", "extra_info",
                 "--extra-metadata-keys", "document_content"]),
}


class LaunchError(RuntimeError):
    """A prerequisite is missing; the message says what to run."""


def runtime_config(cfg: ResolvedConfig, mcp_urls: list[str] | None = None) -> dict[str, Any]:
    """The runtime YAML: every `yaml:awm_*` knob under its key (mcp_urls: the started servers, if any)."""
    out = {k.target.removeprefix("yaml:"): cfg[k.key] for k in KNOBS if k.target.startswith("yaml:")}
    if mcp_urls is not None:
        out["awm_mcp_urls"] = list(mcp_urls)
    return out


def knob_flags(cfg: ResolvedConfig) -> list[str]:
    """slime.train flags of every `--flag` knob (see `awm_grpo.launch.knobs` for each target)."""
    v, cpu = cfg.values, cfg["inference.engine_type"] == "cpu"
    sglang_only = {"inference.sglang_mem_fraction_static", "inference.sglang_dtype"}
    skip = sglang_only if cpu else {"inference.engine_max_batch_size"}
    if not v["logging.wandb_enabled"]:
        skip |= {"logging.wandb_project", "logging.wandb_group", "logging.wandb_mode"}
    flags: list[str] = []
    for knob in KNOBS:
        value = v[knob.key]
        if not knob.target.startswith("--") or knob.key in skip or value is None or value == "":
            continue
        if knob.key == "training.global_batch_size":
            value = v["training.rollout_batch_size"] * v["training.n_samples_per_prompt"] // value
        if knob.kind == "bool":
            flags += [knob.target] if value else []
            continue
        flags += [knob.target, str(value)]
        if knob.key == "grpo.kl_loss_coef" and value > 0:
            flags.append("--use-kl-loss")
        if knob.key == "training.seed":
            flags += ["--rollout-seed", str(value)] + (["--engine-seed", str(value)] if cpu else [])
    return flags


def prompt_file_layout(path: str, knob: str = "data.prompt_file") -> str:
    """The layout of a prompt file (a key of LAYOUTS) from the keys of its first row; LaunchError otherwise.

    `path` may carry slime's `@[start:end]` row slice; the first row of the file decides either way.
    """
    return _layout_and_keys(path, knob)[0]


def _layout_and_keys(path: str, knob: str) -> tuple[str, set[str]]:
    """(layout, the keys with a value) of a prompt file's first row; see prompt_file_layout."""
    from slime.rollout.data_source import _split_row_slice

    real = _split_row_slice(path)[0]
    if not Path(real).is_file():
        raise LaunchError(f"{knob} {real} does not exist: point it at a JSONL or .parquet prompt file")
    try:
        row = _first_row(real)
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{knob} {real}: cannot read its first row ({exc}): give a JSONL file (one JSON "
                          "object a line) or a .parquet file") from None
    keys = {k for k, v in row.items() if v is not None} if isinstance(row, dict) else set()
    for name, (needs, _) in LAYOUTS.items():
        if needs <= keys:
            return name, keys
    raise LaunchError(f"{knob} {real}: its first row has keys {sorted(keys)}, which is no layout the "
                      "launcher knows: the recipe's {text, metadata} (python -m awm_grpo.data_prep's rows) "
                      "or StateLM's {prompt, reward_model, document_content, extra_info} (python -m "
                      "awm_grpo.context.docqa); write the file in one of them, or run python -m slime.train "
                      "with your own --input-key flags")


def _first_row(path: str) -> Any:
    """The first row of a JSONL (first non-blank line) or parquet prompt file; None when it has none."""
    if path.endswith(".parquet"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError("reading parquet needs pyarrow (bash setup.sh installs it)") from None
        try:
            batch = next(pq.ParquetFile(path).iter_batches(batch_size=1), None)
        except (pa.ArrowException, OSError, ValueError) as exc:  # pyarrow's ArrowInvalid, ...
            raise ValueError(f"not a parquet file: {exc}") from None
        return batch.to_pylist(maps_as_pydicts="strict")[0] if batch is not None and batch.num_rows else None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return json.loads(line)
    return None


def prompt_flags(cfg: ResolvedConfig) -> list[str]:
    """--prompt-data, --eval-prompt-data and the row-reading flags: the splits' (data_prep) files, or
    data.prompt_file / data.eval_prompt_file read in the layout their first row shows."""
    splits = Path(cfg["paths.splits_dir"])
    train, evals = cfg["data.prompt_file"], cfg["data.eval_prompt_file"]
    layout, keys = _layout_and_keys(train, "data.prompt_file") if train else ("recipe", set())
    if evals:
        eval_layout, eval_keys = _layout_and_keys(evals, "data.eval_prompt_file")
        keys &= eval_keys
        if eval_layout != layout:
            raise LaunchError(f"data.eval_prompt_file {evals} is in the {eval_layout} layout but the "
                              f"training prompts ({train or splits / 'train.jsonl'}) are in the {layout} "
                              "layout: slime reads both with the same flags, so give eval prompts of the "
                              "training prompts' layout")
    flags = ["--prompt-data", train or str(splits / "train.jsonl")]
    if evals or not train:
        flags += ["--eval-prompt-data", "val", evals or str(splits / "val.jsonl")]
    flags += LAYOUTS[layout][1]
    if layout == "statelm" and "data_source" in keys:  # the document task's name (awm_grpo.context.document)
        flags.append("data_source")  # one more --extra-metadata-keys value: that flag is the layout's last
    return flags


def uses_splits(cfg: ResolvedConfig) -> bool:
    """Whether the run reads data_prep's splits (no data.prompt_file)."""
    return not cfg["data.prompt_file"]


def slime_command(cfg: ResolvedConfig, runtime_yaml: str | Path, extra: list[str] | None = None) -> list[str]:
    """The full `python -m slime.train ...` command line. LaunchError when a prompt file cannot be read."""
    plugins = list(PLUGINS)
    if context_managed(cfg):  # StateLM's managed episodes: its own generate function
        plugins[plugins.index("awm_grpo.rollout.generate")] = CONTEXT_GENERATE
    fixed = [*prompt_flags(cfg), "--rollout-shuffle", *plugins, "--custom-config-path", str(runtime_yaml)]
    if cfg["recovery.credit_method"] is not None:  # the recovery method's per-turn credit (awm_grpo.recovery)
        fixed += ["--custom-advantage-function-path", "awm_grpo.recovery.advantages"]
    # B1's window and the context-managed rollout split an episode into samples: per-token loss weighs
    # their tokens as one sequence would (token-mean over the step, not a mean of sample means)
    if cfg["environment.history_window_turns"] is not None or context_managed(cfg):
        fixed += ["--calculate-per-token-loss"]
    flags = knob_flags(cfg)
    if not cfg["data.eval_prompt_file"] and not uses_splits(cfg):  # no eval prompts: no evals
        flags = _without(flags, "--eval-interval", "--skip-eval-before-train", "--n-samples-per-eval-prompt")
    return [sys.executable, "-m", trainer_module(cfg), *flags, *fixed, *(extra or [])]


def _without(flags: list[str], *names: str) -> list[str]:
    """`flags` less the named flags and their values (a flag's value is the next item unless it is a flag)."""
    out, skip = [], False
    for i, flag in enumerate(flags):
        if skip:
            skip = False
            continue
        if flag in names:
            skip = i + 1 < len(flags) and not flags[i + 1].startswith("--")
            continue
        out.append(flag)
    return out


def trainer_module(cfg: ResolvedConfig) -> str:
    """slime.train_async (one step off-policy) under training.async, else slime.train; both take the same flags."""
    return "slime.train_async" if cfg["training.async"] else "slime.train"


def check_against_slime(cmd: list[str]) -> list[str]:
    """Problems slime.train's parser finds in `cmd` (unknown flags, bad choices, inconsistencies)."""
    from slime.arguments import ArgumentError, build_parser, finalize_args

    parser = build_parser()
    argv = cmd[3:]
    known = parser._option_string_actions  # noqa: SLF001 - the parser's own flag table
    unknown = [a for a in argv if a.startswith("--") and a not in known]
    if unknown:
        by_flag = {k.target: k for k in KNOBS}
        hints = [f"{by_flag[f].env}=null leaves {f} out" for f in unknown if f in by_flag and by_flag[f].nullable]
        return [f"slime.train does not accept {', '.join(unknown)} (yet){': ' if hints else ''}{'; '.join(hints)}"]
    try:
        args = parser.parse_args(argv)  # argparse prints its own message before exiting
    except SystemExit:
        return ["slime.train rejected the flags (its message is above)"]
    errors: list[str] = []
    try:
        finalize_args(args)
    except ArgumentError as exc:
        errors.append(f"slime.train: {exc}")
    return errors


def engine_commands(cmd: list[str]) -> list[str]:
    """One `engine N: ...` line per rollout engine the command starts: SGLang's own command line (ports
    and host are picked when each engine starts; a restart reuses these flags with the newest export
    as --model-path), or what serves instead of SGLang."""
    from slime.arguments import build_parser, finalize_args
    from slime.engine.sglang_engine import launch_command

    args = build_parser().parse_args(cmd[3:])
    finalize_args(args)
    engines = args.rollout_num_gpus // args.rollout_num_gpus_per_engine
    if args.engine_type != "sglang":
        return [f"engine {rank}: slime's CPU engine (slime.engine.cpu_server) serving {args.hf_checkpoint} in a "
                f"Ray actor, up to {args.engine_max_batch_size} sequences a batch" for rank in range(engines)]
    return [f"engine {rank}: " + shlex.join(launch_command(args, port=30000 + rank, base_gpu_id=0,
                                                           nccl_port=31000 + rank, seed_offset=rank))
            for rank in range(engines)]


def extra_overrides(extra: list[str], cmd: list[str]) -> list[str]:
    """Knob-set flags that flags after `--` override (slime keeps the last value)."""
    ours = {a for a in cmd if a.startswith("--")}
    return sorted({a.split("=")[0] for a in extra if a.startswith("--") and a.split("=")[0] in ours})


# ---- prerequisites -------------------------------------------------------------------------------
def check_model(path: str, what: str, env: str) -> None:
    if not (Path(path) / "config.json").is_file():
        raise LaunchError(f"{what} {path} is not a Hugging Face model folder (no config.json): run `bash setup.sh` "
                          f"(it prepares the model of this profile), or point {env} at a model folder")


def ensure_splits(cfg: ResolvedConfig, dry_run: bool) -> str:
    """Write the splits with data_prep if they are missing; refuse splits of another data folder."""
    from awm.data import bundled_data_dir

    splits = Path(cfg["paths.splits_dir"])
    data_dir = cfg["environment.data_dir"]
    want = str((Path(data_dir) if data_dir else bundled_data_dir()).resolve())
    info_path = splits / "split_info.json"
    if all((splits / f).is_file() for f in ("train.jsonl", "val.jsonl")) and info_path.is_file():
        info = json.loads(info_path.read_text())
        check_agentgym_splits(cfg, splits, info)
        if info.get("agentgym_only"):  # written by awm_grpo.agentgym.client: no AWM data folder to match
            return f"splits: {splits} (AgentGym prompts only, existing)"
        exclude = cfg["data.exclude_file"]
        asked = {"data_dir": want, "split_by": cfg["data.split_by"], "seed": cfg["data.split_seed"],
                 "max_scenarios": cfg["data.max_scenarios"], "exclude_file": exclude and str(Path(exclude).resolve()),
                 "task_mix": cfg["data.task_mix"]}
        info.setdefault("task_mix", "natural")  # splits written before the knob existed
        differ = [f"{k}: {info.get(k)!r} there, {v!r} asked" for k, v in asked.items() if info.get(k) != v]
        if differ:
            raise LaunchError(f"{splits} holds other splits ({'; '.join(differ)}): delete {splits} to rewrite them, "
                              "or set paths.splits_dir (AWM_SPLITS_DIR) to another folder")
        return f"splits: {splits} (existing)"
    if data_dir and not Path(data_dir).is_dir():
        raise LaunchError(f"AWM data folder {data_dir} does not exist: run `bash setup.sh` (downloads AWM-1K) or "
                          "`awm data download --dest DIR` and set AWM_DATA_DIR")
    if dry_run:
        return f"splits: {splits} missing; a real run writes them with awm_grpo.data_prep"
    from awm_grpo.data_prep import prepare

    info = prepare(splits, data_dir=data_dir, seed=cfg["data.split_seed"], split_by=cfg["data.split_by"],
                   max_scenarios=cfg["data.max_scenarios"], exclude_file=cfg["data.exclude_file"],
                   task_mix=cfg["data.task_mix"])
    counts = {n: c["tasks"] for n, c in info["counts"].items()}
    return f"splits: wrote {splits} ({counts})"


def check_agentgym_splits(cfg: ResolvedConfig, splits: Path, info: dict) -> None:
    """Every AgentGym environment the splits' rows play on must be configured (environment.agentgym_envs)."""
    from awm_grpo.agentgym.client import agentgym_envs_of, parse_agentgym_envs

    try:
        known = {spec.name for spec in parse_agentgym_envs(cfg["environment.agentgym_envs"])}
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    missing = sorted(agentgym_envs_of(info) - known)
    if missing:
        raise LaunchError(f"{splits} has prompts played on AgentGym environments {missing}, which "
                          "environment.agentgym_envs (AWM_AGENTGYM_ENVS) does not configure: set it to e.g. "
                          f'{{"{missing[0]}": {{"urls": ["http://127.0.0.1:36001"]}}}} with its servers\' URLs')


def start_mcp_servers(cfg: ResolvedConfig, children: Children, env: dict[str, str],
                      timeout_s: float = 180.0) -> list[str]:
    """Start `environment.mcp_servers` local `awm env start` servers; returns their base URLs."""
    scenario = first_train_scenario(Path(cfg["paths.splits_dir"]), cfg["data.prompt_file"])
    cmd = [sys.executable, "-m", "awm.cli", "env", "start", "--scenario", scenario, "--port", "0",
           "--workers", str(cfg["environment.env_workers"])]
    if cfg["environment.data_dir"]:
        cmd += ["--data-dir", cfg["environment.data_dir"]]
    urls = []
    for i in range(cfg["environment.mcp_servers"]):
        proc = children.start(f"mcp-server-{i}", cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        urls.append(_wait_for_url(proc, f"mcp-server-{i}", timeout_s))
        logger.info("MCP server %d at %s", i, urls[-1])
    return urls


def first_train_scenario(splits: Path, prompt_file: str | None = None) -> str:
    """The AWM scenario of the first training prompt (the splits' train.jsonl, or data.prompt_file)."""
    if not prompt_file:
        with open(splits / "train.jsonl") as f:
            return json.loads(f.readline())["metadata"]["scenario"]
    from slime.rollout.data_source import _split_row_slice

    real = _split_row_slice(prompt_file)[0]
    row = _first_row(real)
    metadata = row.get("metadata") if isinstance(row, dict) else None
    if isinstance(metadata, str):
        metadata = json.loads(metadata)
    if not (isinstance(metadata, dict) and metadata.get("scenario")):
        raise LaunchError("environment.transport mcp starts servers for the first training prompt's AWM "
                          f"scenario, but the first row of data.prompt_file {real} names none "
                          "(metadata.scenario): use transport inprocess, or give environment.mcp_urls")
    return str(metadata["scenario"])


def _wait_for_url(proc: subprocess.Popen, name: str, timeout_s: float) -> str:
    """Read the server's announcement line; keep forwarding its output to the log afterwards."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
            logger.debug("[%s] %s", name, line.rstrip())
        lines.put(None)

    threading.Thread(target=pump, daemon=True, name=f"{name}-stdout").start()
    deadline, seen = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line.rstrip())
        if match := MCP_READY.search(line):
            return match.group(1)
    tail = "\n  ".join(seen[-10:])
    raise LaunchError(f"{name} did not announce its URL within {timeout_s:.0f}s (exit code {proc.poll()}):\n  {tail}")


def child_env(cfg: ResolvedConfig) -> dict[str, str]:
    """The children's environment: ours, plus defaults that never override a variable already set."""
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.profile == "cpu":  # local model, local single-machine Ray (as examples/toy_single_turn does)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray's own ray.init() reads RAY_ADDRESS too: the trainer must see exactly the knob's value (which
    # --ray-address also carries), not a leftover `auto` that would make a local run join another cluster.
    env.pop("RAY_ADDRESS", None)
    if cfg["hardware.ray_address"]:
        env["RAY_ADDRESS"] = cfg["hardware.ray_address"]
    return env


# ---- main ----------------------------------------------------------------------------------------
def parse_cli(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="bash awm_grpo/run_awm_grpo.sh", description=__doc__.split("\n\n")[0],
                                epilog="Precedence: --set/--profile > environment variables > --config file > "
                                       "auto-profile. Flags after `--` go to slime.train.")
    p.add_argument("--config", default=None, help="config file (default: awm_grpo/config.yaml)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a knob (dotted key or variable name, e.g. training.num_rollout=3 or LR=1e-5)")
    p.add_argument("--profile", choices=["cpu", "a100-40gb", "h100", "h200"], help="force an auto-profile")
    p.add_argument("--dry-run", action="store_true", help="resolve, check and print the command; start nothing")
    p.add_argument("--knobs", action="store_true",
                   help="print every knob with its variable, target and per-profile default (Markdown: docs/knobs.md), "
                   "then exit")
    p.add_argument("--config-template", action="store_true",
                   help="print awm_grpo/config.yaml as generated from the knobs (every value auto, defaults in comments), "
                   "then exit")
    p.add_argument("--prepare-only", action="store_true",
                   help="write the splits this config needs (setup.sh uses it), then exit")
    p.add_argument("--grace", type=float, default=30.0, help="seconds children get to exit after SIGTERM")
    return p.parse_args(argv), extra


def main(argv: list[str] | None = None) -> int:
    opts, extra = parse_cli(list(sys.argv[1:] if argv is None else argv))
    if opts.knobs or opts.config_template:
        print(knob_table() if opts.knobs else config_template(), end="")
        return 0
    logging.basicConfig(level=logging.INFO, format="[awm_grpo] %(message)s")
    try:
        sets = parse_sets(opts.sets)
        if opts.profile:
            sets["hardware.profile"] = opts.profile
        cfg = resolve(opts.config, sets=sets)
    except ConfigError as exc:
        print(f"awm_grpo: config error: {exc}", file=sys.stderr)
        return 2
    print(cfg.table(), flush=True)
    if opts.prepare_only:
        try:
            logger.info(ensure_splits(cfg, dry_run=False))
        except LaunchError as exc:
            print(f"awm_grpo: {exc}", file=sys.stderr)
            return 2
        print(cfg["paths.splits_dir"])  # the last line: setup.sh reads it
        return 0
    save = Path(cfg["paths.save_dir"])
    runtime_yaml = save / "awm_runtime.yaml"
    try:
        cmd = slime_command(cfg, runtime_yaml, extra)
        for flag in extra_overrides(extra, cmd[: len(cmd) - len(extra)]):
            logger.warning("%s after `--` overrides the value the config gives it", flag)
        check_model(cfg["paths.hf_checkpoint"], "paths.hf_checkpoint", "HF_CKPT")
        if cfg["grpo.kl_loss_coef"] > 0:
            check_model(cfg["paths.ref_checkpoint"], "paths.ref_checkpoint", "REF_CKPT")
        space = disk.plan(cfg)  # one save, the run's peak, free space; before any work (docs/gpu.md)
        print(disk.report(space), flush=True)
        refusal, warning = disk.check(space)
        if refusal and not opts.dry_run:
            raise LaunchError(refusal)
        if refusal:  # a dry run plans a run, often on another machine: it shows everything and says this
            logger.warning("a real run here would stop: %s", refusal)
        elif warning:
            logger.warning(warning)
        if uses_splits(cfg):
            logger.info(ensure_splits(cfg, opts.dry_run))
        else:
            evals = cfg["data.eval_prompt_file"] or "none (no data.eval_prompt_file)"
            logger.info("prompts: %s (data.prompt_file; the splits are not used), eval: %s",
                        cfg["data.prompt_file"], evals)
        problems = check_against_slime(cmd)
        if problems:
            raise LaunchError("; ".join(problems))
    except LaunchError as exc:
        print(f"awm_grpo: {exc}", file=sys.stderr)
        return 2
    if opts.dry_run:
        print("runtime YAML (--custom-config-path):\n" + yaml.safe_dump(runtime_config(cfg), sort_keys=False))
        print("command:\n  " + " ".join(cmd))
        print("engines (ports and host are picked when each engine starts; shown as 3000N, 3100N, 127.0.0.1):")
        print("\n".join(engine_commands(cmd)))
        return 0
    return run(cfg, cmd, runtime_yaml, opts.grace)


def run(cfg: ResolvedConfig, cmd: list[str], runtime_yaml: Path, grace_s: float) -> int:
    """Start the children, wait for the trainer, stop everything we started on every way out."""
    save = runtime_yaml.parent
    save.mkdir(parents=True, exist_ok=True)
    (save / "awm_grpo_config.json").write_text(json.dumps(
        {"profile": cfg.profile, "values": cfg.values, "sources": cfg.sources, "command": cmd}, indent=1) + "\n")
    env = child_env(cfg)
    children = Children(record=save / "launcher_children.json")
    previous = raise_on_signals()
    try:
        urls = None
        if cfg["environment.transport"] == "mcp" and not cfg["environment.mcp_urls"]:
            urls = start_mcp_servers(cfg, children, env)
        runtime_yaml.write_text(yaml.safe_dump(runtime_config(cfg, urls), sort_keys=False))
        logger.info("command: %s", " ".join(cmd))
        name = trainer_module(cfg)
        trainer = children.start(name, cmd, env=env, cwd=REPO)
        code = trainer.wait()
        logger.info("%s exited with code %d", name, code)
        return code
    except Stopped as stop:
        logger.warning("got %s: stopping the processes this launcher started", stop)
        return 128 + stop.signum
    except LaunchError as exc:
        print(f"awm_grpo: {exc}", file=sys.stderr)
        return 2
    finally:
        ignore_signals()  # a second Ctrl-C must not interrupt the cleanup
        children.stop_all(grace_s)
        restore_signals(previous)


if __name__ == "__main__":
    sys.exit(main())
