#!/usr/bin/env bash
# One-command setup for Stateful-RL and its awm_grpo recipe.
#
#   bash setup.sh              # everything: venv + packages, then the model, data and splits of this machine
#   bash setup.sh --deps-only  # packages and the project only (what tests/run.sh uses)
#   bash setup.sh --dry-run    # what it would install here (GPU: the driver read, the set picked), nothing done
#   bash setup.sh --bfcl       # only the BFCL harness's own venv, .venv-bfcl (python -m awm_grpo.eval_bfcl)
#   bash setup.sh --help
#
# CPU machines (no GPU): the pinned CPU set (torch==2.13.0, CPU build: the installer is pointed at a
# CPU wheel source first, so nothing can pull a multi-GB CUDA torch), then the embedded default:
# bundled scenarios and their template DBs, a small Qwen3-architecture model built locally, the
# splits, and a warm start of that model on the reference solutions when awm_grpo/warmstart/sft.py exists.
# GPU machines: one of two pinned sets, picked from the NVIDIA driver (nvidia-smi): cu13 (CUDA 13,
# driver R580+, glibc 2.34+) or cu12 (CUDA 12, driver 525.60.13+, glibc 2.28+); both Python 3.11/3.12
# (docs/gpu.md, "Install"). The set is locked with `uv pip compile` and the lock installed as is; then
# Qwen3-4B and AWM-1K are downloaded with huggingface_hub, template DBs built, splits written. The
# trainer reads Hugging Face checkpoints directly: there is no conversion.
# Nothing is written to a .env file: the run script reads only its config, flags and environment.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV_DIR:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
MODE="auto"
MODE_WHY=""
GPU_SET=""
DRY_RUN=0
SKIP_DEPS=0
DEPS_ONLY=0
SKIP_MODEL=0
SKIP_DATA=0
SKIP_WARMSTART=0
BFCL=0
BFCL_VENV="${BFCL_VENV_DIR:-$ROOT/.venv-bfcl}"
MODEL_PATH=""
NUM_GPUS_ARG=""
MODEL_HF_REPO="${MODEL_HF_REPO:-Qwen/Qwen3-4B}"
MODEL_DIR="${MODEL_DIR:-$ROOT/runs/models/Qwen3-4B}"
AWM_DATA_REPO="${AWM_DATA_REPO:-Snowflake/AgentWorldModel-1K}"
DATA_DIR="${AWM_DATA_DIR:-$ROOT/runs/data/awm1k}"
CPU_MODELS="$ROOT/runs/awm_grpo/models"

