"""Run upstream slime's own example plugins and plugin contract tests, unmodified, against this repo's slime.

Upstream (THUDM/slime) publishes example plugins (examples/) and contract tests for plugin authors
(tests/plugin_contracts). Our `slime` replaces upstream's, so those files must work here as they are. This
script reads them in place from a checkout of upstream and reports, as one table:

  imports    search-r1, retool, multi_agent, tau-bench (its `tau_bench` agent package stubbed) and the TIS
             helper import with no missing module or name, every `slime.*` import in the example files they
             load (function-local ones too) resolves, and every `args.X` they read exists in our parsed flags;
             the Sample that tau-bench's own `res_to_sample` builds goes through our `generate_and_rm`.
  flags      every flag of their launch scripts is known to our parser, and the scripts' CPU form parses.
  contracts  upstream's tests/plugin_contracts, run by pytest against our slime. Tests that read
             upstream's own source files (slime/observability/..., slime/ray/...) show as LAYOUT.
  runs       search-r1, retool and multi_agent run `--steps` steps each through `python -m slime.train` on
             the CPU engine with the tiny model and the launch-script flags that apply on CPU; search-r1
             gets a local retrieval server (ours) on 127.0.0.1:8000, where its config points, and runs
             once more with the TIS flags its script lists (upstream's mis.py as --custom-tis-function-path).

Upstream's files never enter this repository: they are copied (examples/ and tests/plugin_contracts only,
so upstream's own `slime/` package cannot shadow ours) into a scratch folder and run from there.

    .venv/bin/python tests/upstream/run_upstream_examples.py --upstream /path/to/THUDM-slime
    .venv/bin/python tests/upstream/run_upstream_examples.py --upstream DIR --only imports,contracts

The examples' own requirements (retool: psutil, jinja2) must be importable; put them on PYTHONPATH if the
venv lacks them. Exit status 0 when every row passes (LAYOUT rows do not count as failures).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PASS, FAIL, LAYOUT, SKIP = "PASS", "FAIL", "LAYOUT", "SKIP"


@dataclass
class Row:
    """One line of the report."""

    section: str
    name: str
    status: str
    detail: str = ""


# ---- what is checked ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportTarget:
    """An upstream plugin module, imported the way its launch script makes it importable."""

    name: str
    folder: str  # under examples/
    module: str  # as the launch script names it (folder on PYTHONPATH, or dotted from the checkout root)
    symbols: tuple[str, ...]
    launch_script: str | None
    extra_modules: tuple[str, ...] = ()  # imported lazily by the plugin at run time
    stub_tau_bench: bool = False
    probe: bool = False  # also feed the plugin's own result builder through our generate_and_rm
    custom_config: str | None = None  # YAML the launch script passes with --custom-config-path


IMPORT_TARGETS = (
    ImportTarget("search-r1", "search-r1", "generate_with_search", ("generate", "reward_func"),
                 "run_qwen2.5_3B.sh", extra_modules=("local_search_server",)),
    ImportTarget("retool", "retool", "generate_with_retool", ("generate", "reward_func"),
                 "retool_qwen3_4b_rl.sh"),
    ImportTarget("multi_agent", "multi_agent", "examples.multi_agent.rollout_with_multi_agents",
                 ("generate_with_multi_agents",), "run-qwen3-30B-A3B-multi-agent.sh",
                 extra_modules=("examples.multi_agent.agent_system",)),
    ImportTarget("tau-bench", "tau-bench", "generate_with_tau", ("generate", "res_to_sample"),
                 "run_qwen3_4B.sh", stub_tau_bench=True, probe=True),
    ImportTarget("TIS helper (mis.py)", "train_infer_mismatch_helper",
                 "examples.train_infer_mismatch_helper.mis",
                 ("compute_mis_weights", "compute_mis_weights_with_cp"), "run-qwen3-4b-mis.sh",
                 custom_config="examples/train_infer_mismatch_helper/mis.yaml"),
)

# Launch-script flags left out of a CPU run, and why. Everything else the scripts pass is kept, with paths
# and sizes replaced (`_cpu_value`).
GPU_ONLY_FLAGS = {
    "--actor-num-gpus-per-node": "GPU count of the cluster",
    "--rollout-num-gpus": "GPU count of the cluster",
    "--rollout-num-gpus-per-engine": "GPUs per SGLang engine",
    "--sglang-cuda-graph-bs": "SGLang CUDA graphs",
    "--sglang-mem-fraction-static": "SGLang GPU memory share",
    "--optimizer-cpu-offload": "Megatron GPU optimizer offload",
    "--overlap-cpu-optimizer-d2h-h2d": "Megatron GPU optimizer offload",
    "--use-precision-aware-optimizer": "Megatron GPU optimizer",
    "--rotary-base": "architecture of the 4B checkpoint, not of the tiny model",
    "--ref-load": "Megatron torch_dist checkpoint of the big model (the tiny model is the reference)",
    "--use-wandb": "W&B account", "--wandb-project": "W&B account", "--wandb-group": "W&B account",
    "--wandb-key": "W&B account",
}
PARALLEL_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                  "--expert-model-parallel-size", "--expert-tensor-parallel-size")
CPU_SIZES = {
    "--num-rollout": None,  # --steps
    "--rollout-batch-size": "2",
    "--n-samples-per-prompt": "2",
    "--global-batch-size": "4",
    "--rollout-max-response-len": "24",
    "--eval-max-response-len": "24",
    "--n-samples-per-eval-prompt": "1",
    "--save-interval": "1",
}


@dataclass(frozen=True)
class RunTarget:
    """A 2-step CPU training run of one example."""

    name: str
    folder: str
    launch_script: str
    on_pythonpath: bool  # the launch script puts the example folder on PYTHONPATH
    data: str  # which prompt set
    needs_search_server: bool = False
    extra: tuple[str, ...] = ()
    expect_metric: str | None = None  # a train-record key (regex) that shows the plugin ran


RUN_TARGETS = (
    RunTarget("search-r1", "search-r1", "run_qwen2.5_3B.sh", True, "qa", needs_search_server=True),
    RunTarget("retool", "retool", "retool_qwen3_4b_rl.sh", True, "math"),
    RunTarget("multi_agent", "multi_agent", "run-qwen3-30B-A3B-multi-agent.sh", False, "math"),
    # search-r1's script lists these three TIS flags, commented out ("recommended ... when using TIS").
    RunTarget("search-r1 + TIS (mis.py)", "search-r1", "run_qwen2.5_3B.sh", True, "qa",
              needs_search_server=True,
              extra=("--use-tis", "--custom-config-path", "examples/train_infer_mismatch_helper/mis.yaml",
                     "--custom-tis-function-path",
                     "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"),
              expect_metric=r"mis_"),
)


# ---- scratch copy of upstream's files ------------------------------------------------------------------


def check_upstream(upstream: Path) -> None:
    """Refuse a folder that is not a checkout of upstream slime, saying what is missing."""
    needed = ["examples/search-r1/generate_with_search.py", "tests/plugin_contracts/_shared.py"]
    missing = [p for p in needed if not (upstream / p).is_file()]
    if missing:
        raise SystemExit(f"--upstream {upstream}: not a checkout of THUDM/slime (missing "
                         f"{', '.join(missing)}); pass the folder that holds upstream's examples/ and tests/")


def prepare_scratch(upstream: Path, work: Path) -> Path:
    """Copy upstream's examples/ and tests/plugin_contracts (nothing else) into `work/upstream`.

    The contract tests put their checkout root first on sys.path; without upstream's `slime/` there, the
    `slime` they import is ours (from PYTHONPATH)."""
    root = work / "upstream"
    if root.exists():
        shutil.rmtree(root)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(upstream / "examples", root / "examples", ignore=ignore)
    contracts = Path("tests") / "plugin_contracts"
    shutil.copytree(upstream / contracts, root / contracts, ignore=ignore)
    assert not (root / "slime").exists()
    return root


def child_env(*paths: Path | str) -> dict[str, str]:
    """Environment of a child process: `paths` first on PYTHONPATH, then this repo (our slime)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    parts = [str(p) for p in paths] + [str(REPO)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


# ---- stubs for tau-bench's third-party packages -------------------------------------------------------

# tau-bench's generate imports the `tau_bench` agent package (sierra-research/tau-bench), and through
# sglang_tool_parser.py sglang's function-call parser. Neither is part of slime; these stand-ins only give
# the names those imports need, so that what is checked is the slime surface the plugin uses.
TAU_BENCH_STUB = {
    "tau_bench/__init__.py": '"""Import-only stand-in for tau-bench (run_upstream_examples.py)."""\n',
    "tau_bench/envs.py": (
        "def get_env(**kwargs):\n"
        "    raise RuntimeError('tau_bench is stubbed: environments are not available')\n"),
    "tau_bench/types.py": (
        "class RunConfig:\n"
        "    def __init__(self, **kwargs):\n"
        "        self.__dict__.update(kwargs)\n\n\n"
        "class Action:\n"
        "    def __init__(self, name, kwargs):\n"
        "        self.name, self.kwargs = name, kwargs\n"),
    "tau_bench/agents/__init__.py": "",
    "tau_bench/agents/base.py": "class Agent:\n    pass\n",
    "tau_bench/agents/tool_calling_agent.py": (
        "from tau_bench.agents.base import Agent\n\n"
        "RESPOND_ACTION_NAME = 'respond'\n\n\n"
        "class ToolCallingAgent(Agent):\n"
        "    def __init__(self, tools_info=None, wiki=None, model=None, provider=None, temperature=0.0):\n"
        "        self.tools_info, self.wiki, self.model = tools_info, wiki, model\n"
        "        self.provider, self.temperature = provider, temperature\n"),
}
SGLANG_STUB = {
    "sglang/__init__.py": '"""Import-only stand-in for sglang (run_upstream_examples.py)."""\n',
    "sglang/srt/__init__.py": "",
    "sglang/srt/function_call/__init__.py": "",
    "sglang/srt/function_call/function_call_parser.py": (
        "class FunctionCallParser:\n"
        "    def __init__(self, tools, tool_call_parser):\n"
        "        raise RuntimeError('sglang is stubbed')\n"),
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/io_struct.py": (
        "class Function:\n    def __init__(self, **kwargs):\n        self.__dict__.update(kwargs)\n\n\n"
        "class Tool:\n    def __init__(self, **kwargs):\n        self.__dict__.update(kwargs)\n"),
}


