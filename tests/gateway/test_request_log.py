"""The request log: one JSON line per request with who, what, how much and why it failed,
never the key or the text; sampled mode keeps every failure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from gateway.cli.localproc import ProcessGroup
from routing.index_approx import MIN_TTL_S
from tests.fleet import MODEL, Engine, Gateway, wait_until


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def post(gateway: Gateway, key: str, **body: Any) -> httpx.Response:
    return httpx.post(gateway.url + "/v1/chat/completions", timeout=10,
                      headers={"Authorization": f"Bearer {key}", "x-request-id": body.pop(
                          "request_id", "rl-1")},
                      json={"model": MODEL, "max_tokens": 5,
                            "messages": [{"role": "user", "content": "hello there"}], **body})


def test_every_request_gets_a_line(procs: ProcessGroup, workdir: Path, redis_url: str,
                                   engines: list[Engine], tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    gateway = Gateway(procs, workdir, redis_url, [engines[0].backend_config()],
                      request_log={"mode": "all", "path": str(path)})
    tenant = gateway.create_tenant()
    key = gateway.create_key(tenant["id"])
    assert post(gateway, key, stream=True, request_id="rl-stream").status_code == 200
    assert post(gateway, key, model="nope", request_id="rl-404").status_code == 404
    assert post(gateway, "sy-not-a-key", request_id="rl-401").status_code == 401
    assert wait_until(lambda: len(lines(path)) == 3, timeout_s=5)
    by_id = {line["request_id"]: line for line in lines(path)}
    ok = by_id["rl-stream"]
    assert (ok["tenant"], ok["model"], ok["status"], ok["error"], ok["stream"]) == (
        tenant["id"], MODEL, 200, None, True)
    assert ok["key_id"] and ok["backend"] == engines[0].name and ok["tier"]
    assert ok["prompt_tokens"] > 0 and ok["output_tokens"] == 5
    assert 0 < ok["ttft_s"] <= ok["total_s"] and ok["dominant_wait"] in ok["waits"]
    # The engine's part of the first token is inside the gateway's.
    assert 0 < ok["waits"]["upstream_ttft"] < ok["ttft_s"]
    missing = by_id["rl-404"]
    assert (missing["status"], missing["error"], missing["model"]) == (404, "model_not_found",
                                                                       None)
    refused = by_id["rl-401"]
    assert (refused["status"], refused["tenant"], refused["key_id"]) == (401, None, None)
    text = path.read_text()
    assert key not in text and "hello there" not in text  # never the key, never the prompt
    assert path.stat().st_mode & 0o777 == 0o600


def send_two_turns(gateway: Gateway, key: str) -> None:
    """Two requests with one long system prompt (``turn-0``, ``turn-1``), both answered."""
    system = " ".join(f"rule {i}: answer in the house style." for i in range(60))
    for index in range(2):
        assert post(gateway, key, request_id=f"turn-{index}", messages=[
            {"role": "system", "content": system},
            {"role": "user", "content": f"question {index}"}]).status_code == 200


def test_a_routed_line_says_what_routing_expected_cached(
        procs: ProcessGroup, workdir: Path, redis_url: str, engines: list[Engine],
        tmp_path: Path) -> None:
    path = tmp_path / "routed.jsonl"
    gateway = Gateway(procs, workdir, redis_url, [e.backend_config() for e in engines[:2]],
                      request_log={"mode": "all", "path": str(path)})
    key = gateway.new_key()
    send_two_turns(gateway, key)
    assert post(gateway, key, model="nope", request_id="unrouted").status_code == 404
    assert wait_until(lambda: len(lines(path)) == 3, timeout_s=5)
    by_id = {line["request_id"]: line for line in lines(path)}
    first, second = by_id["turn-0"], by_id["turn-1"]
    assert (first["expected_cached_tokens"], first["best_cached_tokens"]) == (0, 0)
    # The second goes where the first left the system prompt, and routing knew it.
    assert second["backend"] == first["backend"]
    assert 0 < second["expected_cached_tokens"] <= second["best_cached_tokens"]
    assert "expected_cached_tokens" not in by_id["unrouted"]


def test_route_detail_lists_every_backend_the_decision_saw(
        procs: ProcessGroup, workdir: Path, redis_url: str, engines: list[Engine],
        tmp_path: Path) -> None:
    path = tmp_path / "detailed.jsonl"
    gateway = Gateway(procs, workdir, redis_url, [e.backend_config() for e in engines[:2]],
                      request_log={"mode": "all", "path": str(path), "route_detail": True})
    key = gateway.new_key()
    send_two_turns(gateway, key)
    assert wait_until(lambda: len(lines(path)) == 2, timeout_s=5)
    second = {line["request_id"]: line for line in lines(path)}["turn-1"]
    candidates = {c["backend"]: c for c in second["route_candidates"]}
    assert sorted(candidates) == sorted(e.name for e in engines[:2])
    # The holder is listed with what the index matched there, the other with nothing.
    held = candidates[second["backend"]]
    assert held["cached_tokens"] == second["expected_cached_tokens"] > 0
    # Listed engines without a tokenizer: it was sent on the first turn's approximate claim
    # (these engines cache nothing, so a claim's lifetime may already be cut to the floor).
    assert 0 <= second["claim_age_s"] < 5
    assert second["claim_ttl_s"] >= MIN_TTL_S
    other = next(c for name, c in candidates.items() if name != second["backend"])
    assert other["cached_tokens"] == 0
    for c in candidates.values():
        assert c["healthy"] is True and c["age_s"] >= 0 and c["in_flight"] >= 0
        assert 0 <= c["kv_usage"] <= 1 and c["source"] in ("heartbeat", "metrics", "config")


def test_sampled_mode_keeps_every_failure(procs: ProcessGroup, workdir: Path, redis_url: str,
                                          engines: list[Engine], tmp_path: Path) -> None:
    path = tmp_path / "sampled.jsonl"
    gateway = Gateway(procs, workdir, redis_url, [engines[0].backend_config()],
                      request_log={"mode": "sampled", "sample_rate": 0.0, "path": str(path)})
    key = gateway.new_key()
    for index in range(5):
        assert post(gateway, key, request_id=f"ok-{index}").status_code == 200
    assert post(gateway, key, max_tokens=-3, request_id="bad").status_code == 400
    assert wait_until(lambda: len(lines(path)) >= 1, timeout_s=5)
    assert [(line["request_id"], line["error"]) for line in lines(path)] == [
        ("bad", "invalid_value")]


def test_prompt_text_only_when_enabled_and_cut_to_its_length(
        procs: ProcessGroup, workdir: Path, redis_url: str, engines: list[Engine],
        tmp_path: Path) -> None:
    path = tmp_path / "with-prompts.jsonl"
    gateway = Gateway(procs, workdir, redis_url, [engines[0].backend_config()],
                      request_log={"mode": "all", "path": str(path), "include_prompt": True,
                                   "prompt_max_chars": 12})
    key = gateway.new_key()
    assert post(gateway, key, request_id="with-text").status_code == 200
    assert wait_until(lambda: len(lines(path)) == 1, timeout_s=5)
    line = lines(path)[0]
    assert line["prompt"] == "user\nhello t"  # role and content, cut to 12 characters
    assert key not in path.read_text()