usage() {
  cat <<'USAGE'
Usage: bash setup.sh [options]

Creates a virtual environment, installs the project, and prepares what `bash awm_grpo/run_awm_grpo.sh`
needs on this machine (GPU: Qwen3-4B + AWM-1K; CPU: the embedded default). Safe to re-run: finished
steps are skipped.

Options:
  --venv DIR             virtual environment to create or reuse (default: ./.venv; env VENV_DIR)
  --python PY            interpreter used to create it (default: python3; needs 3.11+, GPU: 3.11 or 3.12)
  --cpu | --gpu          force the CPU or GPU install (default: GPU if nvidia-smi sees a GPU); the GPU
                         install's set is picked from the NVIDIA driver (docs/gpu.md, "Install")
  --gpu-set cu12|cu13    GPU: install this set instead of the one the driver picks (implies --gpu). The pick:
                         driver R580+ -> cu13 (CUDA 13; glibc 2.34+), 525.60.13-R579 -> cu12 (CUDA 12;
                         glibc 2.28+), also R580+ on glibc 2.28-2.33; older drivers are refused. Both sets
                         need Python 3.11 or 3.12, linux x86_64. Without nvidia-smi (e.g. building a venv
                         on a machine without GPUs) --gpu needs --gpu-set.
  --dry-run              install, download and create nothing: print the mode, (GPU) the driver read, the
                         set picked and why, the Python and glibc checked, and `requirements: ARGS`, the
                         `uv pip compile` arguments that resolve what would be installed
  --num-gpus N           0 = --cpu, N > 0 = --gpu; the run script detects the count itself (NUM_GPUS overrides)
  --deps-only            install packages and the project, nothing else (tests/run.sh uses this)
  --skip-deps            do not install packages; only (re)install the project and prepare model and data
  --skip-model-download  GPU: do not download the model; CPU: do not build the small model or warm-start it
  --model-path DIR       use this Hugging Face model folder (GPU: instead of downloading, then run with
                         HF_CKPT=DIR; CPU: as the warm start's base instead of its own small model)
  --skip-data-download   GPU: do not download AWM-1K (the DBs and splits are built if the data is there)
  --skip-warmstart       CPU: do not run the warm start (python -m awm_grpo.warmstart)
  --bfcl                 only create the BFCL harness's venv (./.venv-bfcl; env BFCL_VENV_DIR) from
                         requirements-bfcl.txt with uv, for python -m awm_grpo.eval_bfcl; nothing else
  -h, --help             show this help

Environment: MODEL_HF_REPO (Qwen/Qwen3-4B), MODEL_DIR (runs/models/Qwen3-4B), AWM_DATA_REPO
(Snowflake/AgentWorldModel-1K), AWM_DATA_DIR (runs/data/awm1k; the run script reads it too),
HF_ENDPOINT / HF_TOKEN (huggingface_hub), WARMSTART_BASE (CPU: base model of the warm start), UV_CACHE_DIR (uv's cache), TORCH_CPU_INDEX (CPU wheel index
used when no local CPU wheel directory exists; default https://download.pytorch.org/whl/cpu).
USAGE
}

need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "setup.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --venv) need_value "$@"; VENV="$(realpath -m "$2")"; shift 2 ;;
    --python) need_value "$@"; PYTHON="$2"; shift 2 ;;
    --cpu) MODE="cpu"; MODE_WHY="--cpu"; shift ;;
    --gpu) MODE="gpu"; MODE_WHY="--gpu"; shift ;;
    --gpu-set) need_value "$@"; GPU_SET="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --num-gpus) need_value "$@"; NUM_GPUS_ARG="$2"; shift 2 ;;
    --deps-only) DEPS_ONLY=1; shift ;;
    --skip-deps) SKIP_DEPS=1; shift ;;
    --skip-model-download) SKIP_MODEL=1; shift ;;
    --model-path) need_value "$@"; MODEL_PATH="$(realpath -m "$2")"; shift 2 ;;
    --skip-data-download) SKIP_DATA=1; shift ;;
    --skip-warmstart) SKIP_WARMSTART=1; shift ;;
    --bfcl) BFCL=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "setup.sh: $*" >&2; exit 2; }
warn() { printf 'setup.sh: WARNING: %s\n' "$@" >&2; }
log() { printf '[setup] %s\n' "$*"; }
# The plan's lines: plain under --dry-run (one fact a line, `requirements: ...` among them), else logged.
plan() { if [[ "$DRY_RUN" == 1 ]]; then printf '%s\n' "$*"; else log "$*"; fi; }

if [[ -n "$NUM_GPUS_ARG" ]]; then
  [[ "$NUM_GPUS_ARG" =~ ^[0-9]+$ ]] || die "--num-gpus takes a number, got '$NUM_GPUS_ARG'"
  if [[ "$NUM_GPUS_ARG" == 0 ]]; then MODE="cpu"; MODE_WHY="--num-gpus 0"; else MODE="gpu"; MODE_WHY="--num-gpus $NUM_GPUS_ARG"; fi
fi
if [[ -n "$GPU_SET" ]]; then
  [[ "$GPU_SET" == cu12 || "$GPU_SET" == cu13 ]] || die "--gpu-set takes cu12 or cu13, got '$GPU_SET'"
  [[ "$MODE" != cpu ]] || die "--gpu-set $GPU_SET names a GPU set, but $MODE_WHY asks for the CPU install: drop one of them"
  [[ "$MODE" == gpu ]] || MODE_WHY="--gpu-set"
  MODE="gpu"
fi
if [[ -n "$MODEL_PATH" && ! -f "$MODEL_PATH/config.json" ]]; then
  die "--model-path $MODEL_PATH is not a Hugging Face model folder (no config.json)"
fi
if [[ "$MODE" == "auto" ]]; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then MODE="cpu"; MODE_WHY="nvidia-smi is not on PATH"
  elif nvidia-smi -L >/dev/null 2>&1; then MODE="gpu"; MODE_WHY="nvidia-smi -L lists a GPU"
  else MODE="cpu"; MODE_WHY="nvidia-smi -L lists no GPU"
  fi
