#!/usr/bin/env bash
# The test command for switchyard in front of real vLLM (not part of CI; see docs/vllm.md):
# runs setup if needed, starts a 2-server fleet (scripts/vllm/fleet.py) on a free gateway port,
# runs scripts/vllm/check.py against it with the openai SDK, then stops the fleet.
# Exits non-zero on any failure. Every wait is bounded; the whole run takes a few minutes.
#   scripts/vllm/check.sh
#   scripts/vllm/check.sh --record tests/backends/fixtures   # also save real vLLM answers
set -euo pipefail
cd "$(dirname "$0")/../.."

START_TIMEOUT_S=${START_TIMEOUT_S:-900}   # first start compiles the model (~1.5 min) per server
CHECK_TIMEOUT_S=${CHECK_TIMEOUT_S:-300}

timeout 3600 scripts/vllm/setup.sh

workdir=$(mktemp -d -t switchyard-vllm-check-XXXXXX)
state="$workdir/state.json"
.venv/bin/python scripts/vllm/fleet.py 2 --port 0 --state-file "$state" \
    >"$workdir/fleet.out" 2>&1 &
fleet_pid=$!

stop_fleet() {
    if kill -0 "$fleet_pid" 2>/dev/null; then
        kill -TERM "$fleet_pid" 2>/dev/null || true
        # fleet.py stops its children (SIGTERM, then SIGKILL after 10 s each) before it exits.
        for _ in $(seq 1 120); do kill -0 "$fleet_pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$fleet_pid" 2>/dev/null || true
    fi
    wait "$fleet_pid" 2>/dev/null || true
}
trap stop_fleet EXIT

echo "vllm check: starting 2 vLLM servers and the gateway (output in $workdir/fleet.out)"
started=$SECONDS
until [[ -f "$state" ]]; do
    if ! kill -0 "$fleet_pid" 2>/dev/null; then
        echo "vllm check: FAIL: the fleet exited before it was ready:" >&2
        tail -n 40 "$workdir/fleet.out" >&2
        exit 1
    fi
    if (( SECONDS - started > START_TIMEOUT_S )); then
        echo "vllm check: FAIL: the fleet was not ready after ${START_TIMEOUT_S} s:" >&2
        tail -n 40 "$workdir/fleet.out" >&2
        exit 1
    fi
    sleep 1
done
echo "vllm check: fleet ready after $(( SECONDS - started )) s"

status=0
timeout "$CHECK_TIMEOUT_S" .venv/bin/python scripts/vllm/check.py --state-file "$state" "$@" \
    || status=$?
if (( status == 124 )); then
    echo "vllm check: FAIL: the checks did not finish in ${CHECK_TIMEOUT_S} s" >&2
fi
if (( status != 0 )); then
    logs=$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["workdir"])' \
        "$state")
    echo "vllm check: FAIL (each process's log is in $logs)" >&2
fi
exit "$status"
