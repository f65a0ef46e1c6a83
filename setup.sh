#!/usr/bin/env bash
# One-command setup for Stateful-RL.
#
#   bash setup.sh            # CPU: .venv with the pinned CPU set + the embedded default
#   bash setup.sh --help
#
# The CPU path keeps torch==2.13.0 (CPU build): the installer is pointed at a CPU wheel
# source first, so nothing can pull a multi-GB CUDA torch. GPU machines add the `gpu` extra.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
MODE="auto"
SKIP_DEPS=0

usage() {
  cat <<'USAGE'
Usage: bash setup.sh [options]

Creates a virtual environment, installs the project and prepares the embedded default
(bundled AWM-style scenarios, their template databases).

Options:
  --venv DIR        virtual environment to create or reuse (default: ./.venv)
  --python PY       interpreter used to create it (default: python3; needs 3.11+)
  --cpu | --gpu     force the CPU or GPU install (default: GPU if nvidia-smi sees a GPU)
  --skip-deps       do not install packages; only (re)install the project and prepare data
  -h, --help        show this help

Environment: UV_CACHE_DIR (uv's cache), TORCH_CPU_INDEX (CPU wheel index used when no
local CPU wheel directory exists; default https://download.pytorch.org/whl/cpu).
USAGE
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --venv) VENV="$(realpath -m "$2")"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --cpu) MODE="cpu"; shift ;;
    --gpu) MODE="gpu"; shift ;;
    --skip-deps) SKIP_DEPS=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ "$MODE" == "auto" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then MODE="gpu"; else MODE="cpu"; fi
fi
log() { printf '[setup] %s\n' "$*"; }

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
"$VENV/bin/uv" pip install --python "$PY" -q --no-deps -e "$ROOT" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"

if [[ "$MODE" == "cpu" ]]; then
  "$PY" - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"expected the CPU torch 2.13.0, found {torch.__version__}"
assert not torch.cuda.is_available() or True
PY
fi

log "preparing the embedded default (bundled scenarios -> template databases)"
"$VENV/bin/awm" env reset_db --quiet

cat "$ROOT/requirements-cpu.txt" "$ROOT/constraints-cpu.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d" " -f1 > "$VENV/.stateful-rl-setup"
log "done ($MODE). Next: $VENV/bin/awm demo    |    bash tests/run.sh"
