"""A fleet for one soak run: a private redis-server, N simulated workers and one gateway.

``mode="own"``: the workers join by Redis heartbeat and publish KV events, and the gateway has
the workers' tokenizer configured, so every prompt is tokenized (the router's segment cache)
and matched on the exact index as well as character-hashed for the approximate one.
``mode="third-party"``: the same workers without Redis, listed in ``backends:`` with worker
discovery off (`bench.common.fleet_modes`); only the approximate index exists. Both keep the
gateway's other defaults (admission, usage, request log off). ``traced_dir`` starts the gateway
under tracemalloc (`bench.soak.traced_gateway`); ``gateway_env`` adds to the gateway's
environment (e.g. glibc's ``MALLOC_*`` tunables). Example::

    with soak_fleet("own", workdir, num_workers=4) as fleet:
        fleet.url, fleet.api_key, fleet.pids["gateway"]
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.fleet_modes import Mode, describe, static_backends, wait_for_backends
from gateway.cli.localfleet import SIM_MODEL, LocalFleet
from gateway.cli.localproc import python_module_argv

MODEL = SIM_MODEL


@dataclass(frozen=True, slots=True)
class SoakFleet:
    url: str  # the gateway's chat completions URL
    api_key: str
    admin_token: str
    pids: dict[str, int]  # redis, sim, gateway
    backends: dict[str, Any]  # `bench.common.fleet_modes.describe` of /admin/fleet
    workdir: Path


def gateway_settings(mode: Mode, worker_urls: list[str]) -> dict[str, Any]:
    if mode == "own":
        return {"backends": [], "routing": {"tokenizers": {MODEL: "approx"}},
                "log_level": "warning"}
    return {"backends": static_backends(worker_urls, MODEL),
            "routing": {"discover_workers": False}, "log_level": "warning"}


@contextmanager
def soak_fleet(mode: Mode, workdir: Path, num_workers: int = 4, *,
               speed_factor: float | None = None,
               traced_dir: Path | None = None,
               gateway_env: dict[str, str] | None = None) -> Iterator[SoakFleet]:
    """Start redis, the workers and the gateway; stop them all on exit."""
    with LocalFleet(workdir, grace_s=5) as fleet:
        flags = ["--speed-factor", str(speed_factor)] if speed_factor is not None else []
        is_own = mode == "own"
        worker_urls = fleet.start_sims(num_workers, model=MODEL, has_redis=is_own, flags=flags,
                                       health_timeout_s=None if is_own else 30)
        serve_argv = None
        env = dict(gateway_env or {})
        if traced_dir is not None:
            serve_argv = python_module_argv("bench.soak.traced_gateway", "serve")
            env["SOAK_TRACEMALLOC_DIR"] = str(traced_dir)
        gateway = fleet.start_gateway(gateway_settings(mode, worker_urls),
                                      serve_argv=serve_argv, ready_path="/healthz",
                                      ready_timeout_s=30, env=env)
        snapshot = wait_for_backends(gateway.url, fleet.admin_token, num_workers, mode,
                                     fleet.group)
        api_key = fleet.create_tenant_key(gateway.url, {"name": "soak", "models": [MODEL]},
                                          name="soak")
        yield SoakFleet(url=gateway.url + "/v1/chat/completions", api_key=api_key,
                        admin_token=fleet.admin_token, pids=fleet.pids(),
                        backends=describe(snapshot), workdir=workdir)
