"""The simulated worker over HTTP: the official openai SDK, modelled timings, KV limits, the
worker contract in Redis, and OpenAI errors for bad input. Real processes on loopback."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import redis as redis_sync

from backends.embeddings import HASHED_DIMS, hashed_embedding
from backends.publisher import (
    WORKERS_ZSET,
    kv_snapshot_key,
    kv_stream_key,
    unpack_hashes,
    worker_key,
)
from gateway.cli.localproc import ProcessGroup, start_redis
from routing.prefix import token_block_hashes
from tests.backends.sim.support import MODEL, SimFleet


@pytest.fixture(scope="module")
def fleet(procs: ProcessGroup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    yield SimFleet(procs, tmp_path_factory.mktemp("sim"), num_workers=1)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_openai_sdk_chat_and_completions_stream_and_not(fleet: SimFleet) -> None:
    client = _client(fleet.urls[0])
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about trains."}],
        max_tokens=5,
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert chat.usage.prompt_tokens > 10  # the chat template's default system prompt counts
    text = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)
    assert text.usage is not None and text.usage.completion_tokens == 3
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True},
    ))
    contents = [c.choices[0].delta.content for c in chunks
                if c.choices and c.choices[0].delta.content]
    assert len(contents) == 4
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert client.models.list().data[0].id == MODEL


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        pytest.param({"model": MODEL, "prompt": "hi", "max_tokens": 9000}, 400, "prompt",
                     id="longer-than-context"),
        pytest.param({"model": MODEL, "prompt": "hi", "temperature": 7}, 400, "temperature",
                     id="temperature-out-of-range"),
        pytest.param({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens",
                     id="max-tokens-zero"),
        pytest.param({"model": MODEL, "prompt": "hi", "n": 3}, 400, "n", id="n-above-one"),
        pytest.param({"model": MODEL, "prompt": 5}, 400, "prompt", id="prompt-not-text"),
        pytest.param({"model": MODEL, "prompt": [1, -1]}, 400, "prompt", id="token-id-negative"),
        pytest.param({"model": MODEL, "prompt": [2**32]}, 400, "prompt", id="token-id-huge"),
        pytest.param({"model": MODEL, "prompt": [10**9]}, 400, "prompt",
                     id="token-id-outside-the-vocabulary"),
        pytest.param({"model": "other", "prompt": "hi"}, 404, "model", id="unknown-model"),
    ],
)
def test_bad_input_gets_an_openai_error(
    fleet: SimFleet, body: dict[str, Any], status: int, param: str
) -> None:
    response = httpx.post(fleet.urls[0] + "/v1/completions", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def _ttft_s(url: str, prompt_ids: list[int], max_tokens: int = 1) -> tuple[float, int]:
    started = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json={
        "model": MODEL, "prompt": prompt_ids, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True},
    }, timeout=30) as response:
        ttft = None
        cached = -1
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if ttft is None and chunk["choices"]:
                ttft = time.perf_counter() - started
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert ttft is not None
    return ttft, cached


def test_a_cached_prefix_lowers_ttft_by_the_modelled_amount(
    procs: ProcessGroup, tmp_path: Path
) -> None:
    b_s_per_token = 100e-6
    fleet = SimFleet(procs, tmp_path, latency={
        "a_s": 0.005, "b_s_per_token": b_s_per_token, "c_s_per_seq": 0.0,
        "d_s_per_kv_token": 0.0,
    }, max_num_batched_tokens=8192)
    # A first request pays one-off costs (connection, first-use paths); an unrelated prompt
    # of the same length takes them, so only the cache differs between cold and warm.
    _ttft_s(fleet.urls[0], [7000 + (i % 5000) for i in range(2048)])
    # A busy machine only ever adds to a modelled wait, so the fastest of three cold and of
    # three warm requests (three distinct prompts) is the modelled time plus the least noise.
    colds: list[float] = []
    warms: list[float] = []
    for base in (20_000, 30_000, 40_000):
        prompt = [base + (i % 5000) for i in range(2048)]
        cold, cold_cached = _ttft_s(fleet.urls[0], prompt)
        warm, warm_cached = _ttft_s(fleet.urls[0], prompt)
        assert cold_cached == 0
        assert warm_cached == 2032  # all full blocks but the last, which is recomputed
        colds.append(cold)
        warms.append(warm)
    modelled_drop_s = b_s_per_token * 2032
    drop_s = min(colds) - min(warms)
    assert abs(drop_s - modelled_drop_s) <= 0.10 * modelled_drop_s, (colds, warms)


def test_the_request_log_splits_each_requests_ttft_into_queue_and_prefill(
        procs: ProcessGroup, tmp_path: Path) -> None:
    log = tmp_path / "sim-requests.jsonl"
    b_s_per_token = 100e-6
    fleet = SimFleet(procs, tmp_path, num_workers=2, request_log=log, latency={
        "a_s": 0.005, "b_s_per_token": b_s_per_token, "c_s_per_seq": 0.0,
        "d_s_per_kv_token": 0.0,
    })
    prompt = [3000 + i for i in range(1000)]
    for request_id in ("first", "again"):
        httpx.post(fleet.urls[1] + "/v1/completions", headers={"x-request-id": request_id},
                   json={"model": MODEL, "prompt": prompt, "max_tokens": 3},
                   timeout=30).raise_for_status()
    httpx.post(fleet.urls[0] + "/v1/completions", json={
        "model": MODEL, "prompt": prompt[:100], "max_tokens": 1}, timeout=30).raise_for_status()
    lines = [orjson.loads(line) for line in log.read_text().splitlines()]
    first, again, anonymous = lines
    assert (first["request_id"], again["request_id"], anonymous["request_id"]) == (
        "first", "again", None)
    assert first["worker"] == again["worker"] != anonymous["worker"]
    assert (first["prompt_tokens"], first["cached_tokens"], first["output_tokens"]) == (
        1000, 0, 3)
    assert again["cached_tokens"] == 992  # all full blocks but the last
    for line in lines:
        assert line["ttft_s"] == pytest.approx(line["queue_s"] + line["prefill_s"], abs=2e-6)
    # The prefill took at least its modelled time, and the cache took most of it off.
    assert first["prefill_s"] >= 0.005 + b_s_per_token * 1000 - 1e-6 > again["prefill_s"]


def test_kv_capacity_limits_concurrency(procs: ProcessGroup, tmp_path: Path) -> None:
    # 40 blocks of 16 tokens; each prompt needs 25, so only one request runs at a time.
    fleet = SimFleet(procs, tmp_path, num_kv_blocks=40, latency={
        "a_s": 0.01, "b_s_per_token": 0.0, "c_s_per_seq": 0.0, "d_s_per_kv_token": 0.0,
    })
    url = fleet.urls[0]
    finished_at: dict[str, float] = {}

    def run(name: str, offset: int) -> None:
        httpx.post(url + "/v1/completions", json={
            "model": MODEL, "prompt": [offset + i for i in range(400)], "max_tokens": 40,
        }, timeout=30).raise_for_status()
        finished_at[name] = time.perf_counter()

    first = threading.Thread(target=run, args=("first", 1000))
    first.start()
    time.sleep(0.1)
    second = threading.Thread(target=run, args=("second", 5000))
    second.start()
    time.sleep(0.1)
    metrics = fleet.metrics()
    assert metrics["vllm:num_requests_running"] == 1
    assert metrics["vllm:num_requests_waiting"] == 1
    first.join()
    second.join()
    # The second waited for the first's ~41 steps of 10 ms, then ran its own ~41 steps.
    assert finished_at["second"] - finished_at["first"] > 0.3


def test_heartbeat_and_kv_events_in_redis(procs: ProcessGroup, tmp_path: Path) -> None:
    redis_url = start_redis(procs, tmp_path)  # its own: these workers must join no other fleet
    fleet = SimFleet(procs, tmp_path, num_workers=2, redis_url=redis_url,
                     heartbeat_interval_s=0.2)
    worker_ids = [f"sim-{fleet.base_port}", f"sim-{fleet.base_port + 1}"]
    client = redis_sync.Redis.from_url(redis_url)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(client.exists(worker_key(w)) for w in worker_ids):
        time.sleep(0.05)
    for index, worker_id in enumerate(worker_ids):
        doc = orjson.loads(client.get(worker_key(worker_id)))  # type: ignore[arg-type]
        assert doc["url"] == fleet.urls[index] and doc["models"] == [MODEL]
        assert doc["profile"]["block_size"] == 16 and doc["profile"]["num_kv_blocks"] > 0
        assert set(doc["load"]) >= {"num_running", "num_waiting", "kv_usage",
                                    "num_queued_prefill_tokens"}
        assert 0 < client.pttl(worker_key(worker_id)) <= doc["ttl_ms"]
        assert client.zscore(WORKERS_ZSET, worker_id) is not None
    httpx.post(fleet.urls[0] + "/v1/completions", json={
        "model": MODEL, "prompt": list(range(100, 164)), "max_tokens": 2,
    }).raise_for_status()
    deadline = time.monotonic() + 5
    stored: list[bytes] = []
    while time.monotonic() < deadline and not stored:
        entries = client.xrange(kv_stream_key(worker_ids[0]))
        stored = [fields[b"h"] for _, fields in entries if fields[b"type"] == b"stored"]
        time.sleep(0.05)
    expected = token_block_hashes(list(range(100, 164)), 16, MODEL)
    published = [h for packed in stored for h in unpack_hashes(packed)]
    assert published[:3] == expected[:3]
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not client.exists(kv_snapshot_key(worker_ids[0])):
        time.sleep(0.1)
    assert client.exists(kv_snapshot_key(worker_ids[0]))


def test_embeddings_with_the_openai_sdk(fleet: SimFleet) -> None:
    client = _client(fleet.urls[0])
    result = client.embeddings.create(model=MODEL, input=["Tell me about trains.", "hi"])
    assert [d.index for d in result.data] == [0, 1]
    assert result.data[0].embedding == pytest.approx(
        hashed_embedding("Tell me about trains.", HASHED_DIMS), rel=1e-6)
    assert result.usage.prompt_tokens > 2  # counted by the real tokenizer
    short = client.embeddings.create(model=MODEL, input=[1, 2, 3], dimensions=4,
                                     encoding_format="float")
    assert len(short.data[0].embedding) == 4 and short.usage.prompt_tokens == 3
    response = httpx.post(fleet.urls[0] + "/v1/embeddings", json={"model": MODEL, "input": []})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"


def test_tokenize_and_detokenize_like_vllm(fleet: SimFleet) -> None:
    url = fleet.urls[0]
    tokens = httpx.post(url + "/tokenize", json={"model": MODEL, "prompt": "Hello trains"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] > 0
    chat = httpx.post(url + "/tokenize", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hello trains"}]}).json()
    assert chat["count"] > tokens["count"]  # the template's turns and default system prompt
    text = httpx.post(url + "/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]})
    assert text.json() == {"prompt": "Hello trains"}
    refused = httpx.post(url + "/detokenize", json={"model": MODEL, "tokens": [-1]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens"