fi

# ---- the GPU sets: what each needs of the machine --------------------------------------------------
# Driver floors are NVIDIA's (CUDA Toolkit release notes, minor-version compatibility: CUDA 12.x runs on
# >= 525.60.13, CUDA 13.x on >= 580). glibc floors are the newest manylinux tag the set's resolved wheels
# need (tests/test_gpu_deps.py computes them from the locks and checks these numbers). docs/gpu.md, "Install".
GPU_PYTHONS=(3.11 3.12)
GPU_PYTHONS_TEXT="3.11 or 3.12"
declare -A SET_DRIVER_FLOOR=([cu12]=525.60.13 [cu13]=580)
declare -A SET_DRIVER_TEXT=([cu12]="525.60.13+" [cu13]="R580+")
declare -A SET_GLIBC_FLOOR=([cu12]=2.28 [cu13]=2.34)
declare -A SET_GLIBC_WHY=([cu12]="torch 2.9.1's wheels are manylinux_2_28" [cu13]="sglang 0.5.23's wheels are manylinux_2_34 only")
declare -A SET_OS_HINT=([cu12]="Ubuntu 20.04+, Debian 10+, RHEL/Rocky 8+" [cu13]="Ubuntu 22.04+, Debian 12+, RHEL/Rocky 9+")