def write_files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# ---- static scan of an example folder ------------------------------------------------------------------

ARGS_NAMES = ("args", "rollout_args")


def _dict_keys_by_name(tree: ast.Module) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            names = [k.value for k in node.value.keys
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            for target in node.targets:
                if isinstance(target, ast.Name):
                    keys[target.id] = names
    return keys


def scan_files(paths: list[Path]) -> dict[str, Any]:
    """`slime` imports (module, name) anywhere in `paths` (function-local ones too), and the `args.X` they
    read and set."""
    imports: set[tuple[str, str | None]] = set()
    reads: dict[str, set[str]] = {}
    stores: set[str] = set()
    for path in sorted(set(paths)):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            continue
        configs = _dict_keys_by_name(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module == "slime" or node.module.startswith("slime.")):
                imports.update((node.module, alias.name) for alias in node.names)
            elif isinstance(node, ast.Import):
                imports.update((a.name, None) for a in node.names if a.name.split(".")[0] == "slime")
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in ARGS_NAMES):
                if isinstance(node.ctx, ast.Load):
                    reads.setdefault(node.attr, set()).add(path.name)
                else:
                    stores.add(node.attr)
            elif isinstance(node, ast.For) and isinstance(node.iter, ast.Call):
                # `for key, value in CONFIGS.items(): setattr(args, key, value)`
                func = node.iter.func
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and any(
                        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr"
                        for n in ast.walk(node)):
                    stores.update(configs.get(func.value.id, []))
    return {"imports": sorted(imports, key=str), "reads": {k: sorted(v) for k, v in reads.items()},
            "stores": sorted(stores)}


