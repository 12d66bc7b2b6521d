"""Gateway replicas over one Redis share their /metrics scrapes of a listed engine: the engine
answers about one scrape a second in all, and every replica routes on figures as fresh as its
own scrape would give (``backends/fleet/scrape_share.py``)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli.localproc import ProcessGroup, start_redis
from tests.fleet import Engine, Gateway

WINDOW_S = 6.0


def _scrapes(engine: Engine) -> int:
    return int(engine.stats()["metrics_scrapes"])


def _load_ages(gateways: list[Gateway]) -> list[float]:
    ages = []
    for gateway in gateways:
        (backend,) = gateway.admin.get("/admin/fleet").json()["data"]
        assert backend["load_source"] == "metrics"
        ages.append(backend["load_age_s"])
    return ages


def test_replicas_scrape_a_listed_engine_once_a_second_in_all(tmp_path: Path) -> None:
    """With ``routing.share_scrapes``; without it each replica scrapes the engine itself, as
    ``tests/backends/fleet/test_scrape_share.py`` checks in process."""
    with ProcessGroup(log_dir=tmp_path) as group:
        redis_url = start_redis(group, tmp_path)
        engine = Engine(group, "vllm-0")
        gateways = [Gateway(group, tmp_path, redis_url, [engine.backend_config()],
                            routing={"share_scrapes": True}) for _ in range(2)]
        time.sleep(1.5)  # both past their first look and their random first tick
        before = _scrapes(engine)
        oldest = 0.0
        deadline = time.monotonic() + WINDOW_S
        while time.monotonic() < deadline:
            oldest = max(oldest, *_load_ages(gateways))
            time.sleep(0.25)
        num_scrapes = _scrapes(engine) - before
        # Two replicas, each scraping every second, would send 12 in 6 s; shared, 6, and a
        # tick that falls within a round trip of the other's adds one.
        assert 4 <= num_scrapes <= 9, num_scrapes
        # Each replica's figures are about a second old at most, read or heard: a tick every
        # second, which a busy 2-core machine delays by some tenths. A replica that neither
        # scraped nor heard would show figures as old as the 6 s window.
        assert oldest < 2.5, oldest
        # Each replica tells how it got them.
        counts = [_scrape_counts(gateway) for gateway in gateways]
        assert sum(c["read"] for c in counts) >= num_scrapes
        assert sum(c["heard"] for c in counts) >= 3


def _scrape_counts(gateway: Gateway) -> dict[str, float]:
    """``switchyard_fleet_scrapes_total`` by ``how``, from the gateway's /metrics."""
    found = {}
    for family in text_string_to_metric_families(httpx.get(gateway.url + "/metrics").text):
        if family.name == "switchyard_fleet_scrapes":
            found = {s.labels["how"]: s.value for s in family.samples
                     if s.name.endswith("_total")}
    assert set(found) == {"read", "heard"}, found
    return found
