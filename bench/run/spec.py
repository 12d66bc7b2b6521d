"""The values that flow through a run: tenants, request specs, and per-request records.

A workload yields `RequestSpec` values (pure data, no I/O); the driver sends each one and turns
the response into a `Record`. Example::

    spec = RequestSpec(index=0, tenant=TenantSpec("bench-standard-0", "standard"),
                       messages=({"role": "user", "content": "Hi"},), max_tokens=16)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A tenant of the mix and its SLO tier; ``key`` is filled in once the run has one."""

    name: str
    tier: str
    key: str | None = None


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: chat ``messages`` or a completion ``prompt``.

    ``conversation`` and ``turn`` tie the turns of a multi-turn conversation together: turn
    ``n`` is sent only after turn ``n - 1`` has finished. ``at_s`` is the arrival offset a trace
    dictates (None: the arrival process decides). ``group`` labels the shared prefix (a system
    prompt or a document) for the report.

    Example::

        RequestSpec(index=3, tenant=tenant, prompt="Once upon a time", max_tokens=32)
    """

    index: int
    tenant: TenantSpec
    max_tokens: int
    messages: tuple[Message, ...] = ()
    prompt: str | None = None
    is_stream: bool = True
    conversation: int | None = None
    turn: int = 0
    group: int | None = None
    at_s: float | None = None

    @property
    def is_chat(self) -> bool:
        """A chat request (``messages``), not a text completion (``prompt``)."""
        return self.prompt is None


@dataclass(slots=True)
class Record:
    """What happened to one request. Times are seconds; ``None`` where not measured."""

    index: int
    tenant: str
    tier: str
    phase: int
    is_stream: bool
    sent_at_s: float  # from the start of the run
    lag_s: float = 0.0  # how late it left against its scheduled arrival
    status: int = 0  # HTTP status; 0: no response (transport error); -1: cut off at the end
    error: str = ""
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    num_prompt_tokens: int | None = None
    num_completion_tokens: int | None = None
    num_cached_tokens: int | None = None
    worker: str = "unknown"
    retry_after_s: float | None = None  # a refusal's Retry-After (delta-seconds form only)
    conversation: int | None = None
    turn: int = 0
    group: int | None = None
    answer: str = field(default="", repr=False)

    @property
    def is_ok(self) -> bool:
        """Answered 200 and read to the end without an error event."""
        return self.status == 200 and not self.error

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready data (without the answer text)."""
        return {name: getattr(self, name) for name in _RECORD_FIELDS}


_RECORD_FIELDS = tuple(f.name for f in fields(Record) if f.name != "answer")
