"""``--fleet sim:N`` (or ``mock:N``): a private redis-server, N engines and a gateway, started
for one run and stopped after it, so one command is a whole experiment.

The engines are simulated GPU workers (``backends.sim``, publishing to the private Redis) or
zero-delay mock engines; the gateway gets a fresh admin token, through which the run makes its
tenants and keys. Logs go to ``workdir``. Example::

    with local_fleet("sim", 4, workdir, tokenizer="approx") as fleet:
        fleet.url, fleet.admin_token, fleet.worker_metrics
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gateway.cli import localfleet
from gateway.cli.localfleet import MOCK_MODEL, SIM_MODEL

MODELS = {"sim": SIM_MODEL, "mock": MOCK_MODEL}


@dataclass(frozen=True, slots=True)
class LocalFleet:
    """A running fleet: the gateway's ``/v1`` URL, its admin token, the engines' /metrics."""

    url: str
    admin_token: str
    model: str
    worker_metrics: tuple[str, ...]
    pids: dict[str, int]


@contextmanager
def local_fleet(kind: str, count: int, workdir: Path, tokenizer: str = "approx"
                ) -> Iterator[LocalFleet]:
    """Start redis, ``count`` engines of ``kind`` and a gateway; stop them all on exit."""
    model = MODELS[kind]
    with localfleet.LocalFleet(workdir, grace_s=5) as fleet:
        if kind == "sim":
            engine_urls = fleet.start_sims(count, model=model, tokenizer=tokenizer)
        else:
            engine_urls = fleet.start_mocks([f"mock-{i}" for i in range(count)], model=model,
                                            health_timeout_s=60)
        gateway = fleet.start_gateway({
            "backends": [{"name": f"{kind}-{i}", "url": url, "models": [model]}
                         for i, url in enumerate(engine_urls)],
            "log_level": "warning",
        }, ready_timeout_s=30)
        yield LocalFleet(url=gateway.url + "/v1", admin_token=fleet.admin_token, model=model,
                         worker_metrics=tuple(url + "/metrics" for url in engine_urls),
                         pids={name: child.pid for name, child in fleet.group.children})
