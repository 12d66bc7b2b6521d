"""The HTTP half of a run: send one `RequestSpec`, read its answer, fill in its `Record`.

One shared ``aiohttp.ClientSession`` for the whole run; streams are read as they arrive and
split into SSE lines by hand (no per-event framework overhead), and only ``data:`` events are
decoded, with orjson. TTFT is the time to the first event that carries content; TPOT is
``(e2e - ttft) / (completion_tokens - 1)``; token counts come from ``usage`` (streams ask for it
with ``stream_options.include_usage``). Example::

    async with open_session(concurrency=64) as session:
        client = Client(session, "http://127.0.0.1:8080/v1", model="switchyard-sim")
        await client.send(spec, record, spec.messages, started_at=time.perf_counter())
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from bench.run.spec import Message, Record, RequestSpec

BACKEND_HEADER = "x-switchyard-backend"
_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


def open_session(concurrency: int | None, timeout_s: float = 600.0) -> aiohttp.ClientSession:
    """One session for the run: ``concurrency`` connections at most (None: unlimited)."""
    connector = aiohttp.TCPConnector(limit=concurrency or 0, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s),
        skip_auto_headers=("User-Agent",), json_serialize=lambda x: orjson.dumps(x).decode(),
    )


class Client:
    """Sends request specs to an OpenAI-compatible base URL (``.../v1``)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str) -> None:
        self._session = session
        self._base_url = base_url.rstrip("/")
        self._model = model

    def body(self, spec: RequestSpec, messages: Sequence[Message]) -> bytes:
        """The JSON body for ``spec``; streams ask for ``usage`` in their last event."""
        body: dict[str, Any] = {"model": self._model, "max_tokens": spec.max_tokens,
                                "stream": spec.is_stream}
        if spec.is_chat:
            body["messages"] = list(messages)
        else:
            body["prompt"] = spec.prompt
        if spec.is_stream:
            body["stream_options"] = {"include_usage": True}
        return orjson.dumps(body)

    async def send(self, spec: RequestSpec, record: Record, messages: Sequence[Message],
                   started_at: float) -> None:
        """Send ``spec`` (with ``messages``, which may differ from ``spec.messages`` for a
        multi-turn conversation) and record what happened; never raises for HTTP failures."""
        path = "/chat/completions" if spec.is_chat else "/completions"
        # The request's index as its id: the gateways' request logs join the run's records.
        headers = {"Content-Type": "application/json", "x-request-id": f"bench-{spec.index}"}
        if spec.tenant.key:
            headers["Authorization"] = f"Bearer {spec.tenant.key}"
        sent = time.perf_counter()
        record.sent_at_s = sent - started_at
        try:
            async with self._session.post(self._base_url + path, data=self.body(spec, messages),
                                          headers=headers) as resp:
                record.status = resp.status
                record.worker = resp.headers.get(BACKEND_HEADER, "unknown")
                if resp.status != 200:
                    record.retry_after_s = retry_after_s(resp.headers.get("Retry-After"))
                    record.error = _error_message(await resp.read())
                elif spec.is_stream:
                    is_kept = spec.conversation is not None  # the next turn sends it
                    await _read_stream(resp, record, sent, keep_answer=is_kept)
                else:
                    _read_body(await resp.read(), record)
        except _TRANSPORT_ERRORS as exc:
            record.error = f"{exc.__class__.__name__}: {exc}"[:300]
            return
        finished = time.perf_counter()
        record.e2e_s = finished - sent
        num_tokens = record.num_completion_tokens
        if record.ttft_s is not None and num_tokens is not None and num_tokens > 1:
            record.tpot_s = (record.e2e_s - record.ttft_s) / (num_tokens - 1)


async def _read_stream(resp: aiohttp.ClientResponse, record: Record, sent: float,
                       keep_answer: bool) -> None:
    buffer = b""
    num_content_events = 0
    parts: list[str] = []
    async for chunk in resp.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            if (record.ttft_s is not None and not keep_answer and b'"error"' not in payload
                    and b'"usage":{' not in payload and b'"usage": {' not in payload):
                num_content_events += 1  # past the first token only usage and errors matter
                continue
            event = orjson.loads(payload)
            if "error" in event:
                record.error = str(event["error"].get("message", event["error"]))[:300]
                continue
            for choice in event.get("choices") or ():
                delta = choice.get("delta")
                content = delta.get("content") if delta is not None else choice.get("text")
                if content:
                    if record.ttft_s is None:
                        record.ttft_s = time.perf_counter() - sent
                    num_content_events += 1
                    if keep_answer:
                        parts.append(content)
            if event.get("usage"):
                _read_usage(event["usage"], record)
    if record.ttft_s is None and not record.error:
        record.error = "stream ended without content"
    if record.num_completion_tokens is None:  # no usage: count events (may be 1 over)
        record.num_completion_tokens = num_content_events
    record.answer = "".join(parts)


def _read_body(raw: bytes, record: Record) -> None:
    body = orjson.loads(raw)
    if body.get("usage"):
        _read_usage(body["usage"], record)
    choices = body.get("choices") or [{}]
    message = choices[0].get("message")
    record.answer = (message.get("content") if message else choices[0].get("text")) or ""


def _read_usage(usage: dict[str, Any], record: Record) -> None:
    record.num_prompt_tokens = usage.get("prompt_tokens")
    record.num_completion_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    record.num_cached_tokens = details.get("cached_tokens")


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header's delay in seconds; None if absent or an HTTP date."""
    try:
        delay_s = float(value) if value is not None else None
    except ValueError:
        return None
    return delay_s if delay_s is not None and 0 <= delay_s < float("inf") else None


def _error_message(raw: bytes) -> str:
    try:
        error = orjson.loads(raw).get("error", {})
        message = error.get("message") if isinstance(error, dict) else error
        return str(message)[:300]
    except (orjson.JSONDecodeError, AttributeError):
        return raw[:300].decode(errors="replace")
