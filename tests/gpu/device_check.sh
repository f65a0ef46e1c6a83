#!/usr/bin/env bash
# One-GPU device check (issue 20): what of the GPU path runs on a machine with torch, transformers and
# CUDA but no network, no Ray, no SGLang and no repo .venv. Uses the machine's python; under 8 minutes.
#
#   bash tests/gpu/device_check.sh            # from the repository root; figures on stdout
#   PYTHON=/path/to/python bash tests/gpu/device_check.sh
#   bash tests/gpu/device_check.sh --device cpu --small   # arguments go to device_check.py (the CPU test)
#
# 1. tests/gpu/device_check.py: env, FSDP2 + bf16 step, offload/onload, the weight stream over a
#    one-rank NCCL update group, a bf16 export + checkpoint save/restore of a Qwen3-4B-shaped model,
#    two NCCL ranks on one GPU, a Qwen3-4B-shaped model's weight sync by CUDA IPC in bf16 into another
#    process (JSON lines, one a check).
# 2. tests/slime/test_gpu.py (+ test_megatron_backend.py where megatron-core imports), if pytest is there.
set -u
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD:$PWD/agent-world-model${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
status=0

echo "== device_check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
"$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'gpu', torch.cuda.is_available())"

echo "== figures (tests/gpu/device_check.py)"
timeout 330 "$PY" tests/gpu/device_check.py "$@" || { echo "device_check.py failed (rc $?)"; status=1; }

echo "== tests/slime/test_gpu.py"
if "$PY" -c "import pytest" 2>/dev/null; then
    tests=(tests/slime/test_gpu.py)
    "$PY" -c "import megatron.core" 2>/dev/null && tests+=(tests/slime/test_megatron_backend.py)
    timeout 150 "$PY" -m pytest "${tests[@]}" -q -p no:cacheprovider -o addopts="" 2>&1 | tail -15
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
    echo "pytest is not installed for $PY: skipped (pip install pytest, or PYTHON=... a python that has it)"
fi
echo "== device_check done: status $status"
exit $status