# ---- launch scripts ------------------------------------------------------------------------------------


def launch_flags(script: Path) -> list[tuple[str, list[str]]]:
    """The `--flag value...` pairs a launch script passes to train.py: its bash arrays and the train.py line.

    Flags from sourced files (`source scripts/models/...`: the model architecture) are not included."""
    lines = script.read_text().splitlines()
    chunks: list[str] = []
    in_array = in_cmd = False
    for raw in lines:
        line = raw.split(" #")[0] if not raw.lstrip().startswith("#") else ""
        stripped = line.strip()
        if not in_array and re.match(r"^[A-Z_]+=\($", stripped):
            in_array = True
            continue
        if in_array:
            if stripped == ")":
                in_array = False
            else:
                chunks.append(stripped)
            continue
        if "train.py" in stripped or "train_async.py" in stripped:
            in_cmd = True
            stripped = re.split(r"train(?:_async)?\.py", stripped, maxsplit=1)[1]
        if in_cmd:
            chunks.append(stripped.rstrip("\\").strip())
            if not stripped.endswith("\\"):
                in_cmd = False
    tokens: list[str] = []
    for chunk in chunks:
        try:
            tokens.extend(shlex.split(chunk))
        except ValueError:
            tokens.extend(chunk.split())
    flags: list[tuple[str, list[str]]] = []
    for tok in tokens:
        if tok.startswith("${") and tok.endswith("[@]}"):
            continue  # an array expanded into the command: its flags were read above
        if tok.startswith("--"):
            flags.append((tok, []))
        elif flags:
            flags[-1][1].append(tok)
    return flags