# "550.54.15" / "2.35" -> one comparable number; fails on anything else.
version_key() {
  [[ "$1" =~ ^([0-9]{1,6})(\.([0-9]{1,3}))?(\.([0-9]{1,3}))?$ ]] || return 1
  echo $(( 10#${BASH_REMATCH[1]} * 1000000 + 10#${BASH_REMATCH[3]:-0} * 1000 + 10#${BASH_REMATCH[5]:-0} ))
}
at_least() { (( $(version_key "$1") >= $(version_key "$2") )); }

# The NVIDIA driver: DRIVER (a version) and GPU_COUNT, or DRIVER_PROBLEM (what was read, as a sentence).
read_driver() {
  DRIVER="" DRIVER_PROBLEM="" GPU_COUNT=0
  if ! command -v nvidia-smi >/dev/null 2>&1; then DRIVER_PROBLEM="nvidia-smi is not on PATH"; return; fi
  local out rc=0 versions
  out="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1)" || rc=$?
  if (( rc != 0 )); then
    DRIVER_PROBLEM="nvidia-smi --query-gpu=driver_version failed (exit $rc: '$(head -n 1 <<<"$out" | cut -c1-120)')"
    return
  fi
  versions="$(sed 's/^[[:space:]]*//; s/[[:space:]]*$//' <<<"$out" | grep -v '^$' | sort -u || true)"  # a line a GPU
  GPU_COUNT="$(grep -c '[^[:space:]]' <<<"$out" || true)"
  local line bad=""
  while IFS= read -r line; do version_key "$line" >/dev/null || { bad="$line"; break; }; done <<<"$versions"
  if [[ -z "$versions" ]]; then
    DRIVER_PROBLEM="nvidia-smi --query-gpu=driver_version printed no driver version (an empty answer)"
  elif [[ -n "$bad" ]]; then
    DRIVER_PROBLEM="nvidia-smi --query-gpu=driver_version printed '$(cut -c1-120 <<<"$bad")', not a driver version like 550.54.15"
  elif [[ "$(wc -l <<<"$versions")" -gt 1 ]]; then
    DRIVER_PROBLEM="nvidia-smi --query-gpu=driver_version printed several driver versions ($(paste -sd, - <<<"$versions" | cut -c1-120))"
  else
    DRIVER="$versions"
  fi
}

# glibc: GLIBC ("2.35") and GLIBC_FROM (the command), or GLIBC_SEEN (what the commands printed).
read_glibc() {
  GLIBC="" GLIBC_FROM="" GLIBC_SEEN=""
  local out
  out="$(getconf GNU_LIBC_VERSION 2>/dev/null || true)"
  if [[ "$out" =~ ^glibc[[:space:]]+([0-9]+\.[0-9]+) ]]; then GLIBC="${BASH_REMATCH[1]}"; GLIBC_FROM="getconf GNU_LIBC_VERSION"; return; fi
  GLIBC_SEEN="getconf GNU_LIBC_VERSION printed '$(head -n 1 <<<"$out" | cut -c1-80)'"
  out="$( (ldd --version 2>&1 || true) | head -n 1)"
  if [[ "$out" =~ ^ldd[[:space:]].*[[:space:]]([0-9]+\.[0-9]+)$ ]]; then GLIBC="${BASH_REMATCH[1]}"; GLIBC_FROM="ldd --version"; return; fi
  GLIBC_SEEN="$GLIBC_SEEN, ldd --version '$(cut -c1-80 <<<"$out")'"
}

# The interpreter the venv has or will be made with: PY_CHECKED (its path or name), PY_VERSION ("3.11.7").
read_python() {
  if [[ -x "$VENV/bin/python" ]]; then PY_CHECKED="$VENV/bin/python"; PY_ROLE="the existing venv's"
  else PY_CHECKED="$PYTHON"; PY_ROLE="a new venv is made with it"; fi
  PY_VERSION="$("$PY_CHECKED" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || true)"
  [[ "$PY_VERSION" =~ ^[0-9]+\.[0-9]+ ]] \
    || die "the interpreter '$PY_CHECKED' does not run or print its version (--python / PYTHON): install Python 3.11 or 3.12, or pass --python PATH"
  PY_MINOR="${BASH_REMATCH[0]}"
}

# Picks SET (cu12 / cu13) with SET_WHY, or refuses with a sentence (exit 2) that says what to do.
pick_gpu_set() {
  local arch
  arch="$(uname -m)"
  [[ "$arch" == x86_64 ]] || die "this machine is $arch; the GPU sets are resolved and tested for linux x86_64 only (docs/gpu.md): use --cpu"
  read_driver
  read_glibc
  [[ -n "$GLIBC" ]] || die "could not read the C library's version ($GLIBC_SEEN): the GPU sets' wheels need glibc (2.28+ for cu12, 2.34+ for cu13). On a glibc Linux, check that getconf or ldd runs; otherwise use --cpu."
  local from_driver=""
  if [[ -n "$DRIVER" ]]; then
    if at_least "$DRIVER" "${SET_DRIVER_FLOOR[cu13]}"; then from_driver=cu13
    elif at_least "$DRIVER" "${SET_DRIVER_FLOOR[cu12]}"; then from_driver=cu12
    fi
  fi
  if [[ -n "$GPU_SET" ]]; then
    SET="$GPU_SET"; SET_WHY="--gpu-set $GPU_SET"
    if [[ -z "$DRIVER" ]]; then
      warn "the driver was not read ($DRIVER_PROBLEM), so --gpu-set $SET is not checked against one:" \
           "the $SET set needs NVIDIA driver ${SET_DRIVER_TEXT[$SET]} on the machine that runs it."
      SET_WHY="$SET_WHY (no driver read)"
    elif ! at_least "$DRIVER" "${SET_DRIVER_FLOOR[$SET]}"; then
      warn "--gpu-set $SET CONTRADICTS THIS MACHINE'S DRIVER: $SET needs NVIDIA driver ${SET_DRIVER_TEXT[$SET]}, nvidia-smi reports $DRIVER." \
           "torch will not initialise CUDA here until the driver is upgraded${from_driver:+ (the driver alone picks $from_driver)}."
      SET_WHY="$SET_WHY, against driver $DRIVER (below ${SET_DRIVER_FLOOR[$SET]})"
    elif [[ "$from_driver" != "$SET" ]]; then
      SET_WHY="$SET_WHY; driver $DRIVER alone would pick $from_driver, and a newer driver runs older CUDA, so $SET runs on it too"
    else
      SET_WHY="$SET_WHY; driver $DRIVER would pick it too"
    fi
  else
    if [[ -z "$DRIVER" ]]; then
      if [[ "$DRIVER_PROBLEM" == "nvidia-smi is not on PATH" ]]; then
        die "--gpu, but nvidia-smi is not on PATH, so the NVIDIA driver cannot be read to pick a GPU set." \
            "Install the NVIDIA driver (it brings nvidia-smi; R580+ for the cu13 set, 525.60.13+ for cu12)," \
            "or name the set with --gpu-set cu13 or --gpu-set cu12 (e.g. to build the venv on a machine without GPUs), or use --cpu."
      fi
      die "$DRIVER_PROBLEM, so no GPU set can be picked from the driver: pass --gpu-set cu13 (driver R580+)" \
          "or --gpu-set cu12 (driver 525.60.13+) to choose one (the driver is in the header of plain nvidia-smi), or use --cpu."
    fi
    case "$from_driver" in
      cu13)
        if at_least "$GLIBC" "${SET_GLIBC_FLOOR[cu13]}"; then
          SET=cu13; SET_WHY="driver $DRIVER is R580+, which CUDA 13 needs"
        else
          SET=cu12
          SET_WHY="driver $DRIVER is R580+, but glibc $GLIBC is below cu13's ${SET_GLIBC_FLOOR[cu13]} (${SET_GLIBC_WHY[cu13]}); a newer driver runs older CUDA, so the CUDA 12 set"
        fi ;;
      cu12) SET=cu12; SET_WHY="driver $DRIVER is between 525.60.13 and R580: CUDA 12 runs on it (NVIDIA's minor-version compatibility), CUDA 13 needs R580+" ;;
      *) die "NVIDIA driver $DRIVER (read with nvidia-smi) is older than ${SET_DRIVER_FLOOR[cu12]}, the oldest that runs CUDA 12" \
             "(NVIDIA's minor-version compatibility floor; CUDA 13 needs R580+), so no GPU set of this project runs on it." \
             "Upgrade the driver (R535 or newer for the cu12 set, R580+ for cu13), or install the CPU set with --cpu." ;;
    esac
  fi
  if ! at_least "$GLIBC" "${SET_GLIBC_FLOOR[$SET]}"; then
    local fix="run on a newer Linux (${SET_OS_HINT[$SET]}), or use --cpu"
    [[ "$SET" == cu13 ]] && fix="use --gpu-set cu12 (glibc ${SET_GLIBC_FLOOR[cu12]}+, driver ${SET_DRIVER_TEXT[cu12]}; an R580+ driver runs it too), or $fix"
    die "glibc $GLIBC ($GLIBC_FROM) is older than ${SET_GLIBC_FLOOR[$SET]}, which the $SET set needs (${SET_GLIBC_WHY[$SET]}): $fix."
  fi
}

