"""bench.soak's figures: the cache gauges read from a real gateway scrape, growth and fill."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest
from aiohttp import web

from bench.soak.drive import CACHE_GAUGES, DriveResult, Sample, cache_gauges
from bench.soak.report import cache_bounds, run_figures

SCRAPE = b"""# HELP switchyard_router_segment_cache_bytes Bytes the segment cache holds.
# TYPE switchyard_router_segment_cache_bytes gauge
switchyard_router_segment_cache_bytes 1.6e+07
# TYPE switchyard_router_approx_index_blocks gauge
switchyard_router_approx_index_blocks{replica="a"} 1000.0
switchyard_router_approx_index_blocks{replica="b"} 24.0
switchyard_router_approx_index_blocks_other 5.0
"""


async def test_the_gauges_come_from_a_scrape_summed_over_labels() -> None:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=SCRAPE, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            gauges = await cache_gauges(session, f"http://127.0.0.1:{port}/metrics")
            missing = await cache_gauges(session, f"http://127.0.0.1:{port}/nothing")
    finally:
        await runner.cleanup()
    assert gauges == {CACHE_GAUGES[0]: 1.6e7, CACHE_GAUGES[1]: 1024.0}
    assert missing == {}


async def test_a_refused_scrape_reads_as_no_gauges() -> None:
    async with aiohttp.ClientSession() as session:
        assert await asyncio.wait_for(cache_gauges(session, "http://127.0.0.1:9/metrics"), 10) == {}


def sample(t_s: float, rss_mib: float, segment_bytes: float) -> Sample:
    return Sample(t_s=t_s, rss_kib={"gateway": int(rss_mib * 1024)}, num_sent=0, num_ok=0,
                  num_failed=0, num_in_flight=0,
                  gauges={CACHE_GAUGES[0]: segment_bytes, CACHE_GAUGES[1]: 10.0})


def test_growth_is_from_the_warm_up_and_fill_is_against_the_bound() -> None:
    bound = cache_bounds()[CACHE_GAUGES[0]]
    result = DriveResult(samples=[sample(0, 80, 0), sample(60, 150, 0.5 * bound),
                                  sample(120, 200, 0.97 * bound), sample(180, 210, bound)])
    figures = run_figures(result, warmup_s=120, duration_s=180)
    assert figures["growth_pct"] == pytest.approx(5.0)
    assert figures["is_met"] is True
    segment = figures["caches"][CACHE_GAUGES[0]]
    assert segment["full_t_s"] == 120 and segment["at_warmup"] == pytest.approx(0.97 * bound)
    approx = figures["caches"][CACHE_GAUGES[1]]
    assert approx["full_t_s"] is None and approx["max"] == 10.0


def test_a_run_no_longer_than_its_warm_up_measures_nothing() -> None:
    result = DriveResult(samples=[sample(0, 80, 0), sample(5, 90, 0)])
    figures = run_figures(result, warmup_s=60, duration_s=5)
    assert math.isnan(figures["growth_pct"]) and figures["is_met"] is None
