"""SLO admission through a real gateway to simulated workers: tiers resolve as configured,
overload queues batch work in the gateway while interactive requests keep their SLO, and a
request whose deadline passes in the queue gets a 503 before any upstream work."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import openai
import pytest

from bench.admission.fleet import scrape
from gateway.cli.localproc import (
    ProcessGroup,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)
from tests.fleet import Gateway

MODEL = "switchyard-sim"


def _sim(group: ProcessGroup, redis_url: str, workers: int, *flags: str) -> list[str]:
    base = free_port_range(workers)
    group.spawn(f"sim-{base}", python_module_argv(
        "backends.sim", "--workers", str(workers), "--base-port", str(base), "--tokenizer",
        "approx", "--redis-url", redis_url, "--heartbeat-interval-s", "0.2", *flags))
    urls = [f"http://127.0.0.1:{base + i}" for i in range(workers)]
    for url in urls:
        wait_http(url + "/health", group=group)
    return urls


@pytest.fixture(scope="module")
def small_fleet(tmp_path_factory: pytest.TempPathFactory) -> object:
    tmp = tmp_path_factory.mktemp("admission")
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp)
        # One slow worker with 4 batch slots: easy to overload.
        _sim(group, redis_url, 1, "--max-batch", "4", "--speed-factor", "0.25")
        yield Gateway(group, tmp, redis_url, backends=[])


def _chat(gateway: Gateway, key: str, tier: str | None = None, max_tokens: int = 4,
          timeout: float = 60) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if tier:
        headers["x-switchyard-tier"] = tier
    return httpx.post(gateway.url + "/v1/chat/completions", headers=headers, timeout=timeout,
                      json={"model": MODEL, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": "hello"}]})


@pytest.mark.parametrize(
    ("tenant_tier", "requested", "status", "code"),
    [
        pytest.param("interactive", "batch", 200, None, id="lower-tier-allowed"),
        pytest.param("standard", "standard", 200, None, id="same-tier"),
        pytest.param("batch", "interactive", 403, "tier_not_allowed", id="higher-tier-refused"),
        pytest.param("standard", "platinum", 400, "unknown_tier", id="unknown-tier"),
    ],
)
def test_tier_header_may_lower_but_never_raise(
    small_fleet: Gateway, tenant_tier: str, requested: str, status: int, code: str | None
) -> None:
    key = small_fleet.new_key(tier=tenant_tier)
    response = _chat(small_fleet, key, tier=requested)
    assert response.status_code == status, response.text
    if code:
        assert response.json()["error"]["code"] == code


async def _timed(client: httpx.AsyncClient, key: str, tier: str,
                 max_tokens: int) -> tuple[str, int, float]:
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", headers={
        "Authorization": f"Bearer {key}", "x-switchyard-tier": tier,
    }, json={"model": MODEL, "max_tokens": max_tokens, "stream": True,
             "messages": [{"role": "user", "content": "tell me a story"}]})
    return tier, response.status_code, time.monotonic() - started


def test_overload_keeps_interactive_fast_while_batch_waits(small_fleet: Gateway) -> None:
    batch_key = small_fleet.new_key(tier="batch")
    interactive_key = small_fleet.new_key(tier="interactive")

    async def run() -> list[tuple[str, int, float]]:
        async with httpx.AsyncClient(base_url=small_fleet.url, timeout=120) as client:
            # 40 short batch requests on 4 slots: ~10 rounds of ~0.3 s, slots free often.
            backlog = [asyncio.create_task(_timed(client, batch_key, "batch", 8))
                       for _ in range(40)]
            await asyncio.sleep(0.5)  # the worker's 4 slots are full, the rest queue here
            probes = []
            for _ in range(3):
                probes.append(await _timed(client, interactive_key, "interactive", 1))
                await asyncio.sleep(0.2)
            return probes + list(await asyncio.gather(*backlog))

    results = asyncio.run(run())
    interactive = [r for r in results if r[0] == "interactive"]
    batch = [r for r in results if r[0] == "batch"]
    assert all(status == 200 for _, status, _ in results), results
    # Interactive goes to the head of the gateway's queue: it waits for the next free slot,
    # not behind the queued batch requests, and keeps its 0.5 s SLO (TTFT < whole stream).
    slowest_batch_s = max(elapsed for _, _, elapsed in batch)
    assert slowest_batch_s > 2.0, results
    assert max(elapsed for _, _, elapsed in interactive) < 0.6, results


def test_deadline_in_queue_gives_503_before_upstream_work(tmp_path: Path) -> None:
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        urls = _sim(group, redis_url, 1, "--max-batch", "1", "--speed-factor", "0.25")
        gateway = Gateway(group, tmp_path, redis_url, backends=[], tiers=[
            {"name": "interactive", "priority": 0, "ttft_slo_ms": 500, "on_overload": "reject"},
            {"name": "standard", "priority": 1, "ttft_slo_ms": 300, "max_queue_wait_ms": 300},
        ], default_tier="standard")
        key = gateway.new_key()
        before = httpx.get(urls[0] + "/metrics").text

        async def run() -> list[int]:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
                async def one() -> int:
                    r = await client.post("/v1/chat/completions", headers={
                        "Authorization": f"Bearer {key}"}, json={
                        "model": MODEL, "max_tokens": 100,
                        "messages": [{"role": "user", "content": "x"}]})
                    return r.status_code
                return list(await asyncio.gather(*(one() for _ in range(6))))

        statuses = asyncio.run(run())
        assert 503 in statuses and 200 in statuses, statuses
        prompt_total = [line for line in httpx.get(urls[0] + "/metrics").text.splitlines()
                        if line.startswith("vllm:request_success_total")]
        finished = sum(float(line.rsplit(" ", 1)[1]) for line in prompt_total)
        assert finished == statuses.count(200), (before, prompt_total)  # no upstream work
        metrics = httpx.get(gateway.url + "/metrics").text
        assert 'switchyard_admission_rejections_total{reason="deadline"}' in metrics
        assert "switchyard_admission_queue_length" in metrics
        assert "switchyard_ttft_predictor_mape" in metrics


def test_the_openai_sdk_waiting_its_retry_after_comes_back_to_a_booked_place(
        tmp_path: Path) -> None:
    """A refusal's Retry-After is a booking: the official SDK, which waits it and sends the
    same request again, redeems its ticket and is served."""
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        _sim(group, redis_url, 1, "--max-batch", "1", "--speed-factor", "0.25")
        gateway = Gateway(group, tmp_path, redis_url, backends=[])
        batch_key = gateway.new_key(tier="batch")
        interactive_key = gateway.new_key(tier="interactive")
        deadline_s = time.monotonic() + 20
        while _chat(gateway, batch_key, max_tokens=1).status_code != 200:
            assert time.monotonic() < deadline_s, "the gateway never found the worker"
            time.sleep(0.2)

        async def run() -> tuple[int, str]:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
                # ~40 decode steps of ~32 ms: the one slot is busy for over a second.
                busy = asyncio.create_task(_timed(client, batch_key, "batch", 40))
                await asyncio.sleep(0.4)
                sdk = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=interactive_key,
                                         max_retries=3)
                answer = await sdk.chat.completions.create(
                    model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
                await sdk.close()
                _, status, _ = await busy
                return status, answer.choices[0].message.content or ""

        batch_status, content = asyncio.run(run())
        assert batch_status == 200 and content
        metrics = scrape(gateway.url + "/metrics")
        issued = metrics.get("switchyard_admission_retry_tickets_issued_total", 0.0)
        redeemed = metrics.get("switchyard_admission_retry_tickets_redeemed_total", 0.0)
        assert issued >= 1, metrics  # the SDK's first try was refused, its return booked
        assert redeemed >= 1, metrics  # and it came back when told, to the front of its tier
