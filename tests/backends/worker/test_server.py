"""The worker's HTTP server on the tiny random model: response shapes, OpenAI errors for bad
requests, queueing beyond the batch, client disconnects, /metrics, and the worker contract in a
real redis-server. A real aiohttp server on loopback, in a thread with its own event loop."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis as redis_sync

from backends.publisher import (
    WORKERS_ZSET,
    kv_snapshot_key,
    kv_stream_key,
    unpack_hashes,
    worker_key,
)
from backends.worker.metrics import Histogram
from gateway.cli.localproc import ProcessGroup, start_redis
from routing.prefix import token_block_hashes
from tests.backends.worker.checkpoints import TINY_CONFIG
from tests.backends.worker.server_support import (
    BLOCK_SIZE,
    MAX_CONTEXT,
    MODEL,
    ServerThread,
    tiny_engine,
)
from tests.fleet import wait_until

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    running = ServerThread(tiny_engine())
    yield running
    running.stop()


def _post(server: ServerThread, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(server.url + path, content=content, timeout=30,
                      headers={"Content-Type": "application/json"})


def _events(response: httpx.Response) -> list[Any]:
    lines = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [orjson.loads(line) for line in lines[:-1]]


def test_chat_and_completion_bodies(server: ServerThread) -> None:
    chat = _post(server, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 5, "ignore_eos": True}).json()
    assert chat["object"] == "chat.completion" and chat["model"] == MODEL
    (choice,) = chat["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    assert chat["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    text = _post(server, "/v1/completions", {"model": MODEL, "prompt": [10, 11, 12, 13, 14],
                                             "max_tokens": 3, "ignore_eos": True}).json()
    assert text["object"] == "text_completion" and isinstance(text["choices"][0]["text"], str)
    assert text["usage"]["prompt_tokens"] == 5 and text["usage"]["completion_tokens"] == 3


def test_embeddings_pool_the_models_hidden_states(server: ServerThread) -> None:
    hidden_size = TINY_CONFIG.hidden_size
    answer = _post(server, "/v1/embeddings", {
        "model": MODEL, "input": ["hello there", "hello there", "something else"]}).json()
    vectors = [d["embedding"] for d in answer["data"]]
    assert [len(v) for v in vectors] == [hidden_size] * 3
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-5) for v in vectors)
    assert vectors[0] == pytest.approx(vectors[1], abs=1e-6)  # the same text, the same vector
    assert vectors[0] != pytest.approx(vectors[2], abs=1e-3)
    assert answer["usage"]["prompt_tokens"] == 2 * len("hello there") + len("something else")
    ids = _post(server, "/v1/embeddings", {"model": MODEL, "input": [[10, 11, 12]],
                                           "dimensions": 8}).json()
    assert len(ids["data"][0]["embedding"]) == 8 and ids["usage"]["prompt_tokens"] == 3
    for body, param in [({"model": MODEL, "input": [10**9]}, "input"),
                        ({"model": MODEL, "input": "x", "dimensions": hidden_size + 1},
                         "dimensions"),
                        ({"model": "other", "input": "x"}, "model")]:
        response = _post(server, "/v1/embeddings", body)
        assert response.status_code in (400, 404), response.text
        assert response.json()["error"]["param"] == param
    # Generation goes on beside them.
    chat = _post(server, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "still here"}],
        "max_tokens": 2, "ignore_eos": True})
    assert chat.status_code == 200


def test_tokenize_and_detokenize_with_the_models_tokenizer(server: ServerThread) -> None:
    tokens = _post(server, "/tokenize", {"model": MODEL, "prompt": "hello"}).json()
    assert tokens["count"] == len("hello") and tokens["max_model_len"] == MAX_CONTEXT
    assert _post(server, "/detokenize", {"model": MODEL, "tokens": tokens["tokens"]}).json() \
        == {"prompt": "hello"}
    assert _post(server, "/tokenize", {"model": "other", "prompt": "x"}).status_code == 404


def test_streams_frame_like_openai(server: ServerThread) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "stream me"}],
            "max_tokens": 6, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    events = _events(_post(server, "/v1/chat/completions", body))
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    whole = _post(server, "/v1/chat/completions", {**body, "stream": False,
                                                   "stream_options": None}).json()
    assert streamed == whole["choices"][0]["message"]["content"]
    plain = _events(_post(server, "/v1/completions", {
        "model": MODEL, "prompt": "abc", "max_tokens": 2, "stream": True, "ignore_eos": True}))
    assert all("usage" not in e for e in plain)
    assert plain[-1]["choices"][0]["finish_reason"] == "length"


def test_a_seed_makes_sampling_reproducible(server: ServerThread) -> None:
    body = {"model": MODEL, "prompt": "seeded", "max_tokens": 12, "ignore_eos": True,
            "temperature": 1.0, "seed": 1234}
    texts = {_post(server, "/v1/completions", body).json()["choices"][0]["text"]
             for _ in range(2)}
    assert len(texts) == 1


CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
BAD_REQUESTS = [
    pytest.param(TEXT, b"{not json", 400, None, "not valid JSON", id="not-json"),
    pytest.param(TEXT, [1, 2], 400, None, "JSON object", id="not-an-object"),
    pytest.param(TEXT, {"prompt": "hi"}, 400, "model", "provide a 'model'", id="no-model"),
    pytest.param(TEXT, {"model": "gpt-4", "prompt": "hi"}, 404, "model", "'tiny'",
                 id="unknown-model"),
    pytest.param(TEXT, {"prompt": "hi", "temperature": 7}, 400, "temperature", "[0, 2]",
                 id="temperature-out-of-range"),
    pytest.param(TEXT, {"prompt": "hi", "temperature": "hot"}, 400, "temperature", "number",
                 id="temperature-not-a-number"),
    pytest.param(TEXT, {"prompt": "hi", "top_p": 0}, 400, "top_p", "(0, 1]", id="top-p-zero"),
    pytest.param(TEXT, {"prompt": "hi", "top_k": -5}, 400, "top_k", "integer >= 1",
                 id="top-k-negative"),
    pytest.param(TEXT, {"prompt": "hi", "seed": 1.5}, 400, "seed", "integer", id="seed-float"),
    pytest.param(TEXT, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", ">= 1",
                 id="max-tokens-zero"),
    pytest.param(TEXT, {"prompt": "hi", "max_tokens": "8"}, 400, "max_tokens", "integer",
                 id="max-tokens-string"),
    pytest.param(CHAT, {"messages": MESSAGES, "max_completion_tokens": -1}, 400,
                 "max_completion_tokens", ">= 1", id="max-completion-tokens-negative"),
    pytest.param(TEXT, {"prompt": "0123456789", "max_tokens": 5000}, 400, "prompt",
                 "maximum context length is 4096 tokens. However, you requested 5010 tokens "
                 "(10 in the prompt, 5000 in the completion)", id="longer-than-context"),
    pytest.param(CHAT, {"messages": [{"role": "user", "content": "x" * 4200}]}, 400,
                 "messages", "4200 in the messages", id="prompt-alone-longer-than-context"),
    pytest.param(TEXT, {"prompt": "hi", "n": 2}, 400, "n", "send n separate requests",
                 id="n-above-one"),
    pytest.param(TEXT, {"prompt": "hi", "stop": 5}, 400, "stop", "array of at most",
                 id="stop-not-text"),
    pytest.param(TEXT, {"prompt": "hi", "stop": [""]}, 400, "stop", "non-empty",
                 id="stop-empty-string"),
    pytest.param(TEXT, {"prompt": "hi", "stream": "yes"}, 400, "stream", "true or false",
                 id="stream-not-bool"),
    pytest.param(TEXT, {"prompt": "hi", "stream_options": {"include_usage": True}}, 400,
                 "stream_options", '"stream": true', id="stream-options-without-stream"),
    pytest.param(TEXT, {"prompt": 5}, 400, "prompt", "non-empty string", id="prompt-a-number"),
    pytest.param(TEXT, {"prompt": ""}, 400, "prompt", "non-empty string", id="prompt-empty"),
    pytest.param(TEXT, {"prompt": ["a", "b"]}, 400, "prompt", "one prompt per request",
                 id="prompt-batch"),
    pytest.param(TEXT, {"prompt": [5, 100000]}, 400, "prompt",
                 "outside this model's vocabulary (ids 0 to 95)", id="token-id-outside-vocab"),
    pytest.param(CHAT, {"messages": []}, 400, "messages", "non-empty array", id="no-messages"),
    pytest.param(CHAT, {"messages": [{"content": "x"}]}, 400, "messages", "string 'role'",
                 id="message-without-role"),
    pytest.param(CHAT, {"messages": MESSAGES, "logprobs": True}, 400, "logprobs",
                 "does not return logprobs", id="logprobs"),
    pytest.param(TEXT, {"prompt": "hi", "presence_penalty": 0.5}, 400, "presence_penalty",
                 "use 0 or omit it", id="presence-penalty"),
    pytest.param(CHAT, {"messages": MESSAGES, "response_format": {"type": "json_object"}},
                 400, "response_format", "plain text", id="json-mode"),
    pytest.param(CHAT, {"messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools",
                 "does not call tools", id="tools"),
]


@pytest.mark.parametrize(("path", "body", "status", "param", "message"), BAD_REQUESTS)
def test_bad_requests_get_an_openai_error_and_the_worker_carries_on(
        server: ServerThread, path: str, body: Any, status: int, param: str | None,
        message: str) -> None:
    if isinstance(body, dict) and param != "model":
        body = {"model": MODEL, **body}
    response = _post(server, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert message in error["message"], error["message"]
    after = _post(server, TEXT, {"model": MODEL, "prompt": "ok", "max_tokens": 2})
    assert after.status_code == 200


def test_work_beyond_the_batch_queues(server: ServerThread) -> None:
    body = {"model": MODEL, "prompt": "queue", "max_tokens": 150, "ignore_eos": True}
    before = server.metrics()["vllm:request_success_total"]
    waiting_seen: list[float] = []
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(_post, server, TEXT, body) for _ in range(6)]  # max_batch is 2
        while not all(f.done() for f in futures):
            waiting_seen.append(server.metrics()["vllm:num_requests_waiting"])
            time.sleep(0.01)
        assert [f.result().status_code for f in futures] == [200] * 6
    assert max(waiting_seen) >= 1
    assert server.metrics()["vllm:request_success_total"] >= before + 6


def test_a_client_disconnect_aborts_the_sequence_and_frees_its_kv(server: ServerThread) -> None:
    engine = server.engine.engine
    aborted = engine.num_requests_finished.get("abort", 0)
    body = {"model": MODEL, "prompt": "abcdefghij", "max_tokens": 3000, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", server.url + TEXT, json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert server.metrics()["vllm:num_requests_running"] == 1
    # The connection is closed: the handler is cancelled and aborts the sequence.
    assert wait_until(lambda: not engine.has_work, timeout_s=5)
    assert engine.num_requests_finished.get("abort", 0) == aborted + 1
    assert engine.block_manager.num_used_blocks == 0
    assert server.metrics()["vllm:num_requests_running"] == 0


def test_metrics_use_vllm_names(server: ServerThread) -> None:
    _post(server, TEXT, {"model": MODEL, "prompt": "metric", "max_tokens": 4,
                         "ignore_eos": True})
    page = httpx.get(server.url + "/metrics")
    assert page.headers["Content-Type"].startswith("text/plain")
    values = server.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                 "vllm:request_success_total"):
        assert name in values, name
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
                      "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"):
        assert f"# TYPE {histogram} histogram" in page.text
        assert values[histogram + "_count"] >= 1
        assert f'{histogram}_bucket{{model_name="tiny",le="+Inf"}}' in page.text
    assert values["vllm:generation_tokens_total"] >= 4
    assert values["vllm:prompt_tokens_total"] >= 6


def test_histogram_buckets_are_cumulative() -> None:
    histogram = Histogram("h", (0.1, 1.0))
    histogram.observe(0.1)
    histogram.observe(0.5, count=3)
    histogram.observe(7.0)
    assert histogram.lines('m="x"') == [
        "# TYPE h histogram", 'h_bucket{m="x",le="0.1"} 1', 'h_bucket{m="x",le="1.0"} 4',
        'h_bucket{m="x",le="+Inf"} 5', 'h_sum{m="x"} 8.6', 'h_count{m="x"} 5']


def test_health_models_profile_and_cache_reset(server: ServerThread) -> None:
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    (model,) = httpx.get(server.url + "/v1/models").json()["data"]
    assert model["id"] == MODEL and model["max_model_len"] == MAX_CONTEXT
    profile = httpx.get(server.url + "/worker/profile").json()
    assert profile["worker_id"] == "tiny-worker"
    assert profile["profile"]["block_size"] == BLOCK_SIZE
    assert profile["profile"]["device"] == "cpu"
    assert httpx.post(server.url + "/reset_prefix_cache").json() == {"reset": True}


def test_heartbeat_kv_events_and_withdrawal_in_redis(
        procs: ProcessGroup, tmp_path: Path) -> None:
    redis_url = start_redis(procs, tmp_path)  # its own: this worker must join no other fleet
    worker = ServerThread(tiny_engine(), redis_url=redis_url, worker_id="tiny-redis")
    client = redis_sync.Redis.from_url(redis_url)
    try:
        assert wait_until(lambda: client.exists(worker_key("tiny-redis")), timeout_s=5)
        doc = orjson.loads(client.get(worker_key("tiny-redis")))  # type: ignore[arg-type]
        assert doc["url"] == worker.url and doc["models"] == [MODEL]
        assert doc["profile"]["num_kv_blocks"] == MAX_CONTEXT // BLOCK_SIZE + 8
        assert doc["profile"]["block_size"] == BLOCK_SIZE
        assert doc["profile"]["max_context_tokens"] == MAX_CONTEXT
        assert set(doc["load"]) >= {"num_running", "num_waiting", "kv_usage",
                                    "num_queued_prefill_tokens", "num_prefix_kv_blocks"}
        assert client.zscore(WORKERS_ZSET, "tiny-redis") is not None
        prompt_ids = list(range(10, 26))  # four full blocks
        _post(worker, TEXT, {"model": MODEL, "prompt": prompt_ids, "max_tokens": 1})
        expected = token_block_hashes(prompt_ids, BLOCK_SIZE, MODEL)
        published: list[int] = []

        def stored() -> bool:
            entries = client.xrange(kv_stream_key("tiny-redis"))
            published[:] = [h for _, fields in entries if fields[b"type"] == b"stored"
                            for h in unpack_hashes(fields[b"h"])]
            return len(published) >= 3

        assert wait_until(stored, timeout_s=5)
        assert published[:3] == expected[:3]
        assert client.exists(kv_snapshot_key("tiny-redis"))
    finally:
        worker.stop()
    assert not client.exists(worker_key("tiny-redis"))  # withdrawn at shutdown
    assert client.zscore(WORKERS_ZSET, "tiny-redis") is None
