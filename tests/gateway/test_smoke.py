"""The shared fleet comes up and answers through the gateway."""

from __future__ import annotations

import httpx

from tests.fleet import Gateway


def test_chat_completion_through_gateway(gateway: Gateway, api_key: str) -> None:
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": "switchyard-mock", "messages": [{"role": "user", "content": "a b c"}],
              "max_tokens": 4},
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
    assert response.headers["x-request-id"].startswith("req-")
