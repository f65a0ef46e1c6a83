#!/usr/bin/env bash
# The test command: installs the packages if needed (or if the requirements changed), then runs pytest.
#   bash tests/run.sh              # the fast suite (what CI runs)
#   bash tests/run.sh -m slow      # the slow end-to-end runs
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The same files, in the same order, as the stamp setup.sh writes when its packages are in place.
want="$(cat requirements-common.txt requirements-cpu.txt requirements-gpu-cu12.txt requirements-gpu-cu13.txt \
  constraints-cpu.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [[ ! -x .venv/bin/python ]] || [[ "$(cat .venv/.stateful-rl-setup 2>/dev/null)" != "$want" ]]; then
  bash setup.sh --deps-only  # packages only: the tests build their own models and data
fi
exec .venv/bin/python -m pytest "$@"
