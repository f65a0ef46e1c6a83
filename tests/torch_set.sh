#!/usr/bin/env bash
# The trainer's torch use under a GPU install set's own torch, transformers and tokenizers (issue 35).
#
#   bash tests/torch_set.sh cu12    # DEFAULT_TESTS below: trainer, FSDP2, checkpoints, weight sync
#   bash tests/torch_set.sh cu12 --durations=10                  # options are added to that run
#   bash tests/torch_set.sh cu12 tests/slime/test_losses.py -q   # naming tests runs those instead
# CI runs the first line as the slow test tests/test_torch_set_cu12.py.
#
# Why: the CPU venv runs torch 2.13.0 and transformers 5.19.0, but a CUDA-12 GPU machine runs the
# cu12 set (requirements-gpu-cu12.txt: torch 2.9.1, transformers 5.3.0, tokenizers 0.22.2), and FSDP2,
# DTensor, torch.distributed.checkpoint, gloo groups and transformers' Qwen3 must work under both.
# PyPI's torch for linux x86_64 is the CUDA build; it runs on a CPU-only machine without a driver.
#
# The side venv is .cache/venv-<set>/ (git-ignored): the set's requirements file resolved by uv from
# PyPI, constrained by constraints-cpu.txt less the packages the set pins itself, so that it differs
# from the CPU venv only in the set's packages and what they pull (nvidia-*, triton). The project is
# installed with --no-deps. Built once (several GB to download the first time: docs/gpu.md),
# rebuilt when those files change; a lock keeps concurrent runs from clashing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

SETS=(cu12 cu13)
DEFAULT_TESTS=(
  tests/slime/test_torch_backend.py tests/slime/test_data_parallel.py tests/slime/test_train_group.py
  tests/slime/test_checkpoint_recovery.py tests/slime/test_checkpoint_sharded.py
  tests/slime/test_checkpoint_disk.py tests/slime/test_weight_sync.py tests/slime/test_weight_sync_sglang.py
  tests/slime/test_tiny_model.py tests/slime/test_losses.py tests/slime/test_inplace_load.py
)
# Runs whose subject is our code, not the set's torch: the disk-full run trains through slime.train twice
# (76 s under the cu12 set) to check our save refusal; its file-size-cap tests keep DCP's writes here.
DESELECTED=(
  tests/slime/test_checkpoint_disk.py::test_a_training_run_that_fills_its_disk_stops_with_the_sentence_then_resumes
)
die() { echo "tests/torch_set.sh: $*" >&2; exit 2; }

[[ $# -ge 1 ]] || die "name a GPU set: ${SETS[*]} (e.g. bash tests/torch_set.sh cu12)"
SET="$1"; shift
[[ " ${SETS[*]} " == *" $SET "* ]] || die "unknown set '$SET'; the sets are: ${SETS[*]}"
REQ="requirements-gpu-$SET.txt"
[[ -f "$REQ" ]] || die "$REQ is missing"
UV="$ROOT/.venv/bin/uv"
[[ -x "$UV" && -x "$ROOT/.venv/bin/python" ]] \
  || die "no CPU venv with uv: run 'bash setup.sh --deps-only' first (bash tests/run.sh does it)"

VENV="$ROOT/.cache/venv-$SET"
# The packages the set pins itself (torch, transformers, tokenizers): never taken from the CPU constraints.
mapfile -t OWN < <(grep -E '^[A-Za-z0-9]' "$REQ" | sed -E 's/[ =<>!~;\[].*//' | tr 'A-Z_' 'a-z-')
[[ ${#OWN[@]} -gt 0 ]] || die "$REQ pins no package of its own"
want="$(cat "${BASH_SOURCE[0]}" requirements-common.txt "$REQ" constraints-cpu.txt pyproject.toml \
  | sha256sum | cut -d' ' -f1)"

mkdir -p "$ROOT/.cache"
exec 9>"$ROOT/.cache/venv-$SET.lock"
flock -s 9  # runs share the venv; a rebuild waits for them (exclusive), so none loses it mid-run
if [[ "$(cat "$VENV/.stateful-rl-torch-set" 2>/dev/null)" != "$want" ]]; then
  flock -x 9
fi
if [[ "$(cat "$VENV/.stateful-rl-torch-set" 2>/dev/null)" != "$want" ]]; then
  echo "[torch_set] building $VENV from $REQ (PyPI; several GB the first time)"
  start=$SECONDS
  rm -rf "$VENV"
  "$UV" venv -q --python "$ROOT/.venv/bin/python" "$VENV"
  pattern="^($(IFS='|'; echo "${OWN[*]}"))=="
  grep -v -i -E "$pattern" constraints-cpu.txt > "$VENV/constraints.txt"
  if ! "$UV" pip install -q --python "$VENV/bin/python" -r "$REQ" -c "$VENV/constraints.txt"; then
    echo "tests/torch_set.sh: installing $REQ into $VENV failed (see uv's error above). It needs the" \
      "package index (PyPI) reachable and disk for a CUDA torch (docs/gpu.md gives the sizes); run it" \
      "again when both are there." >&2
    exit 1
  fi
  "$UV" pip install -q --python "$VENV/bin/python" --no-deps -e "$ROOT"
  # The venv must hold exactly the set's pins (a resolver surprise would make the leg test something else).
  for package in "${OWN[@]}"; do
    pin="$(grep -i -E "^${package}==" "$REQ" | sed -E 's/^[^=]+==([^ ;#]+).*/\1/')"
    got="$("$VENV/bin/python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" \
      "$package")"
    if [[ "${got%%+*}" != "$pin" ]]; then
      echo "tests/torch_set.sh: $package is $got in $VENV but $REQ pins $pin" >&2; exit 1
    fi
  done
  echo "$want" > "$VENV/.stateful-rl-torch-set"
  echo "[torch_set] built in $((SECONDS - start)) s"
fi
flock -s 9

"$VENV/bin/python" -c 'import torch, transformers, tokenizers
print(f"[torch_set] torch {torch.__version__} (CUDA build {torch.version.cuda}, cuda available: '\
'{torch.cuda.is_available()}), transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")'
named=0  # does an argument name a test file or folder (or a node id in one)?
for arg in "$@"; do [[ "$arg" != -* && -e "${arg%%::*}" ]] && named=1; done
if [[ $named == 0 ]]; then
  # Tests parametrized by sglang version (ids `sglang-<version>`, tests/sglang_real.py) run only for this
  # set's own sglang: the other set's sglang does not import with this set's transformers.
  own="$("$ROOT/.venv/bin/python" -c 'import sys; sys.path.insert(0, "tests")
from sglang_real import sglang_id; print(sglang_id(sys.argv[1]))' "$SET")"
  set -- "${DEFAULT_TESTS[@]}" "${DESELECTED[@]/#/--deselect=}" -m "slow or not slow" -k "$own or not sglang-" -q "$@"
fi
"$VENV/bin/python" -m pytest "$@"