def parser_flags() -> set[str]:
    """Every option string our `python -m slime.train` parser knows."""
    from slime.arguments import build_parser

    return {opt for action in build_parser()._actions for opt in action.option_strings}


# ---- imports (child process) ---------------------------------------------------------------------------


def _import_problem(exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError):
        where = "slime module" if (exc.name or "").split(".")[0] == "slime" else "third-party package"
        return f"missing {where} {exc.name!r}"
    return f"{type(exc).__name__}: {exc}"


def check_import_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in a fresh interpreter: import the plugin, resolve its folder's slime imports, compare args."""
    for path in reversed(spec["sys_path"]):
        sys.path.insert(0, path)
    notes: list[str] = []
    if spec["sglang_stub"] and importlib.util.find_spec("sglang") is None:
        sys.path.append(spec["sglang_stub"])
        notes.append("sglang stubbed (not installed)")
    problems: list[str] = []
    import slime

    slime_dir = str(Path(slime.__file__).resolve().parent)
    if not slime_dir.startswith(str(REPO)):
        problems.append(f"the slime imported is {slime_dir}, not this repo's")
    for module_name in [spec["module"], *spec["extra_modules"]]:
        try:
            module = importlib.import_module(module_name)
        except BaseException as exc:  # noqa: BLE001 - report whatever the import raised
            problems.append(f"import {module_name}: {_import_problem(exc)}")
            continue
        if module_name == spec["module"]:
            problems += [f"{module_name} has no {name!r}" for name in spec["symbols"]
                         if not hasattr(module, name)]
    # The example's own files that the import loaded (its helpers too), plus the plugin file itself.
    folder = Path(spec["folder"]).resolve()
    loaded = [Path(m.__file__).resolve() for m in list(sys.modules.values()) if getattr(m, "__file__", None)]
    files = [p for p in loaded if p.is_relative_to(folder)] + [Path(spec["file"])]
    scan = scan_files(files)
    for module_name, name in scan["imports"]:
        try:
            module = importlib.import_module(module_name)
        except BaseException as exc:  # noqa: BLE001
            problems.append(f"slime import {module_name}: {_import_problem(exc)}")
            continue
        if name is not None and not hasattr(module, name):
            try:
                importlib.import_module(f"{module_name}.{name}")
            except ImportError:
                problems.append(f"from {module_name} import {name}: no such name")
    from slime.arguments import parse_args

    argv = ["--hf-checkpoint", "x", "--prompt-data", "x", "--rollout-batch-size", "1", "--num-rollout", "1"]
    if spec["custom_config"]:
        argv += ["--custom-config-path", spec["custom_config"]]
    try:
        defined = set(vars(parse_args(argv)))
    except BaseException as exc:  # noqa: BLE001
        problems.append(f"parse_args({' '.join(argv)}): {type(exc).__name__}: {exc}")
        defined = set()
    missing_args = sorted(set(scan["reads"]) - defined - set(scan["stores"]))
    if defined and missing_args:
        problems.append("args the plugin reads that our flags lack: " + ", ".join(
            f"{a} ({'/'.join(scan['reads'][a])})" for a in missing_args))
    if spec["probe"] and not problems:
        problems += probe_fresh_sample()
    return {"problems": problems, "notes": notes}


async def tau_bench_probe_generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    """A generate function that returns what tau-bench's own `res_to_sample` builds from an episode (the
    environment and agent need tau_bench's services, so the episode result is made here)."""
    agents = importlib.import_module("trainable_agents")
    plugin = importlib.import_module("generate_with_tau")
    episode = agents.InteractionResult(prompt="task", reward=1.0, messages=[], info={"source": "probe"},
                                       response="done", loss_mask=[1, 1], tokens=[5, 6, 7, 8],
                                       status=agents.Status.TRUNCATED)
    return plugin.res_to_sample(episode, int(sample.prompt))


