#!/usr/bin/env bash
# One-command setup for Stateful-RL and its awm_grpo recipe.
#
#   bash setup.sh              # everything: venv + packages, then the model, data and splits of this machine
#   bash setup.sh --deps-only  # packages and the project only (what tests/run.sh uses)
#   bash setup.sh --bfcl       # only the BFCL harness's own venv, .venv-bfcl (python -m awm_grpo.eval_bfcl)
#   bash setup.sh --help
#
# CPU machines (no GPU): the pinned CPU set (torch==2.13.0, CPU build: the installer is pointed at a
# CPU wheel source first, so nothing can pull a multi-GB CUDA torch), then the embedded default:
# bundled scenarios and their template DBs, a small Qwen3-architecture model built locally, the
# splits, and a warm start of that model on the reference solutions when awm_grpo/warmstart/sft.py exists.
# GPU machines: the `gpu` extra, Qwen3-4B and AWM-1K downloaded with huggingface_hub, template DBs
# built, splits written. The trainer reads Hugging Face checkpoints directly: there is no conversion.
# Nothing is written to a .env file: the run script reads only its config, flags and environment.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV_DIR:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
MODE="auto"
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
  --python PY            interpreter used to create it (default: python3; needs 3.11+)
  --cpu | --gpu          force the CPU or GPU install (default: GPU if nvidia-smi sees a GPU)
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
    --cpu) MODE="cpu"; shift ;;
    --gpu) MODE="gpu"; shift ;;
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

if [[ -n "$NUM_GPUS_ARG" ]]; then
  [[ "$NUM_GPUS_ARG" =~ ^[0-9]+$ ]] || { echo "setup.sh: --num-gpus takes a number, got '$NUM_GPUS_ARG'" >&2; exit 2; }
  if [[ "$NUM_GPUS_ARG" == 0 ]]; then MODE="cpu"; else MODE="gpu"; fi
fi
if [[ -n "$MODEL_PATH" && ! -f "$MODEL_PATH/config.json" ]]; then
  echo "setup.sh: --model-path $MODEL_PATH is not a Hugging Face model folder (no config.json)" >&2; exit 2
fi
if [[ "$MODE" == "auto" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then MODE="gpu"; else MODE="cpu"; fi
fi
log() { printf '[setup] %s\n' "$*"; }

# ---- BFCL's own venv (--bfcl): bfcl-eval pins numpy 1.26.4 and many SDKs, so never the main venv ----
if [[ "$BFCL" == 1 ]]; then
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

# ---- 1. packages ---------------------------------------------------------------------------------
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
  # A local directory of CPU wheels (this platform's /opt/wheels) beats any index.
  if compgen -G "/opt/wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
    TORCH_SRC=(--find-links /opt/wheels)
  else
    TORCH_SRC=(--extra-index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" --index-strategy unsafe-best-match)
  fi
  if [[ "$MODE" == "cpu" ]]; then
    log "installing the pinned CPU set (requirements-cpu.txt)"
    "${UV[@]}" "${TORCH_SRC[@]}" -r "$ROOT/requirements-cpu.txt" -c "$ROOT/constraints-cpu.txt"
  else
    log "installing the GPU set (requirements-cpu.txt minus CPU torch, plus the gpu extra)"
    grep -v '^torch==' "$ROOT/requirements-cpu.txt" > "$VENV/requirements-gpu.txt"
    "${UV[@]}" -r "$VENV/requirements-gpu.txt" -e "$ROOT[gpu]"
  fi
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
fi

# The packages are in place: tests/run.sh compares this stamp with the requirement files.
cat "$ROOT/requirements-cpu.txt" "$ROOT/constraints-cpu.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d" " -f1 > "$VENV/.stateful-rl-setup"
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
