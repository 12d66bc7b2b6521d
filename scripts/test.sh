#!/usr/bin/env bash
# Set up (scripts/setup.sh, with the PyTorch worker's dependencies: its tests need torch) and
# run the whole suite: ruff, mypy, then pytest. Tests start their own redis-server instances and
# servers on loopback; nothing outside the machine is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
SWITCHYARD_WORKER=1 scripts/setup.sh
echo "== ruff" && .venv/bin/ruff check .
echo "== mypy" && .venv/bin/mypy
# One worker per core, each taking whole test files (their module fixtures start once); the
# slowest tests are listed at the end, to keep the suite inside its 15 minutes on 2 cores.
echo "== pytest" && .venv/bin/pytest -n auto --dist loadfile --durations=20 "$@"