# ---- BFCL's own venv (--bfcl): bfcl-eval pins numpy 1.26.4 and many SDKs, so never the main venv ----
if [[ "$BFCL" == 1 ]]; then
  if [[ "$DRY_RUN" == 1 ]]; then
    plan "dry run: nothing is installed, downloaded or created"
    plan "bfcl: $BFCL_VENV, made with $PYTHON if missing; requirements-bfcl.txt installed whole with --no-deps (its own pinned closure)"
    plan "requirements: requirements-bfcl.txt"
    exit 0
  fi
  want="$(sha256sum "$ROOT/requirements-bfcl.txt" | cut -d" " -f1)"
  if [[ -x "$BFCL_VENV/bin/python" && "$(cat "$BFCL_VENV/.stateful-rl-bfcl" 2>/dev/null)" == "$want" ]]; then
    log "BFCL: $BFCL_VENV is up to date"; exit 0
  fi
  [[ -x "$BFCL_VENV/bin/python" ]] || { log "BFCL: creating $BFCL_VENV with $PYTHON"; "$PYTHON" -m venv "$BFCL_VENV"; }
  BFCL_UV="$VENV/bin/uv"  # the main venv's uv when there is one; else uv inside the BFCL venv
  if [[ ! -x "$BFCL_UV" ]]; then
    "$BFCL_VENV/bin/python" -m pip install -q --disable-pip-version-check uv==0.13.8
    BFCL_UV="$BFCL_VENV/bin/uv"
  fi
  log "BFCL: installing requirements-bfcl.txt (the whole pinned closure, --no-deps) into $BFCL_VENV"
  "$BFCL_UV" pip install --python "$BFCL_VENV/bin/python" --no-deps -q -r "$ROOT/requirements-bfcl.txt"
  probe="$(mktemp -d)"  # bfcl-eval creates result/ and score/ under BFCL_PROJECT_ROOT on import
  BFCL_PROJECT_ROOT="$probe" "$BFCL_VENV/bin/python" -c \
    'import bfcl_eval.constants.model_config, bfcl_eval.eval_checker.eval_runner' \
    || { rm -rf "$probe"; echo "setup.sh: bfcl-eval does not import in $BFCL_VENV (see the error above)" >&2; exit 1; }
  rm -rf "$probe"
  echo "$want" > "$BFCL_VENV/.stateful-rl-bfcl"
  log "BFCL: done. Next: $VENV/bin/python -m awm_grpo.eval_bfcl --help"
  exit 0
