#!/usr/bin/env bash
# Set up (scripts/setup.sh, with the PyTorch worker's dependencies: its tests need torch) and
# run the whole suite: ruff, mypy, then pytest. Tests start their own redis-server instances and
# servers on loopback; nothing outside the machine is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
SWITCHYARD_WORKER=1 scripts/setup.sh
echo "== ruff" && .venv/bin/ruff check .
echo "== mypy" && .venv/bin/mypy
echo "== pytest" && .venv/bin/pytest "$@"
