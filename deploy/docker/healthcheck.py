"""Container health check: exit 0 when HEALTHCHECK_URL answers 200 within 2 s, else 1.

The images run it as their HEALTHCHECK (``python /opt/healthcheck.py``), so no curl or wget is
needed in them. The default is the gateway's liveness endpoint; worker and simulator containers
set HEALTHCHECK_URL to their own ``/health`` (a simulated worker listens on its advertised
host name, not on loopback).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8080/healthz"


def main() -> int:
    url = os.environ.get("HEALTHCHECK_URL") or DEFAULT_URL
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (URL from the image)
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"health check {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
