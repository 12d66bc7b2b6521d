"""Engines switchyard did not start, listed in ``backends:`` with no heartbeats or KV events:
their profiles discovered from their own pages (or stated), and an engine without load metrics
loaded by what the gateway sent it, not capped as an unknown."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.cli.localproc import ProcessGroup, start_redis
from tests.fleet import Engine, Gateway, wait_until
from tests.integration.test_routing_fleet import MODEL, _start_sim


def test_profiles_are_discovered_and_stated_fields_win(tmp_path: Path) -> None:
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        _, urls = _start_sim(group, None, 2)
        backends = [{"name": "vllm-0", "url": urls[0], "models": [MODEL],
                     "profile": {"max_batch": 8, "block_size": 32, "device": "nvidia-h100"}},
                    {"name": "vllm-1", "url": urls[1], "models": [MODEL]}]
        gateway = Gateway(group, tmp_path, redis_url, backends=backends,
                          routing={"discover_workers": False})
        sim = httpx.get(urls[1] + "/sim/profile").json()["profile"]
        fleet = {b["name"]: b for b in gateway.admin.get("/admin/fleet").json()["data"]}
        stated, discovered = fleet["vllm-0"], fleet["vllm-1"]
        assert discovered["load_source"] == "metrics"
        assert discovered["profile"]["block_size"] == {"value": sim["block_size"],
                                                       "source": "vllm:/metrics"}
        assert discovered["profile"]["kv_capacity_tokens"] == {
            "value": sim["num_kv_blocks"] * sim["block_size"], "source": "vllm:/metrics"}
        assert discovered["profile"]["max_context_tokens"] == {
            "value": sim["max_context_tokens"], "source": "/v1/models"}
        assert discovered["profile"]["max_batch"] == {"value": None, "source": None}
        assert stated["profile"]["max_batch"] == {"value": 8, "source": "config"}
        assert stated["profile"]["block_size"] == {"value": 32, "source": "config"}
        assert stated["profile"]["device"] == {"value": "nvidia-h100", "source": "config"}
        # the KV capacity is still the engine's (in its own block size's tokens)
        assert stated["profile"]["kv_capacity_tokens"]["source"] == "vllm:/metrics"


def test_an_engine_without_load_metrics_is_loaded_by_the_gateways_books(tmp_path: Path) -> None:
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        engine = Engine(group, "plain", extra=("--no-metrics", "--first-token-delay-ms", "600"))
        backend = {**engine.backend_config(), "profile": {"max_batch": 16}}
        gateway = Gateway(group, tmp_path, redis_url, backends=[backend],
                          routing={"discover_workers": False})
        key = gateway.new_key()
        (data,) = gateway.admin.get("/admin/fleet").json()["data"]
        assert data["load_source"] == "books"
        assert data["load_age_s"] == 0.0

        def chat(i: int) -> int:
            response = httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                                  headers={"Authorization": f"Bearer {key}"},
                                  json={"model": engine.models[0], "max_tokens": 2,
                                        "messages": [{"role": "user", "content": f"q{i}"}]})
            return response.status_code

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(chat, i) for i in range(12)]
            # all twelve reach the engine together (an unknown engine used to get four)
            assert wait_until(lambda: engine.stats()["in_flight"] == 12, timeout_s=5)
            assert [f.result() for f in futures] == [200] * 12


def _expected_cached_tokens(gateway: Gateway) -> float:
    for line in httpx.get(gateway.url + "/metrics").text.splitlines():
        if line.startswith("switchyard_routing_expected_cached_tokens_total "):
            return float(line.split(" ")[1])
    raise AssertionError("no switchyard_routing_expected_cached_tokens_total in /metrics")


def test_a_reported_miss_drops_the_approximate_claims(tmp_path: Path) -> None:
    """The engine evicts everything (vLLM's reset_prefix_cache); the next response reports
    no cached tokens where the approximate index expected many, and from then on the claims
    made before it are not trusted: another prompt claimed earlier is expected uncached."""
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        _, (url,) = _start_sim(group, None, 1)
        gateway = Gateway(group, tmp_path, redis_url, routing={"discover_workers": False},
                          backends=[{"name": "vllm-0", "url": url, "models": [MODEL]}])
        key = gateway.new_key()

        def chat(system: str, question: str) -> dict[str, Any]:
            response = httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                                  headers={"Authorization": f"Bearer {key}"},
                                  json={"model": MODEL, "max_tokens": 2, "messages": [
                                      {"role": "system", "content": system},
                                      {"role": "user", "content": question}]})
            assert response.status_code == 200, response.text
            return dict(response.json()["usage"])

        first, second = "Policy one. " * 200, "Second policy text. " * 150
        chat(first, "q1")
        chat(second, "q1")
        time.sleep(1.5)  # the shortest lifetime feedback teaches is 1 s: older than that
        assert chat(first, "q2")["prompt_tokens_details"]["cached_tokens"] > 0
        assert httpx.post(url + "/reset_prefix_cache").status_code == 200
        time.sleep(1.2)  # a miss on a claim younger than 1 s is no evidence of an eviction
        before = _expected_cached_tokens(gateway)
        missed = chat(first, "q3")
        assert missed["prompt_tokens_details"]["cached_tokens"] == 0
        assert _expected_cached_tokens(gateway) > before  # the index still believed it
        (data,) = gateway.admin.get("/admin/fleet").json()["data"]
        assert data["prefix_cache"]["approx_claim_ttl_s"] < 600
        assert data["prefix_cache"]["reported_hit_ratio"] < data["prefix_cache"][
            "expected_hit_ratio"]
        before = _expected_cached_tokens(gateway)
        chat(second, "q2")  # claimed before the miss's claim: no longer trusted
        assert _expected_cached_tokens(gateway) == before
        metrics = httpx.get(gateway.url + "/metrics").text
        assert 'switchyard_backend_reported_cached_tokens_total{backend="vllm-0"}' in metrics
