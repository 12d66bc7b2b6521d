"""Model aliases through a real gateway over mock engines: weighted targets (a canary), the
fallback when the picked model has no healthy backend, the served model in the response, and
tenants' allowed models checked against the public name."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.cli.localproc import ProcessGroup, free_port
from tests.fleet import Engine, Gateway

NUM_CANARY_REQUESTS = 2000
ALIASES = [
    {"name": "chat", "targets": [{"model": "m-v1", "weight": 3}, {"model": "m-v2", "weight": 1}],
     "fallbacks": ["m-small"]},
    {"name": "big", "fallbacks": ["m-small"]},  # m-big's only backend is down
    {"name": "gone", "targets": ["m-big"]},  # and nothing to fall back to
]


@pytest.fixture(scope="module")
def fleet(workdir: Path, redis_url: str) -> Iterator[tuple[Gateway, dict[str, Engine]]]:
    with ProcessGroup() as group:
        engines = {model: Engine(group, f"engine-{model}", models=(model,))
                   for model in ("m-v1", "m-v2", "m-small")}
        down = {"name": "engine-m-big", "url": f"http://127.0.0.1:{free_port()}",
                "models": ["m-big"]}  # nothing listens there
        gateway = Gateway(group, workdir, redis_url,
                          [e.backend_config() for e in engines.values()] + [down],
                          aliases=ALIASES, routing={"discover_workers": False})
        yield gateway, engines


def _chat(model: str) -> dict[str, object]:
    return {"model": model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "which model are you?"}]}


def test_a_canary_gets_its_weight_within_three_percent(
        fleet: tuple[Gateway, dict[str, Engine]]) -> None:
    gateway, engines = fleet
    key = gateway.new_key()
    for engine in engines.values():
        engine.reset()

    async def run() -> Counter[str]:
        served: Counter[str] = Counter()
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30, limits=limits,
                                     headers={"Authorization": f"Bearer {key}"}) as client:
            async def one(index: int) -> None:
                response = await client.post("/v1/chat/completions", json=_chat("chat"))
                assert response.status_code == 200, response.text
                assert response.json()["model"] == response.headers["x-switchyard-model"]
                served[response.headers["x-switchyard-model"]] += 1

            for start in range(0, NUM_CANARY_REQUESTS, 100):
                await asyncio.gather(*(one(i) for i in range(start, start + 100)))
        return served

    served = asyncio.run(run())
    assert set(served) == {"m-v1", "m-v2"}
    assert abs(served["m-v2"] / NUM_CANARY_REQUESTS - 0.25) <= 0.03, served
    # The engines saw their own model names: the gateway asked each for the model it serves.
    assert engines["m-v1"].stats()["requests_completed"] == served["m-v1"]
    assert engines["m-v2"].stats()["requests_completed"] == served["m-v2"]
    assert engines["m-v2"].stats()["last_body"]["model"] == "m-v2"


def test_the_fallback_serves_when_the_models_backends_are_down(
        fleet: tuple[Gateway, dict[str, Engine]]) -> None:
    gateway, _ = fleet
    key = gateway.new_key()
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="big", max_tokens=2, messages=[{"role": "user", "content": "hello"}])
    assert raw.headers["x-switchyard-model"] == "m-small"
    assert raw.parse().model == "m-small"
    stream = client.chat.completions.create(
        model="big", max_tokens=3, stream=True, messages=[{"role": "user", "content": "hi"}])
    chunks = list(stream)
    assert chunks and {chunk.model for chunk in chunks} == {"m-small"}
    metrics = httpx.get(gateway.url + "/metrics", timeout=5).text
    match = re.search(r'^switchyard_model_fallbacks_total\{fallback="m-small",model="big"\} '
                      r'(\S+)$', metrics, re.MULTILINE)
    assert match and float(match.group(1)) >= 2, metrics


def test_no_model_left_is_the_primarys_503(fleet: tuple[Gateway, dict[str, Engine]]) -> None:
    gateway, _ = fleet
    key = gateway.new_key()
    response = httpx.post(gateway.url + "/v1/chat/completions", json=_chat("gone"),
                          headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "no_healthy_backend" and "'m-big'" in error["message"]
    assert "Retry-After" in response.headers


def test_tenants_are_checked_against_the_public_name(
        fleet: tuple[Gateway, dict[str, Engine]]) -> None:
    gateway, _ = fleet
    alias_only = gateway.new_key(models=["chat"])
    served_only = gateway.new_key(models=["m-v1"])

    def post(key: str, model: str) -> httpx.Response:
        return httpx.post(gateway.url + "/v1/chat/completions", json=_chat(model),
                          headers={"Authorization": f"Bearer {key}"}, timeout=10)

    assert post(alias_only, "chat").status_code == 200
    refused = post(alias_only, "m-v1")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_allowed"
    assert post(served_only, "m-v1").status_code == 200
    assert post(served_only, "chat").status_code == 403
    models = httpx.get(gateway.url + "/v1/models", timeout=10,
                       headers={"Authorization": f"Bearer {alias_only}"}).json()
    assert [m["id"] for m in models["data"]] == ["chat"]


def test_models_lists_served_models_then_aliases(
        fleet: tuple[Gateway, dict[str, Engine]]) -> None:
    gateway, _ = fleet
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.new_key(),
                           max_retries=0)
    listed = [model.id for model in client.models.list()]
    assert sorted(listed[:4]) == ["m-big", "m-small", "m-v1", "m-v2"]
    assert listed[4:] == ["chat", "big", "gone"]
    assert client.models.retrieve("chat").id == "chat"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-alias")
