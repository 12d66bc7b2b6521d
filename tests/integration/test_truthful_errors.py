"""Errors that tell the truth, through a real gateway to real simulated workers: a request no
backend could ever hold is a 400 saying why, at once and without upstream work; one the fleet
could serve, but not now, is a 503 with Retry-After. One case per filter that can refuse."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from gateway.cli.localproc import (
    ProcessGroup,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)
from tests.fleet import Gateway, wait_until

MODEL = "switchyard-sim"
CONTEXT = 1024  # the workers' max_context_tokens


def _start_sims(group: ProcessGroup, workers: int) -> tuple[Any, list[str]]:
    base = free_port_range(workers)
    proc = group.spawn(f"sim-{base}", python_module_argv(
        "backends.sim", "--workers", str(workers), "--base-port", str(base), "--model", MODEL,
        "--tokenizer", "approx", "--max-context-tokens", str(CONTEXT)))
    urls = [f"http://127.0.0.1:{base + i}" for i in range(workers)]
    for url in urls:
        wait_http(url + "/health", group=group)
    return proc, urls


def _chat(gateway: Gateway, key: str, words: int, max_tokens: int) -> httpx.Response:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": "word " * words}]})


def _served(urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        for line in httpx.get(url + "/metrics").text.splitlines():
            if line.startswith("vllm:request_success_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass(frozen=True)
class Fleet:
    sims: Any  # the one process running both workers
    urls: list[str]
    exact: Gateway  # knows the model's tokenizer
    estimated: Gateway  # does not


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("truthful-errors")
    with ProcessGroup(log_dir=workdir) as group:
        redis_url = start_redis(group, workdir)
        proc, urls = _start_sims(group, 2)
        backends = [{"name": f"sim-{i}", "url": url, "models": [MODEL]}
                    for i, url in enumerate(urls)]
        # The model's tokenizer is configured: prompt sizes are exact at the gateway.
        exact = Gateway(group, workdir, redis_url, backends,
                        routing={"tokenizers": {MODEL: "approx"}, "discover_workers": False})
        # None configured: sizes are estimated from characters, and the engines judge.
        estimated = Gateway(group, workdir, redis_url, backends,
                            routing={"discover_workers": False})
        yield Fleet(proc, urls, exact, estimated)


@pytest.mark.parametrize(("words", "max_tokens", "why"), [
    pytest.param(2000, 16, "the prompt alone", id="prompt-over-the-context"),
    pytest.param(200, 2000, "prompt and max_tokens", id="output-over-the-context"),
])
def test_what_no_backend_can_hold_is_a_400_at_once(fleet: Fleet, words: int, max_tokens: int,
                                                   why: str) -> None:
    urls, exact = fleet.urls, fleet.exact
    before = _served(urls)
    answer = _chat(exact, exact.new_key(), words, max_tokens)
    assert answer.status_code == 400, (why, answer.text)
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "shorten the prompt or lower max_tokens" in error["message"]
    assert f"the most one holds: {CONTEXT:,} tokens" in error["message"]
    assert "Retry-After" not in answer.headers
    assert _served(urls) == before  # decided at the gateway: no upstream work


def test_an_estimated_size_lets_the_engine_answer(fleet: Fleet) -> None:
    estimated = fleet.estimated
    answer = _chat(estimated, estimated.new_key(), 2000, 16)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert f"maximum context length is {CONTEXT} tokens" in error["message"]  # the engine's


def test_the_openai_sdk_gets_the_400_without_retrying(fleet: Fleet) -> None:
    exact = fleet.exact
    client = openai.OpenAI(base_url=exact.url + "/v1", api_key=exact.new_key(), max_retries=2)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, max_tokens=16, messages=[
            {"role": "user", "content": "word " * 2000}])
    assert refused.value.code == "context_length_exceeded"
    assert refused.value.response.headers.get("x-request-id")


def test_a_fleet_that_could_serve_but_not_now_is_a_503(fleet: Fleet) -> None:
    """Last, as it stops the workers: a request that fits, with every worker down."""
    proc, exact = fleet.sims, fleet.exact
    key = exact.new_key()
    assert _chat(exact, key, 50, 8).status_code == 200
    proc.send_signal(signal.SIGSTOP)  # accepts connections, answers nothing: health fails
    try:
        def all_down() -> bool:
            data = exact.admin.get("/admin/fleet").json()["data"]
            return not any(b["is_healthy"] for b in data)

        assert wait_until(all_down, timeout_s=10)
        answer = _chat(exact, key, 50, 8)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "no_healthy_backend"
        assert int(answer.headers["Retry-After"]) >= 1
        # Too large stays a 400 while they are down: it is not a matter of time.
        assert _chat(exact, key, 2000, 16).status_code == 400
    finally:
        proc.send_signal(signal.SIGCONT)
