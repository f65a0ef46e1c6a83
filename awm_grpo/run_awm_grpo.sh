#!/usr/bin/env bash
# Train an agent with multi-turn GRPO on AWM environments (the awm_grpo recipe).
#
#   bash awm_grpo/run_awm_grpo.sh                          # auto-profile (CPU here: the embedded default)
#   NUM_ROLLOUT=3 bash awm_grpo/run_awm_grpo.sh            # any knob by its environment variable
#   bash awm_grpo/run_awm_grpo.sh --config my.yaml --set training.lr=2e-6 --dry-run
#   bash awm_grpo/run_awm_grpo.sh -- --rollout-top-p 0.95  # flags after -- go to slime.train
#
# Precedence: --set/--profile > environment variables > --config file > auto-profile. No .env is read.
# This wrapper only picks the interpreter; awm_grpo/launch/job.py does the work (--help lists its flags).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
if [[ ! -x "$PY" ]]; then
  echo "run_awm_grpo.sh: $PY not found: run \`bash setup.sh\` first (or set PYTHON=/path/to/python)" >&2
  exit 2
fi
export PYTHONPATH="$ROOT:$ROOT/agent-world-model${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m awm_grpo.launch "$@"
