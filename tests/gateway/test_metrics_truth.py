"""``/metrics`` tells what happened: the status each request got as sent (a body too large is
413, a client that leaves is 499), the model label of every model the fleet serves (workers
that joined after the start included), and refused authentications counted by cause."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from backends.fleet.prom import parse_samples
from gateway.cli.localproc import ProcessGroup
from tests.fleet import MODEL, Engine, Gateway, wait_until


def scrape(gateway: Gateway) -> dict[str, float]:
    return parse_samples(httpx.get(gateway.url + "/metrics", timeout=5).text)


def requests_total(gateway: Gateway, model: str, status: int) -> float:
    key = (f'switchyard_requests_total{{model="{model}",route="chat",status="{status}"}}')
    return scrape(gateway).get(key, 0.0)


def test_statuses_are_counted_as_sent(procs: ProcessGroup, workdir: Path, redis_url: str,
                                      engines: list[Engine]) -> None:
    gateway = Gateway(procs, workdir, redis_url, [engines[0].backend_config()],
                      max_body_bytes=2048)
    key = gateway.new_key()
    headers = {"Authorization": f"Bearer {key}"}
    too_big = httpx.post(gateway.url + "/v1/chat/completions", headers=headers, json={
        "model": MODEL, "messages": [{"role": "user", "content": "x" * 4096}]}, timeout=10)
    assert too_big.status_code == 413
    assert requests_total(gateway, MODEL, 413) + requests_total(gateway, "other", 413) == 1
    assert requests_total(gateway, MODEL, 500) + requests_total(gateway, "other", 500) == 0

    async def leave_mid_stream() -> None:
        async with httpx.AsyncClient(timeout=10) as client, client.stream(
                "POST", gateway.url + "/v1/chat/completions", headers=headers, json={
                    "model": MODEL, "stream": True, "max_tokens": 50,
                    "messages": [{"role": "user", "content": "hi"}],
                    "mock": {"token_delay_ms": 50}}) as response:
            assert response.status_code == 200
            async for _ in response.aiter_bytes():
                break  # the first chunk, then away

    asyncio.run(leave_mid_stream())
    assert wait_until(lambda: requests_total(gateway, MODEL, 499) == 1, timeout_s=5), scrape(
        gateway)
    assert requests_total(gateway, MODEL, 500) == 0
    assert scrape(gateway)["switchyard_client_disconnects_total"] == 1


def test_refused_keys_are_counted_by_cause(procs: ProcessGroup, workdir: Path, redis_url: str,
                                           engines: list[Engine]) -> None:
    gateway = Gateway(procs, workdir, redis_url, [engines[0].backend_config()])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, {"Authorization": "Bearer sk-not-a-key"}):
        answer = httpx.post(gateway.url + "/v1/chat/completions", headers=headers, json=body,
                            timeout=10)
        assert answer.status_code == 401
    failures = {k: v for k, v in scrape(gateway).items()
                if k.startswith("switchyard_auth_failures_total")}
    assert sum(failures.values()) == 2 and len(failures) == 2, failures