def probe_fresh_sample() -> list[str]:
    """Run tau-bench's `res_to_sample` output through our `generate_and_rm`, as a rollout would."""
    import asyncio

    from slime.arguments import parse_args
    from slime.rollout.sglang_rollout import generate_and_rm
    from slime.utils.types import Sample

    args = parse_args(["--hf-checkpoint", "x", "--prompt-data", "x", "--rollout-batch-size", "1",
                       "--num-rollout", "1", "--custom-generate-function-path",
                       "__main__.tau_bench_probe_generate"])
    where = "tau-bench's res_to_sample through our generate_and_rm"
    try:
        out = asyncio.run(generate_and_rm(args, Sample(index=3, prompt="3", group_index=7), {}))
    except Exception as exc:  # noqa: BLE001 - the refusal is the finding
        return [f"{where}: {type(exc).__name__}: {exc}"]
    sample = out[0] if isinstance(out, list) else out
    problems = []
    if sample.status != Sample.Status.TRUNCATED:
        problems.append(f"{where}: status {sample.status!r}, expected Sample.Status.TRUNCATED")
    if sample.group_index != 7:
        problems.append(f"{where}: group_index {sample.group_index!r}, expected the input sample's 7")
    return problems


def check_imports(scratch: Path, work: Path, target: ImportTarget, known_flags: set[str]) -> list[Row]:
    folder = scratch / "examples" / target.folder
    stub_root = write_files(work / "stubs" / "tau", TAU_BENCH_STUB) if target.stub_tau_bench else None
    sglang_stub = write_files(work / "stubs" / "sglang", SGLANG_STUB) if target.stub_tau_bench else None
    spec = {
        "sys_path": [str(folder), str(scratch)] + ([str(stub_root)] if stub_root else []),
        "module": target.module, "extra_modules": list(target.extra_modules), "symbols": list(target.symbols),
        "custom_config": str(scratch / target.custom_config) if target.custom_config else None,
        "sglang_stub": str(sglang_stub) if sglang_stub else None,
        "probe": target.probe,
        "folder": str(folder),
        "file": str(scratch / (target.module.replace(".", "/") + ".py")
                    if target.module.startswith("examples.") else folder / f"{target.module}.py"),
    }
    proc = subprocess.run([sys.executable, __file__, "--child-import", json.dumps(spec)], cwd=scratch,
                          env=child_env(), capture_output=True, text=True, timeout=300)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return [Row("imports", target.name, FAIL,
                    f"checker crashed (exit {proc.returncode}): {proc.stderr[-800:]}")]
    notes = result["notes"] + (["tau_bench stubbed"] if target.stub_tau_bench else [])
    requirements = folder / "requirements.txt"
    listed = requirements.read_text().lower() if requirements.is_file() else ""
    for i, problem in enumerate(result["problems"]):
        found = re.search(r"missing third-party package '([\w.]+)'", problem)
        if found and re.search(rf"^{re.escape(found.group(1).split('.')[0].lower())}\b", listed, re.M):
            result["problems"][i] += (f" (a requirement of the example, examples/{target.folder}/"
                                      "requirements.txt: install it, or put it on PYTHONPATH)")
    ok = f"{target.module}: {', '.join(target.symbols)}"
    rows = [Row("imports", target.name, FAIL if result["problems"] else PASS,
                "; ".join((result["problems"] or [ok]) + notes))]
    if target.launch_script:
        rows.append(check_flags(scratch, work, target, known_flags))
    return rows


def check_flags(scratch: Path, work: Path, target: ImportTarget, known_flags: set[str]) -> Row:
    """Every flag of the launch script is known to our parser, and the CPU form of the script parses."""
    from slime.arguments import parse_args

    folder = scratch / "examples" / target.folder
    flags = launch_flags(folder / target.launch_script)
    unknown = sorted({f for f, _ in flags} - known_flags)
    as_run = RunTarget(target.name, target.folder, target.launch_script, True, "qa")
    data = (work / "train.jsonl", work / "eval.jsonl")
    argv, dropped, _ = cpu_command(as_run, scratch, work / "model", data, work / "flags", 2, known_flags)
    problems = [f"unknown to our parser: {', '.join(unknown)}"] if unknown else []
    try:
        parse_args(argv[3:])
    except SystemExit:
        problems.append("our parser exits on the CPU form (see `--only imports` stderr)")
    except Exception as exc:  # noqa: BLE001 - report the refusal as our parser words it
        problems.append(f"refused on CPU: {type(exc).__name__}: {exc}")
    detail = "; ".join(problems) or f"all {len(flags)} flags known; the CPU form parses"
    return Row("flags", f"{target.name}/{target.launch_script}", FAIL if problems else PASS,
               f"{detail} ({len(dropped)} GPU-only left out)")


# ---- contract tests ------------------------------------------------------------------------------------

LAYOUT_TEST = "test_runtime_hook_callsite_is_stable"


