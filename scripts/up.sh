#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the local fleet: a private Redis, local engines and the
# gateway on http://127.0.0.1:8080, with a demo tenant and key printed. Ctrl-C stops it all.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/switchyard up "$@"
