"""`switchyard worker` serving the real SmolLM2-135M-Instruct on CPU, driven by the official
openai SDK (sync and async), and joined by a real gateway through a real redis-server. Outputs
are short (max_tokens <= 8) to keep it quick."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import orjson
import pytest
import redis as redis_sync

from backends.publisher import kv_stream_key, unpack_hashes, worker_key
from backends.tokenizer import load_default_tokenizer
from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    python_module_argv,
    start_redis,
    wait_http,
)
from routing.prefix import token_block_hashes
from tests.fleet import Gateway, wait_until

MODEL = "SmolLM2-135M-Instruct"
WORKER_ID = "sdk-worker"
NUM_KV_BLOCKS = 128
SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in a few words."}


@dataclass(frozen=True)
class Worker:
    url: str
    redis_url: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def worker(procs: ProcessGroup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    redis_url = start_redis(procs, tmp_path_factory.mktemp("worker-redis"))  # its own fleet
    port = free_port()
    process = procs.spawn(f"worker-{port}", python_module_argv(
        "gateway", "worker", "--model", "smollm2", "--device", "cpu", "--port", str(port),
        "--num-threads", "1", "--kv-blocks", str(NUM_KV_BLOCKS), "--prefill-probe-tokens", "16",
        "--redis-url", redis_url, "--worker-id", WORKER_ID, "--heartbeat-interval-s", "0.2"))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", timeout_s=120, group=procs)
    yield Worker(url, redis_url)
    process.terminate()
    process.wait(timeout=20)


def _chat(question: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": question}]


def test_sync_chat_and_completions_stream_and_not(worker: Worker) -> None:
    client = worker.client()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                          max_tokens=8, temperature=0)
    assert "Paris" in (chat.choices[0].message.content or "")
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage is not None and 0 < chat.usage.completion_tokens <= 8
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0,  # type: ignore[arg-type]
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == chat.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    text = client.completions.create(model=MODEL, prompt="The capital of France is",
                                     max_tokens=4, temperature=0)
    assert text.choices[0].text.startswith(" Paris")
    assert text.choices[0].finish_reason == "length"
    assert text.usage is not None and text.usage.completion_tokens == 4
    pieces = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0,
        stream=True)]
    assert "".join(pieces) == text.choices[0].text
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_a_repeated_prompt_reports_cached_tokens(worker: Worker) -> None:
    client = worker.client()
    messages = _chat("Name three colours of the rainbow, please.")
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    # Every full 16-token block of the prompt but the last token's.
    assert cached == (second.usage.prompt_tokens - 1) // 16 * 16 > 0


def test_stop_strings_end_the_text_before_them(worker: Worker) -> None:
    client = worker.client()
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                     temperature=0).choices[0].text
    stop = full[3:6]  # inside " Paris"
    cut = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                    stop=[stop, "never appears"])
    assert cut.choices[0].text == full[:full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stop=stop, stream=True))
    assert streamed == cut.choices[0].text


def test_a_seed_reproduces_a_sampled_output(worker: Worker) -> None:
    client = worker.client()
    texts = {client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                       temperature=1.0, top_p=0.95, extra_body={"top_k": 50},
                                       seed=42).choices[0].text for _ in range(2)}
    assert len(texts) == 1


async def test_async_client_chat_and_completions(worker: Worker) -> None:
    client = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL, messages=_chat("Capital of Italy?"), max_tokens=6, temperature=0,
        stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 6
    text = await client.completions.create(model=MODEL, prompt=[504, 3575, 282], max_tokens=3,
                                           temperature=0)
    assert text.usage is not None and text.usage.prompt_tokens == 3
    await client.close()


def test_sdk_errors(worker: Worker) -> None:
    client = worker.client()
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4o", prompt="hi", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="text-only") as bad:
        client.chat.completions.create(model=MODEL, max_tokens=1, messages=[
            {"role": "user", "content": [{"type": "image_url",
                                          "image_url": {"url": "http://example.com/a.png"}}]}])
    assert bad.value.param == "messages"
    with pytest.raises(openai.BadRequestError, match="maximum context length is 8192") as long:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=9000)
    assert long.value.code == "context_length_exceeded"


def test_heartbeat_and_kv_events_use_the_gateway_hashes(worker: Worker) -> None:
    client = redis_sync.Redis.from_url(worker.redis_url)
    assert wait_until(lambda: client.exists(worker_key(WORKER_ID)), timeout_s=5)
    doc = orjson.loads(client.get(worker_key(WORKER_ID)))  # type: ignore[arg-type]
    assert doc["url"] == worker.url and doc["models"] == [MODEL]
    profile = doc["profile"]
    assert profile["device"] == "cpu" and profile["num_kv_blocks"] == NUM_KV_BLOCKS
    assert profile["block_size"] == 16 and profile["max_context_tokens"] == 8192
    assert profile["prefill_tokens_per_s"] > 0 and profile["kv_dtype"] == "float32"
    messages = _chat("Which planet is the largest? " * 4)
    worker.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    ids = load_default_tokenizer().encode_chat(messages)
    expected = set(token_block_hashes(ids, 16, MODEL))
    published: set[int] = set()

    def stored() -> bool:
        for _, fields in client.xrange(kv_stream_key(WORKER_ID)):
            if fields[b"type"] == b"stored":
                published.update(unpack_hashes(fields[b"h"]))
        return expected <= published

    assert len(expected) >= 3
    assert wait_until(stored, timeout_s=5), (len(expected), len(expected & published))


def test_a_gateway_joins_the_worker_by_heartbeat_and_routes_to_it(
        worker: Worker, procs: ProcessGroup, tmp_path: Path) -> None:
    gateway = Gateway(procs, tmp_path, worker.redis_url, backends=[],
                      routing={"tokenizers": {MODEL: "real"}})
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.new_key(),
                           max_retries=0)
    responses: list[openai.APIResponse] = []  # type: ignore[type-arg]

    def routed() -> bool:
        try:
            responses.append(client.chat.completions.with_raw_response.create(
                model=MODEL, messages=_chat("Capital of Spain?"), max_tokens=4, temperature=0))
        except openai.APIStatusError:
            return False  # not discovered yet
        return True

    assert wait_until(routed, timeout_s=10, interval_s=0.2)
    assert responses[-1].headers["x-switchyard-backend"] == WORKER_ID
    assert responses[-1].parse().choices[0].message.content
    fleet = gateway.admin.get("/admin/fleet").json()["data"]
    (backend,) = fleet
    assert backend["name"] == WORKER_ID and backend["source"] == "heartbeat"
    assert backend["profile"]["device"] == {"value": "cpu", "source": "heartbeat"}
    assert backend["profile"]["num_kv_blocks"]["value"] == NUM_KV_BLOCKS
    assert httpx.get(gateway.url + "/metrics").status_code == 200
