"""/v1/embeddings through a real gateway over mock engines, with the official openai SDK: the
vectors, base64 and dimensions, errors, the tenant's token quota, load spread over backends,
and an alias."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from backends.embeddings import hashed_embedding
from gateway.cli.localproc import ProcessGroup, free_port
from tests.fleet import Engine, Gateway

MODEL = "embed-mock"


@pytest.fixture(scope="module")
def fleet(workdir: Path, redis_url: str) -> Iterator[tuple[Gateway, list[Engine]]]:
    with ProcessGroup() as group:
        engines = [Engine(group, f"embed-{i}", models=(MODEL,)) for i in range(2)]
        down = {"name": "embed-down", "url": f"http://127.0.0.1:{free_port()}",
                "models": [MODEL]}  # nothing listens there
        gateway = Gateway(group, workdir, redis_url,
                          [e.backend_config() for e in engines] + [down],
                          aliases=[{"name": "embed", "targets": [MODEL]}],
                          routing={"discover_workers": False})
        yield gateway, engines


def test_the_openai_sdk_gets_the_engines_vectors(fleet: tuple[Gateway, list[Engine]]) -> None:
    gateway, _ = fleet
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.new_key(),
                           max_retries=0)
    # The SDK asks for base64 unless told otherwise, and decodes it.
    result = client.embeddings.create(model=MODEL, input=["first text", "second text"])
    assert [d.index for d in result.data] == [0, 1]
    assert result.data[0].embedding == pytest.approx(hashed_embedding("first text", 64),
                                                     rel=1e-6)
    assert result.usage.prompt_tokens > 0
    as_floats = client.embeddings.create(model=MODEL, input="first text",
                                         encoding_format="float", dimensions=8)
    vector = as_floats.data[0].embedding
    assert len(vector) == 8
    assert math.isclose(math.fsum(v * v for v in vector), 1.0, rel_tol=1e-6)
    aliased = client.embeddings.with_raw_response.create(model="embed", input="first text")
    assert aliased.headers["x-switchyard-model"] == MODEL
    assert aliased.parse().data[0].embedding == result.data[0].embedding


@pytest.mark.parametrize(("body", "status", "param"), [
    pytest.param({"model": MODEL}, 400, "input", id="no-input"),
    pytest.param({"model": MODEL, "input": ["a", 1]}, 400, "input[1]", id="mixed-input"),
    pytest.param({"model": MODEL, "input": "a", "encoding_format": "hex"}, 400,
                 "encoding_format", id="bad-format"),
    pytest.param({"model": "no-such-model", "input": "a"}, 404, "model", id="unknown-model"),
    pytest.param({"model": MODEL, "input": "a", "dimensions": 65}, 400, "dimensions",
                 id="too-many-dimensions"),
])
def test_bad_requests_get_openai_errors(fleet: tuple[Gateway, list[Engine]],
                                        body: dict[str, object], status: int,
                                        param: str) -> None:
    gateway, _ = fleet
    response = httpx.post(gateway.url + "/v1/embeddings", json=body, timeout=10,
                          headers={"Authorization": f"Bearer {gateway.new_key()}"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def test_a_tenants_token_quota_counts_the_input(fleet: tuple[Gateway, list[Engine]]) -> None:
    gateway, _ = fleet
    key = gateway.new_key(limits={"tokens_per_minute": 400})
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.RateLimitError) as info:
        client.embeddings.create(model=MODEL, input="many words " * 200)  # ~550 tokens
    assert "limit 400, requested 550" in info.value.message
    text = "word " * 120  # ~150 tokens each: the third is over the minute's 400
    client.embeddings.create(model=MODEL, input=text)
    client.embeddings.create(model=MODEL, input=[text[:300], text[300:]])
    with pytest.raises(openai.RateLimitError) as info:
        client.embeddings.create(model=MODEL, input=text)
    assert info.value.response.headers.get("Retry-After")
    assert "tokens per minute" in info.value.message


def test_requests_spread_over_the_healthy_backends(fleet: tuple[Gateway, list[Engine]]) -> None:
    gateway, engines = fleet
    key = gateway.new_key()
    for engine in engines:
        engine.reset()

    async def run() -> None:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30,
                                     headers={"Authorization": f"Bearer {key}"}) as client:
            async def one(index: int) -> None:
                response = await client.post("/v1/embeddings", json={
                    "model": MODEL, "input": f"text number {index}"})
                assert response.status_code == 200, response.text

            await asyncio.gather(*(one(i) for i in range(60)))

    asyncio.run(run())
    served = [engine.stats()["requests_completed"] for engine in engines]
    assert sum(served) == 60
    assert min(served) >= 10, served  # both take a share; the down one takes none