def run_contracts(scratch: Path, work: Path) -> list[Row]:
    """pytest upstream's tests/plugin_contracts in the scratch copy; one row per test."""
    xml = work / "contracts.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/plugin_contracts", "-q", "-rA", "-p", "no:cacheprovider",
           "-o", "addopts=", "--rootdir", str(scratch), f"--junitxml={xml}"]
    proc = subprocess.run(cmd, cwd=scratch, env=child_env(), capture_output=True, text=True, timeout=600)
    (work / "contracts.log").write_text(proc.stdout + proc.stderr)
    if not xml.exists():
        return [Row("contracts", "pytest", FAIL, f"no report (exit {proc.returncode}): {proc.stdout[-800:]}")]
    rows = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if case.find("skipped") is not None:
            rows.append(Row("contracts", name, SKIP, case.find("skipped").get("message", "")))
        elif bad is None:
            rows.append(Row("contracts", name, PASS))
        else:
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            layout = LAYOUT_TEST in name and re.search(r"No such file or directory: '(slime/[^']+)'", text)
            detail = f"reads upstream's {layout.group(1)}" if layout else _first_error(text)
            rows.append(Row("contracts", name, LAYOUT if layout else FAIL, detail))
    if not rows:
        rows.append(Row("contracts", "pytest", FAIL, f"no tests ran (exit {proc.returncode})"))
    return rows


def _first_error(text: str) -> str:
    """The most telling line of a pytest failure: the `E ...` lines, else the message."""
    lines = [ln.strip()[1:].strip() for ln in text.splitlines() if ln.strip().startswith("E ")]
    if lines:
        return " | ".join(lines[:3])[:400]
    return text.strip().splitlines()[0][:400] if text.strip() else ""


# ---- local retrieval server for search-r1 --------------------------------------------------------------

