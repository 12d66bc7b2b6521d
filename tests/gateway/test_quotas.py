"""Tenant quotas through the gateway: OpenAI's rate-limit headers, 429s with the real wait,
concurrency leases released on completion and on client disconnect."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from gateway.admit import output_tokens_from
from tests.fleet import Gateway, wait_until

MODEL = "switchyard-mock"


def _post(gateway: Gateway, key: str, **body: object) -> httpx.Response:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hello there"}], **body})


def test_requests_per_minute_then_429_with_the_real_wait(gateway: Gateway) -> None:
    key = gateway.new_key(limits={"requests_per_minute": 3})
    responses = [_post(gateway, key) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert responses[0].headers["x-ratelimit-limit-requests"] == "3"
    assert [r.headers["x-ratelimit-remaining-requests"] for r in responses] == ["2", "1", "0"]
    refused = _post(gateway, key)
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "rate_limit_error"
    # One request per 20 s comes back: the wait is the time to that, not a whole minute.
    assert 15 <= int(refused.headers["retry-after"]) <= 21
    assert 15_000 <= int(refused.headers["retry-after-ms"]) <= 20_500
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])


def test_tokens_per_minute_reserve_then_settle_to_actual(gateway: Gateway) -> None:
    key = gateway.new_key(limits={"tokens_per_minute": 1000})
    first = _post(gateway, key, max_tokens=600)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-tokens"] == "1000"
    # The 600 reserved output tokens were settled to the 600 actually generated plus the
    # prompt, so a second 600-token reservation does not fit.
    assert _post(gateway, key, max_tokens=600).status_code == 429
    small = gateway.new_key(limits={"tokens_per_minute": 1000})
    assert _post(gateway, small, max_tokens=5).status_code == 200
    remaining = int(_post(gateway, small, max_tokens=5).headers["x-ratelimit-remaining-tokens"])
    assert remaining > 950  # the unused reservation was refunded


def test_concurrency_lease_released_on_completion_and_on_disconnect(gateway: Gateway) -> None:
    key = gateway.new_key(limits={"max_concurrent": 1})
    slow = {"stream": True, "max_tokens": 40, "mock": {"token_delay_ms": 50}}
    started = threading.Event()

    def hold_stream() -> None:
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", timeout=30,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": MODEL,
                                "messages": [{"role": "user", "content": "a b"}], **slow}) as r:
            for _ in r.iter_lines():
                started.set()

    holder = threading.Thread(target=hold_stream)
    holder.start()
    assert started.wait(10)
    refused = _post(gateway, key)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    holder.join()
    assert wait_until(lambda: _post(gateway, key).status_code == 200, timeout_s=3)

    # A client that goes away mid-stream gives its slot back at once.
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL,
                            "messages": [{"role": "user", "content": "a b"}], **slow}) as r:
        next(r.iter_lines())
    began = time.monotonic()
    assert wait_until(lambda: _post(gateway, key).status_code == 200, timeout_s=3)
    assert time.monotonic() - began < 2.0


def test_a_shared_request_id_does_not_share_a_concurrency_slot(gateway: Gateway) -> None:
    """Two requests with one client x-request-id: the second is still the second in flight."""
    key = gateway.new_key(limits={"max_concurrent": 1})
    headers = {"Authorization": f"Bearer {key}", "x-request-id": "same-id-for-all"}
    started = threading.Event()

    def hold_stream() -> None:
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", timeout=30,
                          headers=headers, json={
                              "model": MODEL, "messages": [{"role": "user", "content": "a b"}],
                              "stream": True, "max_tokens": 40,
                              "mock": {"token_delay_ms": 50}}) as r:
            for _ in r.iter_lines():
                started.set()

    holder = threading.Thread(target=hold_stream)
    holder.start()
    assert started.wait(10)
    second = httpx.post(gateway.url + "/v1/chat/completions", headers=headers, timeout=30,
                        json={"model": MODEL, "messages": [{"role": "user", "content": "c"}]})
    holder.join()
    assert second.status_code == 429, second.text
    assert second.headers["x-request-id"] == "same-id-for-all"  # still the client's label
    assert wait_until(lambda: _post(gateway, key).status_code == 200, timeout_s=3)


def test_unlimited_tenants_get_no_rate_limit_headers(gateway: Gateway, api_key: str) -> None:
    response = _post(gateway, api_key)
    assert response.status_code == 200
    assert "x-ratelimit-limit-requests" not in response.headers


@pytest.mark.parametrize(("tail", "num_events", "expected"), [
    pytest.param(b'{"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\ndata: [DONE]\n\n', 8, 4,
                 id="usage-relayed"),
    pytest.param(b'"finish_reason":"length"}]}\n\ndata: [DONE]\n\n', 7, 4, id="role-4-finish-done"),
    pytest.param(b'"finish_reason":"length"}]}\n\n', 6, 4, id="cut-before-done"),
    pytest.param(b"", 1, 0, id="role-only"),
])
def test_output_tokens_of_a_stream(tail: bytes, num_events: int, expected: int) -> None:
    """Usage when the engine sent one; otherwise one token per event, less role/finish/[DONE]."""
    assert output_tokens_from(tail, num_events) == expected
