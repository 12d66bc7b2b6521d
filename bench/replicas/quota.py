"""Quota accuracy across the replicas: two tenants at their limits, through the front.

One tenant has ``requests_per_minute`` set, the other ``tokens_per_minute``; both are driven
at once, uniform arrivals at ``rate_per_s`` each (`overload_rate_per_s`: twice what their
limits allow over the window), through the front
with a connection per request, so consecutive requests meet different replicas. Every request
is the same short non-streaming chat request, so the gateway charges each admitted one the
same tokens: its prompt count (exact where the gateway has the model's tokenizer, own mode;
else characters / 4, as `gateway.router.prompt_text` is counted) plus the completion the
engine returned. Both limits are GCRAs with a burst of the limit, so from a fresh start the
allowance by ``t`` seconds is ``floor(limit * (1 + t / 60))``. Example::

    figures = measure_quota(fleet, rpm=300, tpm=36_000, rate_per_s=20.0, window_s=30.0,
                            is_exact_count=False)
    figures["rpm"]["admitted_to_allowance"], figures["tpm"]["admitted_to_allowance"]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
import orjson
import uvloop

from bench.admission.quota import quota_figures
from bench.common.loadgen import json_headers
from bench.replicas.drive import open_per_request_session, scrape_replicas
from bench.replicas.figures import token_quota_figures
from bench.replicas.fleet import ReplicaFleet
from gateway.cli.localfleet import create_key, create_tenant
from gateway.router import prompt_text

MAX_TOKENS = 16
# About 100 tokens of prompt: a token limit is then spent some 120 tokens a request.
PROMPT = ("Summarise the following note in one line. " * 9).strip()
Sent = tuple[float, int, int]  # sent at (s from the start), HTTP status, tokens charged


def quota_body(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": MAX_TOKENS, "stream": False,
            "messages": [{"role": "user", "content": PROMPT}]}


def overload_rate_per_s(rpm: int, tpm: int, window_s: float, model: str) -> float:
    """A rate (each tenant's) at which both tenants send twice their allowance in
    ``window_s``: the burst is spent within the first half, the rest is the steady rate."""
    body = quota_body(model)
    tokens_per_request = max(1, len(prompt_text(body)) // 4) + MAX_TOKENS
    per_minute = max(rpm, tpm / tokens_per_request)
    return 2 * per_minute * (1 + window_s / 60) / window_s


def charged_tokens(body: Mapping[str, Any], usage: Mapping[str, Any], is_exact_count: bool
                   ) -> int:
    """What the gateway charges a tenant's token limit for an answered request."""
    prompt = int(usage.get("prompt_tokens") or 0) if is_exact_count \
        else max(1, len(prompt_text(dict(body))) // 4)
    return prompt + int(usage.get("completion_tokens") or 0)


async def _hammer(url: str, keys: Mapping[str, str], body: Mapping[str, Any], rate_per_s: float,
                  window_s: float, is_exact_count: bool
                  ) -> tuple[dict[str, list[Sent]], dict[str, str]]:
    """Uniform arrivals for ``window_s`` for each key, interleaved; what each request got, and
    the first failure of each kind (no response)."""
    data = orjson.dumps(body)
    sent: dict[str, list[Sent]] = {name: [] for name in keys}
    errors: dict[str, str] = {}  # the first failure of each kind

    async def one(session: aiohttp.ClientSession, name: str, at_s: float) -> None:
        try:
            async with session.post(url, data=data, headers=json_headers(keys[name])) as resp:
                payload = await resp.read()
                tokens = charged_tokens(body, orjson.loads(payload).get("usage") or {},
                                        is_exact_count) if resp.status == 200 else 0
                sent[name].append((at_s, resp.status, tokens))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            errors.setdefault(type(exc).__name__, f"{name}: {exc}"[:300])
            sent[name].append((at_s, 0, 0))

    names = list(keys)
    async with open_per_request_session() as session:
        started = time.perf_counter()
        tasks = []
        for index in range(int(rate_per_s * window_s) * len(names)):
            delay_s = started + index / (rate_per_s * len(names)) - time.perf_counter()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            at_s = time.perf_counter() - started
            tasks.append(asyncio.create_task(one(session, names[index % len(names)], at_s)))
        await asyncio.gather(*tasks)
    return {name: sorted(rows) for name, rows in sent.items()}, errors


def _histogram(statuses: Iterable[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in statuses:
        counts[str(status)] = counts.get(str(status), 0) + 1
    return counts


def measure_quota(fleet: ReplicaFleet, *, rpm: int, tpm: int, rate_per_s: float,
                  window_s: float, is_exact_count: bool) -> dict[str, Any]:
    """Both tenants at once through the front; see the module docstring."""
    stamp = time.strftime("%H%M%S")
    tenants = {"rpm": {"id": f"quota-rpm-{stamp}", "limits": {"requests_per_minute": rpm}},
               "tpm": {"id": f"quota-tpm-{stamp}", "limits": {"tokens_per_minute": tpm}}}
    keys = {}
    with fleet.local_admin() as admin:
        for name, tenant in tenants.items():
            tenant = {**tenant, "name": tenant["id"], "models": ["*"]}
            keys[name] = create_key(admin, create_tenant(admin, tenant), name="quota")
            if not fleet.is_shared:
                fleet.provision_everywhere(tenant, keys[name])
    body = quota_body(fleet.front.model)
    before = scrape_replicas(fleet)
    sent, errors = uvloop.run(_hammer(fleet.url + "/chat/completions", keys, body, rate_per_s,
                              window_s, is_exact_count))
    after = scrape_replicas(fleet)
    rpm_figures = quota_figures([(at, status) for at, status, _ in sent["rpm"]], rpm)
    rpm_figures["admitted_to_allowance"] = (rpm_figures["num_admitted"]
                                            / rpm_figures["allowance"]
                                            if rpm_figures["allowance"] else None)
    admitted = [a["requests"] - b["requests"] for a, b in zip(after, before, strict=True)]
    prompt_tokens = sum(a["prompt_tokens"] - b["prompt_tokens"]
                        for a, b in zip(after, before, strict=True))
    num_ok = sum(status == 200 for rows in sent.values() for _, status, _ in rows)
    return {"num_replicas": len(fleet.replicas), "rate_per_s": rate_per_s,
            "window_s": window_s, "rpm": {"limit": rpm, **rpm_figures},
            "tpm": {"limit": tpm, **token_quota_figures(sent["tpm"], tpm)},
            "requests_per_replica": admitted, "errors": errors,
            "statuses": {name: _histogram(status for _, status, _ in rows)
                         for name, rows in sent.items()},
            # the gateways' own prompt count per routed request, beside the one charged here
            "gateway_prompt_tokens_per_request": prompt_tokens / num_ok if num_ok else None,
            "charged_tokens_per_request": next((tokens for _, status, tokens in sent["tpm"]
                                                if status == 200), None)}