CORPUS = (
    ('"Paris"', "Paris is the capital and largest city of France, on the river Seine."),
    ('"Mount Everest"', "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ('"Python (programming language)"', "Python was created by Guido van Rossum and first released in 1991."),
    ('"Pacific Ocean"', "The Pacific Ocean is the largest and deepest of Earth's five oceanic divisions."),
    ('"Water"', "Water boils at 100 degrees Celsius at sea level."),
)


class RetrievalServer:
    """A retrieval server speaking Search-R1's protocol, over a five-document corpus.

    POST /retrieve {"queries": [q, ...], "topk": k, "return_scores": bool} answers
    {"result": [[doc, ...] per query]}, a doc being {"id", "contents"} (or {"document": doc, "score": s}
    with return_scores). Documents rank by how many query words they share."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.calls = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/retrieve" or not isinstance(body.get("queries"), list):
                    self.send_error(400, "POST /retrieve with {'queries': [...], 'topk': k}")
                    return
                server.calls += 1
                result = [server.search(str(q), int(body.get("topk", 3)), bool(body.get("return_scores")))
                          for q in body["queries"]]
                data = json.dumps({"result": result}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise RuntimeError(f"cannot serve search-r1's retrieval URL on {host}:{port} ({exc}): "
                               "search-r1's config points there; free the port and rerun") from exc
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @staticmethod
    def search(query: str, topk: int, with_scores: bool) -> list[dict[str, Any]]:
        words = set(re.findall(r"\w+", query.lower()))
        ranked = sorted(enumerate(CORPUS), key=lambda item: -len(words & set(re.findall(r"\w+", " ".join(
            item[1]).lower()))))
        docs = [{"id": str(i), "contents": f"{title}\n{text}"} for i, (title, text) in ranked[:max(topk, 0)]]
        if with_scores:
            return [{"document": d, "score": 1.0 / (rank + 1)} for rank, d in enumerate(docs)]
        return docs

    def __enter__(self) -> RetrievalServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---- 2-step CPU runs -----------------------------------------------------------------------------------


def write_data(work: Path) -> dict[str, tuple[Path, Path]]:
    """Prompt files in the formats the examples' launch scripts read: Search-R1's QA rows (chat prompt,
    `reward_model.ground_truth.target`) and dapo-math rows (`prompt`, `label`)."""
    qa = [("What is the capital of France?", ["Paris"]),
          ("Which is the highest mountain on Earth?", ["Everest"]),
          ("Who created the Python programming language?", ["Guido van Rossum"]),
          ("Which ocean is the largest?", ["Pacific"]),
          ("At what temperature in Celsius does water boil?", ["100"])]
    math = [("What is 12 * 7?", "84"), ("What is 100 - 58?", "42"), ("What is 2 ** 5?", "32"),
            ("What is 81 / 9?", "9"), ("What is 15 + 27?", "42")]
    out: dict[str, tuple[Path, Path]] = {}
    for kind, rows in (
        ("qa", [{"prompt": [{"role": "user", "content": "Answer the question. Search with <search> query "
                             "</search> when you need facts; give the answer as <answer> text </answer>. "
                             f"Question: {q}"}],
                 "reward_model": {"ground_truth": {"target": t}, "style": "rule"}} for q, t in qa]),
        ("math", [{"prompt": f"Solve the problem and put the final answer in \\boxed{{}}. {q}", "label": a}
                  for q, a in math]),
    ):
        folder = work / "data"
        folder.mkdir(parents=True, exist_ok=True)
        train, evals = folder / f"{kind}_train.jsonl", folder / f"{kind}_eval.jsonl"
        train.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
        evals.write_text("".join(json.dumps(r) + "\n" for r in rows[4:]))
        out[kind] = (train, evals)
    return out


def cpu_command(target: RunTarget, scratch: Path, model: Path, data: tuple[Path, Path], run_dir: Path,
                steps: int, known: set[str]) -> tuple[list[str], list[str], list[str]]:
    """The launch script's flags made to run on CPU: (argv, dropped-with-reason, refused-by-our-parser)."""
    argv = [sys.executable, "-m", "slime.train"]
    dropped: list[str] = []
    refused: list[str] = []
    for flag, values in launch_flags(scratch / "examples" / target.folder / target.launch_script):
        if flag in GPU_ONLY_FLAGS:
            dropped.append(f"{flag} ({GPU_ONLY_FLAGS[flag]})")
            continue
        if flag in PARALLEL_FLAGS and values != ["1"]:
            dropped.append(f"{flag} {' '.join(values)} (model parallelism)")
            continue
        if flag not in known:
            refused.append(flag)
            continue
        if flag == "--hf-checkpoint":
            values = [str(model)]
        elif flag in ("--load", "--save"):
            values = [str(run_dir / "ckpt")]
        elif flag == "--prompt-data":
            values = [str(data[0])]
        elif flag == "--eval-prompt-data":
            values = [values[0] if len(values) > 1 else "eval", str(data[1])]
        elif flag in CPU_SIZES:
            values = [str(steps) if flag == "--num-rollout" else CPU_SIZES[flag]]
        argv += [flag, *values]
    argv += [*target.extra, "--ray-num-cpus", "2"]
    for i, tok in enumerate(argv[:-1]):  # the scripts name the YAML relative to the checkout root
        if tok == "--custom-config-path" and (scratch / argv[i + 1]).is_file():
            argv[i + 1] = str(scratch / argv[i + 1])
    if "--save" not in argv:
        argv += ["--save", str(run_dir / "ckpt")]
    return argv, dropped, refused


SEARCH_PROBE = """
import asyncio
import generate_with_search as plugin
print(asyncio.run(plugin.search("What is the capital of France?")))
"""


def search_probe(scratch: Path, env: dict[str, str]) -> str | None:
    """Call search-r1's own `search()` against our retrieval server once (a random tiny model seldom writes a
    <search> tag, so the run alone may never reach it); None when the passages come back as expected."""
    proc = subprocess.run([sys.executable, "-c", SEARCH_PROBE], cwd=scratch, env=env, capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0 or 'Doc 1(Title: "Paris")' not in proc.stdout:
        output = (proc.stdout + proc.stderr)[-400:]
        return f"search-r1's search() did not read our retrieval server's reply: {output}"
    return None


def run_training(target: RunTarget, scratch: Path, work: Path, model: Path,
                 data: dict[str, tuple[Path, Path]], steps: int, known: set[str], timeout: float) -> Row:
    run_dir = work / "runs" / re.sub(r"[^\w.-]+", "_", target.name)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    argv, dropped, refused = cpu_command(target, scratch, model, data[target.data], run_dir, steps, known)
    folder = scratch / "examples" / target.folder
    env = child_env(*([folder] if target.on_pythonpath else []), scratch)
    (run_dir / "command.txt").write_text(shlex.join(argv) + "\n\ndropped (GPU-only): " + "; ".join(dropped)
                                         + "\nrefused by our parser: " + ", ".join(refused) + "\n")
    server = RetrievalServer() if target.needs_search_server else None
    start = time.monotonic()
    probe = None
    with server or contextlib.nullcontext():
        if server is not None:
            probe = search_probe(scratch, env)
        proc = subprocess.Popen(argv, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out = f"(timed out after {timeout:.0f} s)"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # Ray leaves processes in the run's session
            except ProcessLookupError:
                pass
            proc.wait()
    elapsed = time.monotonic() - start
    (run_dir / "train.log").write_text(out)
    records = _train_records(run_dir / "ckpt" / "metrics.jsonl")
    problems = []
    if refused:
        problems.append("refused flags (left out): " + ", ".join(refused))
    if proc.returncode != 0:
        problems.append(f"exit {proc.returncode}: {_last_error(out)}")
    if len(records) < steps:
        problems.append(f"{len(records)}/{steps} train steps logged")
    last = records[max(records)] if records else {}
    if records and target.expect_metric and not any(re.search(target.expect_metric, k) for k in last):
        problems.append(f"no train metric matching {target.expect_metric!r}: the plugin did not run")
    episodes = last.get("rollout/episodes_trained", 0)
    detail = (f"{len(records)} steps in {elapsed:.0f}s; last step: {episodes:g} episodes, "
              f"{last.get('train/tokens', 0):g} tokens trained "
              f"({last.get('train/zero_advantage_samples', 0):g} zero-advantage samples skipped), "
              f"reward {last.get('rollout/raw_reward', 0.0):.3g}")
    if server is not None:
        detail += f", {server.calls} /retrieve (1 by a probe of its search())"
        if probe:
            problems.append(probe)
    return Row("runs", target.name, FAIL if problems else PASS,
               "; ".join(problems + ([detail] if records else [])) + f"  [log: {run_dir / 'train.log'}]")


def _train_records(path: Path) -> dict[int, dict[str, Any]]:
    records: dict[int, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("kind") == "train":
                records[record["step"]] = record
    return records


def _last_error(log: str) -> str:
    """The last exception line of a run's log (what a reader needs first)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Exit)\b.*:", ln) or ln.startswith(("slime.", "AssertionError")):
            return ln[:500]
    return lines[-1][:500] if lines else "(no output)"


# ---- report --------------------------------------------------------------------------------------------


SECTIONS = ("imports", "flags", "contracts", "runs")


def print_table(rows: list[Row]) -> None:
    rows = sorted(rows, key=lambda r: SECTIONS.index(r.section))
    section, width = None, 0
    for row in rows:
        if row.section != section:
            section = row.section
            width = max(len(r.name) for r in rows if r.section == section) + 2
            print(f"\n== {section}")
        print(f"  {row.status:<6} {row.name:<{width}} {row.detail}".rstrip())
    counts = {s: sum(r.status == s for r in rows) for s in (PASS, FAIL, LAYOUT, SKIP)}
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items() if n))


def iter_sections(args: argparse.Namespace, scratch: Path, work: Path) -> Iterator[Row]:
    known = parser_flags()
    wanted = set(args.only.split(","))
    if "imports" in wanted:
        for target in IMPORT_TARGETS:
            yield from check_imports(scratch, work, target, known)
    if "contracts" in wanted:
        yield from run_contracts(scratch, work)
    if "runs" in wanted:
        model = work / "model"
        if not (model / "config.json").exists():
            subprocess.run([sys.executable, "-m", "slime.models.tiny", "--out", str(model)], cwd=REPO,
                           env=child_env(), check=True, capture_output=True)
        data = write_data(work)
        for target in RUN_TARGETS:
            if args.runs and target.name not in args.runs.split(","):
                continue
            yield run_training(target, scratch, work, model, data, args.steps, known, args.timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", type=Path,
                        help="a checkout of THUDM/slime (examples/, tests/plugin_contracts)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temp folder)")
    parser.add_argument("--only", default="imports,contracts,runs",
                        help="comma list of imports,contracts,runs (flags come with imports)")
    parser.add_argument("--runs", default="", help="comma list of run names (default: all)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per training run")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    parser.add_argument("--child-import", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_import:
        print(json.dumps(check_import_child(json.loads(args.child_import))))
        return 0
    if args.upstream is None:
        parser.error("--upstream DIR is required (a checkout of THUDM/slime)")
    upstream = args.upstream.resolve()
    check_upstream(upstream)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # our slime, for the parser's flag list
    work = (args.work or Path(tempfile.mkdtemp(prefix="slime-upstream-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    scratch = prepare_scratch(upstream, work)
    print(f"upstream: {upstream}\nscratch copy: {scratch}\nslime under test: {REPO / 'slime'}")
    rows: list[Row] = []
    for row in iter_sections(args, scratch, work):
        rows.append(row)
        print(f"  {row.status:<6} [{row.section}] {row.name}", flush=True)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if any(r.status == FAIL for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
