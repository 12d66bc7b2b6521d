"""The gateway's view of the fleet: the backend registry and its per-backend books, membership
and metrics sync (heartbeats, third-party ``/metrics`` scrapes), health checks, KV-index sync
and the upstream HTTP client. Runs in the gateway process; imports no engine."""

import routing  # noqa: F401  (loads the compiled modules when built: routing.native)
