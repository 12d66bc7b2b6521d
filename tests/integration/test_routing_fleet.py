"""Routing through a real gateway to real simulated workers: discovery by heartbeat, leaving on
expiry, a metrics-only engine, and prefix affinity beating round-robin on cached tokens."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import httpx
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


def _start_sim(group: ProcessGroup, redis_url: str | None, workers: int,
               *extra: str) -> tuple[Any, list[str]]:
    base = free_port_range(workers)
    argv = python_module_argv("backends.sim", "--workers", str(workers), "--base-port",
                              str(base), "--tokenizer", "approx", "--heartbeat-interval-s", "0.2",
                              *extra)
    if redis_url:
        argv += ["--redis-url", redis_url]
    proc = group.spawn(f"sim-{base}", argv)
    urls = [f"http://127.0.0.1:{base + i}" for i in range(workers)]
    for url in urls:
        wait_http(url + "/health", group=group)
    return proc, urls


def _models(gateway: Gateway, key: str) -> list[str]:
    response = httpx.get(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    return [m["id"] for m in response.json()["data"]]


def _chat(gateway: Gateway, key: str, system: str, question: str) -> httpx.Response:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL, "max_tokens": 2, "messages": [
                          {"role": "system", "content": system},
                          {"role": "user", "content": question}]})


def test_workers_join_by_heartbeat_and_leave_when_it_expires(tmp_path: Path) -> None:
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        _start_sim(group, redis_url, 1)
        gateway = Gateway(group, tmp_path, redis_url, backends=[])
        key = gateway.new_key()
        assert _chat(gateway, key, "sys", "hello").status_code == 200
        # a prompt sent twice: its cached blocks are reused, and the heartbeat says how many
        system = "You are a careful assistant. " * 40
        for question in ("one", "two"):
            assert _chat(gateway, key, system, question).status_code == 200

        def prefix_blocks_reported() -> bool:
            data = gateway.admin.get("/admin/fleet").json()["data"]
            return (data[0]["num_prefix_kv_blocks"] or 0) > 0

        assert wait_until(prefix_blocks_reported, timeout_s=5)
        # The model came with the worker, after the gateway started: its own label.
        assert 'switchyard_requests_total{model="switchyard-sim",route="chat",status="200"} 3.0' \
            in httpx.get(gateway.url + "/metrics").text
        second, _ = _start_sim(group, redis_url, 2)
        served: set[str] = set()

        def both_serve() -> bool:
            served.add(_chat(gateway, key, f"s{random.random()}", "q").headers[
                "x-switchyard-backend"])
            return len(served) == 3

        assert wait_until(both_serve, timeout_s=10, interval_s=0.01), served
        fleet = gateway.admin.get("/admin/fleet").json()
        assert fleet["routing_profile"] == "prefix_affinity"
        assert {b["source"] for b in fleet["data"]} == {"heartbeat"}
        assert len(fleet["data"]) == 3
        assert all(b["profile"]["num_kv_blocks"]["value"] > 0 and b["load_age_s"] < 5
                   for b in fleet["data"])
        second.send_signal(signal.SIGKILL)  # a crash: no withdrawal, only the TTL expires
        second.wait()
        time.sleep(6)  # heartbeat TTL (5 s) plus a poll
        names = {_chat(gateway, key, f"s{i}", "q").headers["x-switchyard-backend"]
                 for i in range(10)}
        assert len(names) == 1, names


def test_a_metrics_only_engine_gets_load_aware_routing(tmp_path: Path) -> None:
    # Engines switchyard did not start: listed in the configuration, no Redis heartbeat; their
    # load comes from scraping /metrics, their prefix locality from the approximate index.
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        _, urls = _start_sim(group, None, 2)
        backends = [{"name": f"vllm-{i}", "url": url, "models": [MODEL]}
                    for i, url in enumerate(urls)]
        gateway = Gateway(group, tmp_path, redis_url, backends=backends)
        key = gateway.new_key()
        system = "You are a careful assistant. " * 80
        placed = [_chat(gateway, key, system, f"question {i}").headers["x-switchyard-backend"]
                  for i in range(6)]
        assert len(set(placed)) == 1  # the approximate index keeps the prefix together
        metrics = httpx.get(gateway.url + "/metrics").text
        assert 'switchyard_requests_total{model="switchyard-sim",route="chat",status="200"}' \
            in metrics
        values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines()
                  if line.startswith("switchyard_routing_")}
        # 5 of the 6 requests were routed to a backend expected to hold the shared prefix.
        ratio = values["switchyard_routing_expected_cached_tokens_total"] / values[
            "switchyard_routing_prompt_tokens_total"]
        assert ratio > 0.5, values
        fleet = gateway.admin.get("/admin/fleet").json()["data"]
        assert {b["source"] for b in fleet} == {"config"}
        assert all(b["num_prefix_kv_blocks"] is None for b in fleet)  # cache_room: neutral
        assert all(b["load_age_s"] < 3 for b in fleet)  # scraped from /metrics


def _cached_fraction(gateway: Gateway, key: str, label: str, seed: int) -> float:
    """48 requests over 6 system prompts (each run its own prompts, so runs cannot warm each
    other's caches); the fraction of prompt tokens the workers had cached."""
    rng = random.Random(seed)
    systems = [f"{label} system prompt {g}. " + "Follow the policy carefully. " * 60
               for g in range(6)]
    prompt = cached = 0
    for i in range(48):
        body = _chat(gateway, key, systems[rng.randrange(len(systems))], f"question {i}").json()
        prompt += body["usage"]["prompt_tokens"]
        cached += body["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached / prompt


@pytest.mark.parametrize("index", ["exact", "approx"])
def test_prefix_affinity_caches_more_than_round_robin(tmp_path: Path, index: str) -> None:
    with ProcessGroup() as group:
        redis_url = start_redis(group, tmp_path)
        _start_sim(group, redis_url, 4)
        # The exact index needs the workers' tokenizer (the sim runs the approximate one).
        tokenizers = {MODEL: "approx"} if index == "exact" else {}
        affinity = Gateway(group, tmp_path, redis_url, backends=[],
                           routing={"profile": "prefix_affinity", "tokenizers": tokenizers})
        round_robin = Gateway(group, tmp_path, redis_url, backends=[],
                              routing={"profile": "round_robin"})
        rr = _cached_fraction(round_robin, round_robin.new_key(), "rr", seed=1)
        pa = _cached_fraction(affinity, affinity.new_key(), "pa", seed=1)
        # 6 prompts over 48 requests: affinity misses ~6 times, round-robin ~24 times.
        assert pa > rr + 0.15, (pa, rr)
