#!/usr/bin/env bash
# Toy single-turn GRPO on the tiny offline Qwen3, CPU only (about 2-4 minutes on 2 cores).
#   bash examples/toy_single_turn/run.sh [WORK_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="${1:-/tmp/slime-toy}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled PYTHONPATH="$ROOT/examples/toy_single_turn:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m slime.models.tiny --out "$WORK/model"
"$PY" "$ROOT/examples/toy_single_turn/make_data.py" "$WORK/data"
cd "$ROOT"
"$PY" -m slime.train \
  --hf-checkpoint "$WORK/model" \
  --prompt-data "$WORK/data/train.jsonl" --input-key input --label-key label \
  --apply-chat-template --rollout-shuffle \
  --rollout-batch-size 8 --n-samples-per-prompt 8 --num-rollout 20 \
  --rollout-max-response-len 8 --rollout-temperature 1.0 \
  --custom-rm-path reward.reward \
  --lr 2e-2 --calculate-per-token-loss \
  --eval-prompt-data toy "$WORK/data/eval.jsonl" --eval-interval 10 --n-samples-per-eval-prompt 4 \
  --save "$WORK/ckpt" --load "$WORK/ckpt" --save-interval 10 \
  --use-tensorboard
