#!/bin/sh
# One-shot start-up step of the compose fleet (service demo-init): wait until the gateway is
# ready, create the demo tenant (once) and a fresh demo key with the real admin CLI
# (`switchyard tenants` / `switchyard keys`, i.e. the admin API), and print the key.
#
# Reads SWITCHYARD_URL and SWITCHYARD_ADMIN_TOKEN (as the CLI does), and for the banner
# DEMO_MODEL and DEMO_PUBLIC_URL; DEMO_READY_TIMEOUT_S bounds the wait (default 180 s).
# Safe to run again: the tenant is reused, and every run prints a new key (keys are shown once;
# older ones stay valid until `switchyard keys revoke`).
set -eu
: "${SWITCHYARD_URL:?set SWITCHYARD_URL to the gateway, e.g. http://nginx:8080}"
: "${SWITCHYARD_ADMIN_TOKEN:?set SWITCHYARD_ADMIN_TOKEN to the gateway admin token}"
model="${DEMO_MODEL:-switchyard-sim}"
public_url="${DEMO_PUBLIC_URL:-$SWITCHYARD_URL}"

echo "demo-init: waiting for $SWITCHYARD_URL/readyz (Redis up and a worker joined) ..."
python - "$SWITCHYARD_URL/readyz" "${DEMO_READY_TIMEOUT_S:-180}" <<'PY'
import sys, time, urllib.error, urllib.request

url, timeout_s = sys.argv[1], float(sys.argv[2])
deadline, last = time.monotonic() + timeout_s, "no answer"
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                sys.exit(0)
    except urllib.error.HTTPError as exc:
        last = f"HTTP {exc.code}"
    except OSError as exc:
        last = str(exc)
    time.sleep(0.5)
sys.exit(f"demo-init: {url} not ready after {timeout_s:g} s ({last})")
PY

if switchyard tenants get demo >/dev/null 2>&1; then
  echo "demo-init: tenant 'demo' already exists"
else
  switchyard tenants create --id demo --name "Demo tenant" --tier standard --models '*' >/dev/null
  echo "demo-init: created tenant 'demo'"
fi
created="$(switchyard keys create --tenant demo --name "demo-$(date -u +%Y%m%dT%H%M%SZ)")"
key="$(printf '%s' "$created" | python -c 'import json, sys; print(json.load(sys.stdin)["key"])')"

cat <<BANNER

==============================================================================================
switchyard is up.   demo tenant: demo   demo key: $key

  curl $public_url/v1/chat/completions \\
    -H "Authorization: Bearer $key" -H "Content-Type: application/json" \\
    -d '{"model": "$model", "messages": [{"role": "user", "content": "hello there"}]}'

Traces: http://localhost:16686 (Jaeger)   Dashboards: http://localhost:3000 (Grafana)
==============================================================================================
BANNER
