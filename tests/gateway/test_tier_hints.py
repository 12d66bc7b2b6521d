"""Priority and SLO hints through a real gateway: the tier a request ran in, as the gateway's
per-tier end-to-end histogram counts it."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.fleet import MODEL, Gateway


def _count(gateway: Gateway, tier: str) -> float:
    text = httpx.get(gateway.url + "/metrics", timeout=5).text
    match = re.search(rf'^switchyard_e2e_duration_seconds_count\{{tier="{tier}"\}} (\S+)$',
                      text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize(("headers", "body", "tier"), [
    pytest.param({"x-smg-priority": "bulk"}, {}, "batch", id="smg-bulk"),
    pytest.param({"x-gateway-inference-objective": "batch"}, {}, "batch", id="llm-d-objective"),
    pytest.param({"x-llm-d-slo-ttft-ms": "60000"}, {}, "batch", id="llm-d-ttft-slo"),
    pytest.param({"x-slo-ttft-ms": "30000"}, {}, "standard", id="llm-d-ttft-slo-under-batch"),
    pytest.param({}, {"service_tier": "flex"}, "batch", id="openai-flex"),
    pytest.param({"x-llm-d-inference-objective": "interactive"}, {}, "standard",
                 id="above-the-tenant-is-clamped"),
    pytest.param({"x-smg-priority": "bulk", "x-switchyard-tier": "standard"}, {}, "standard",
                 id="switchyard-header-wins"),
])
def test_a_hint_sets_the_tier_within_the_tenants(gateway: Gateway, api_key: str,
                                                 headers: dict[str, str],
                                                 body: dict[str, str], tier: str) -> None:
    before = _count(gateway, tier)
    response = httpx.post(gateway.url + "/v1/chat/completions", timeout=10, headers={
        "Authorization": f"Bearer {api_key}", **headers}, json={
        "model": MODEL, "max_tokens": 2, **body,
        "messages": [{"role": "user", "content": "hint me"}]})
    assert response.status_code == 200, response.text
    assert _count(gateway, tier) == before + 1


def test_the_openai_sdks_service_tier_runs_as_batch(gateway: Gateway, api_key: str) -> None:
    before = _count(gateway, "batch")
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=api_key, max_retries=0)
    completion = client.chat.completions.create(
        model=MODEL, max_tokens=2, service_tier="flex",
        messages=[{"role": "user", "content": "cheap and slow is fine"}])
    assert completion.choices
    assert _count(gateway, "batch") == before + 1