fi

# ---- 1. the plan: which set, checked against this machine (all that --dry-run does) --------------
# A local directory of CPU wheels (this platform's /opt/wheels) beats any index.
if compgen -G "/opt/wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
  TORCH_SRC=(--find-links /opt/wheels)
else
  TORCH_SRC=(--extra-index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" --index-strategy unsafe-best-match)
fi
[[ "$DRY_RUN" == 1 ]] && plan "dry run: nothing is installed, downloaded or created"
plan "mode: $MODE ($MODE_WHY)"
if [[ "$SKIP_DEPS" == 1 ]]; then
  plan "packages: skipped (--skip-deps); only the project is (re)installed"
else
  read_python
  if [[ "$MODE" == "cpu" ]]; then
    at_least "$PY_MINOR" 3.11 || die "Python $PY_VERSION ($PY_CHECKED) is older than 3.11, which the project needs: pass --python python3.11 (or newer)"
    plan "python: $PY_VERSION ($PY_CHECKED; $PY_ROLE): the CPU set takes 3.11+"
    INSTALL_SET="cpu"
    plan "set: cpu (requirements-cpu.txt: torch $(sed -n 's/^torch==//p' "$ROOT/requirements-cpu.txt"), the CPU build, from ${TORCH_SRC[1]})"
    REQS=(requirements-cpu.txt -c constraints-cpu.txt "${TORCH_SRC[@]}")
  else
    pick_gpu_set
    if [[ -n "$DRIVER" ]]; then plan "driver: $DRIVER (nvidia-smi --query-gpu=driver_version, $GPU_COUNT GPU(s))"
    else plan "driver: not read ($DRIVER_PROBLEM)"; fi
    plan "set: $SET (requirements-gpu-$SET.txt: torch $(sed -n 's/^torch==//p' "$ROOT/requirements-gpu-$SET.txt")): $SET_WHY"
    supported=0
    for v in "${GPU_PYTHONS[@]}"; do [[ "$PY_MINOR" == "$v" ]] && supported=1; done
    if [[ "$supported" == 0 ]]; then
      hint="pass --python python3.12 (or python3.11)."
      [[ -x "$VENV/bin/python" ]] && hint="$VENV was made with it: pass --venv DIR for a new venv, with --python python3.12 (or python3.11)."
      die "Python $PY_VERSION ($PY_CHECKED) is not one the GPU sets are resolved and tested for ($GPU_PYTHONS_TEXT): $hint"
    fi
    plan "python: $PY_VERSION ($PY_CHECKED; $PY_ROLE): the GPU sets take $GPU_PYTHONS_TEXT"
    plan "glibc: $GLIBC ($GLIBC_FROM): $SET needs ${SET_GLIBC_FLOOR[$SET]}+"
    INSTALL_SET="gpu-$SET"
    REQS=(pyproject.toml "requirements-gpu-$SET.txt" --extra "gpu-$SET")
    PLATFORM="x86_64-manylinux_${SET_GLIBC_FLOOR[$SET]/./_}"
    LOCK="$VENV/stateful-rl-lock-gpu-$SET.txt"
    LOCK_FLAGS=(--python-platform "$PLATFORM" --python-version "$PY_MINOR" --only-binary :all:)
  fi
  # One venv holds one set: another set over it would leave the first one's packages (a CUDA torch, sglang) behind.
  if [[ -f "$VENV/.stateful-rl-set" && "$(cat "$VENV/.stateful-rl-set")" != "$INSTALL_SET" ]]; then
    die "$VENV holds the $(cat "$VENV/.stateful-rl-set") set; installing the $INSTALL_SET set over it would leave that set's packages behind: pass --venv DIR for a new venv, or delete $VENV first"
  fi
  plan "requirements: ${REQS[*]}"
  if [[ "$MODE" == gpu ]]; then
    plan "lock: uv pip compile <requirements> ${LOCK_FLAGS[*]} -o $LOCK, then uv pip install --no-deps -r that lock (exactly what it lists)"
  fi
fi
if [[ "$DRY_RUN" == 1 ]]; then
  if [[ "$DEPS_ONLY" == 1 ]]; then plan "then: the project, editable (--no-deps); nothing else (--deps-only)"
  elif [[ "$MODE" == gpu ]]; then plan "then: the project, editable (--no-deps); Qwen3-4B into $MODEL_DIR and AWM-1K into $DATA_DIR (huggingface_hub), template DBs, splits"
  else plan "then: the project, editable (--no-deps); the embedded default: template DBs, splits, the small model, the warm start"
  fi
  exit 0
fi

# ---- 2. packages -----------------------------------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

if [[ "$SKIP_DEPS" == 0 ]]; then
  log "installing uv"
  "$PY" -m pip install -q --disable-pip-version-check uv==0.13.8
  UV=("$VENV/bin/uv" pip install --python "$PY" --compile-bytecode)
  if [[ "$MODE" == "cpu" ]]; then
    log "installing the pinned CPU set (requirements-cpu.txt)"
    "${UV[@]}" "${TORCH_SRC[@]}" -r "$ROOT/requirements-cpu.txt" -c "$ROOT/constraints-cpu.txt"
  else
    log "locking the $SET set: uv pip compile ${REQS[*]} ${LOCK_FLAGS[*]} -o $LOCK"
    (cd "$ROOT" && "$VENV/bin/uv" pip compile "${REQS[@]}" "${LOCK_FLAGS[@]}" --quiet -o "$LOCK")
    log "installing the lock ($(grep -c '^[a-zA-Z0-9]' "$LOCK") packages, --no-deps: exactly what it lists)"
    "${UV[@]}" --no-deps -r "$LOCK"
  fi
  echo "$INSTALL_SET" > "$VENV/.stateful-rl-set"
fi

log "installing the project (editable, no dependency changes)"
if [[ -x "$VENV/bin/uv" ]]; then
  "$VENV/bin/uv" pip install --python "$PY" -q --no-deps -e "$ROOT" 2>/dev/null \
    || "$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
else
  "$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
fi

if [[ "$MODE" == "cpu" ]]; then
  "$PY" - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"expected the CPU torch 2.13.0, found {torch.__version__}"
PY
elif [[ "$SKIP_DEPS" == 0 ]]; then
  # What the set promises, read from the installed torch (no GPU needed): its version and CUDA major.
  "$PY" - "$SET" "$(sed -n 's/^torch==//p' "$ROOT/requirements-gpu-$SET.txt")" <<'PY'
import sys

import torch

gpu_set, want = sys.argv[1], sys.argv[2]
cuda = torch.version.cuda or "none"
assert torch.__version__.split("+")[0] == want, f"the {gpu_set} set pins torch {want}, found {torch.__version__}"
assert cuda.split(".")[0] == gpu_set[2:], f"the {gpu_set} set needs a CUDA {gpu_set[2:]} build of torch, found CUDA {cuda}"
print(f"[setup] torch {torch.__version__} (CUDA {cuda}) for the {gpu_set} set")
PY
fi

# The packages are in place: tests/run.sh compares this stamp with the requirement files.
cat "$ROOT/requirements-common.txt" "$ROOT/requirements-cpu.txt" "$ROOT/requirements-gpu-cu12.txt" "$ROOT/requirements-gpu-cu13.txt" \
  "$ROOT/constraints-cpu.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d" " -f1 > "$VENV/.stateful-rl-setup"
if [[ "$DEPS_ONLY" == 1 ]]; then
  log "done ($MODE, packages only). Next: bash tests/run.sh    |    bash setup.sh --skip-deps (model and data)"
  exit 0
fi

# ---- 2. model, data, splits ----------------------------------------------------------------------
export HF_HUB_DISABLE_TELEMETRY=1
LAUNCH=("$PY" -m awm_grpo.launch)
RUN_HINT=""
if [[ "$MODE" == "gpu" ]]; then
  if [[ -n "$MODEL_PATH" ]]; then
    log "model: using $MODEL_PATH (no download)"
    RUN_HINT="HF_CKPT=$MODEL_PATH "
  elif [[ "$SKIP_MODEL" == 1 ]]; then
    log "model: skipped (--skip-model-download)"
  elif [[ -f "$MODEL_DIR/config.json" ]]; then
    log "model: $MODEL_DIR is there"
  else
    log "model: downloading $MODEL_HF_REPO into $MODEL_DIR (huggingface_hub)"
    "$PY" -c 'import sys; from huggingface_hub import snapshot_download; snapshot_download(repo_id=sys.argv[1], local_dir=sys.argv[2])' \
      "$MODEL_HF_REPO" "$MODEL_DIR"
  fi
  [[ "$MODEL_DIR" == "$ROOT/runs/models/Qwen3-4B" || -n "$MODEL_PATH" ]] || RUN_HINT="HF_CKPT=$MODEL_DIR "

  if [[ "$SKIP_DATA" == 1 ]]; then
    log "AWM-1K: download skipped (--skip-data-download)"
  elif [[ -f "$DATA_DIR/gen_envs.jsonl" ]]; then
    log "AWM-1K: $DATA_DIR is there"
  else
    log "AWM-1K: downloading $AWM_DATA_REPO into $DATA_DIR (huggingface_hub)"
    "$VENV/bin/awm" data download --dest "$DATA_DIR" --repo-id "$AWM_DATA_REPO"
  fi
  [[ "$DATA_DIR" == "$ROOT/runs/data/awm1k" ]] || RUN_HINT="${RUN_HINT}AWM_DATA_DIR=$DATA_DIR "
  if [[ -f "$DATA_DIR/gen_envs.jsonl" ]]; then
    log "AWM-1K: building template databases"
    "$VENV/bin/awm" env reset_db --data-dir "$DATA_DIR" --quiet
    log "splits of $DATA_DIR (python -m awm_grpo.data_prep, through the run config)"
    AWM_DATA_DIR="$DATA_DIR" "${LAUNCH[@]}" --prepare-only >/dev/null
  else
    log "AWM-1K: no data in $DATA_DIR yet: template DBs and splits are left to a later run"
  fi
else
  log "embedded default: bundled scenarios -> template databases"
  "$VENV/bin/awm" env reset_db --quiet
  log "embedded default: splits of the bundled scenarios"
  SPLITS="$("${LAUNCH[@]}" --profile cpu --prepare-only | tail -n 1)"
  BASE="$CPU_MODELS/base"
  if [[ -n "$MODEL_PATH" ]]; then
    BASE="$MODEL_PATH"
    log "small model: using $BASE"
  elif [[ "$SKIP_MODEL" == 1 ]]; then
    log "small model: skipped (--skip-model-download)"
  else
    log "small model: building $BASE (python -m slime.models.tiny, offline)"
    "$PY" -m slime.models.tiny --out "$BASE"
  fi
  # ---- warm start: supervised fine-tuning on the bundled reference solutions (optional step) ----
  if [[ ! -f "$ROOT/awm_grpo/warmstart/sft.py" ]]; then
    log "warm start: awm_grpo/warmstart/sft.py is not in this checkout; training starts from $BASE"
  elif [[ "$SKIP_WARMSTART" == 1 || "$SKIP_MODEL" == 1 ]]; then
    log "warm start: skipped"
  elif [[ -f "$CPU_MODELS/warmstart/config.json" ]]; then
    log "warm start: $CPU_MODELS/warmstart is there (delete it to redo)"
  else
    # Without --model-path (or WARMSTART_BASE) the warm start picks its own from-scratch base model.
    WS_BASE="${WARMSTART_BASE:-$MODEL_PATH}"
    log "warm start: fine-tuning ${WS_BASE:-the small model the warm start builds} on the reference solutions of $SPLITS"
    "$PY" -m awm_grpo.warmstart ${WS_BASE:+--base "$WS_BASE"} --data "$SPLITS" --out "$CPU_MODELS/warmstart"
  fi
fi

NEXT="${RUN_HINT}bash awm_grpo/run_awm_grpo.sh"
[[ -n "$NUM_GPUS_ARG" && "$NUM_GPUS_ARG" != 0 ]] && NEXT="NUM_GPUS=$NUM_GPUS_ARG $NEXT"
log "done ($MODE). Next: $NEXT    |    $VENV/bin/awm demo    |    bash tests/run.sh"
