"""Resource profiles of engines switchyard did not start: stated, discovered, and their sources.

A backend's profile (``routing.types.BackendProfile``: max batch, KV capacity, block size,
context length, device, speed) is what routing's fit rule and admission's headroom need. A
switchyard worker advertises it in its heartbeat; for any other engine it comes from two
places, field by field, the first that has it winning:

1. **stated** in the configuration (``backends[].profile``): the operator knows best;
2. **discovered** from what the engine exposes, each parser below one source:

   - vLLM: ``vllm:cache_config_info`` on ``/metrics`` (``block_size``, ``num_gpu_blocks``
     or ``kv_cache_size_tokens``) and ``max_model_len`` on ``/v1/models``; vLLM exposes no
     ``max_num_seqs``, state it;
   - SGLang: ``/get_server_info`` (``max_running_requests``, ``max_total_num_tokens``,
     ``page_size``, ``context_length``; top level or in ``internal_states``);
   - llama.cpp: ``/props`` (``total_slots``, the per-slot ``n_ctx``);
   - an engine that does not say its max batch (vLLM's ``--max-num-seqs``): inferred from its
     scraped load (``SaturationWatch``): the most requests it ran while others waited in its
     queue at two scrapes in a row.

``ProfileFacts`` is one source's partial profile; ``merge`` builds the profile and a map of
field -> source (what ``GET /admin/fleet`` shows). A KV capacity known only in tokens, with no
block size, is kept as 1-token blocks (llama.cpp and SGLang's default page size are that).

Example::

    facts = [ProfileFacts("config", {"max_batch": 64}),
             parse_vllm_cache_config(metrics_text)]          # block_size, kv_capacity_tokens
    profile, sources = merge(facts)
    sources["max_batch"], sources["block_size"]              # ("config", "vllm:/metrics")
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.fleet.prom import labels as sample_labels
from routing.types import BackendProfile

# Fields a source may give, in BackendProfile's terms (KV capacity in tokens, not blocks).
FIELDS = ("device", "max_batch", "kv_capacity_tokens", "block_size", "max_context_tokens",
          "prefill_tokens_per_s", "relative_speed")
_INT_FIELDS = frozenset({"max_batch", "kv_capacity_tokens", "block_size", "max_context_tokens"})
_MAX_INT = 1 << 40  # anything larger is not a real engine's figure


@dataclass(frozen=True, slots=True)
class ProfileFacts:
    """What one source says of a backend's profile (only the fields it knows)."""

    source: str
    values: Mapping[str, Any] = field(default_factory=dict)


def facts(source: str, **values: Any) -> ProfileFacts:
    """A ``ProfileFacts`` with only the valid, known values of ``values`` (None dropped)."""
    return ProfileFacts(source, {k: v for k, v in ((k, _valid(k, v)) for k, v in values.items())
                                 if v is not None})


def merge(sources: Iterable[ProfileFacts]) -> tuple[BackendProfile, dict[str, str]]:
    """The profile from ``sources`` (first that knows a field wins) and each field's source."""
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source in sources:
        for name, value in source.values.items():
            if name in FIELDS and name not in values:
                values[name] = value
                origin[name] = source.source
    capacity = values.get("kv_capacity_tokens")
    block_size = values.get("block_size")
    num_kv_blocks = None
    if capacity is not None:
        if block_size is None:
            block_size = 1
            origin["block_size"] = "assumed: capacity known in tokens only"
        num_kv_blocks = capacity // block_size
    profile = BackendProfile(
        device=str(values.get("device", "unknown")), num_kv_blocks=num_kv_blocks,
        block_size=block_size, max_batch=values.get("max_batch"),
        max_context_tokens=values.get("max_context_tokens"),
        prefill_tokens_per_s=values.get("prefill_tokens_per_s"),
        relative_speed=float(values.get("relative_speed", 1.0)),
    )
    return profile, origin


# -- the engines' own pages -----------------------------------------------------------------

def parse_vllm_cache_config(metrics_text: str) -> ProfileFacts:
    """``block_size`` and ``num_gpu_blocks`` from vLLM's ``vllm:cache_config_info`` labels."""
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = sample_labels(line)
            block_size = _int(labels.get("block_size"))
            num_blocks = _int(labels.get("num_gpu_blocks"))
            # newer vLLM also states the capacity in tokens
            capacity = _int(labels.get("kv_cache_size_tokens")) or (
                num_blocks * block_size if num_blocks and block_size else None)
            return facts("vllm:/metrics", block_size=block_size, kv_capacity_tokens=capacity)
    return ProfileFacts("vllm:/metrics")


def parse_openai_models(doc: Any) -> ProfileFacts:
    """``max_model_len`` of ``/v1/models`` (vLLM and switchyard's engines; the smallest)."""
    data = doc.get("data") if isinstance(doc, dict) else None
    lengths = [_int(m.get("max_model_len")) for m in data or () if isinstance(m, dict)]
    known = [n for n in lengths if n]
    return facts("/v1/models", max_context_tokens=min(known) if known else None)


def parse_sglang_server_info(doc: Any) -> ProfileFacts:
    """SGLang's ``/get_server_info``: the server arguments, and the scheduler's figures at the
    top level or in ``internal_states`` (which one depends on the version)."""
    if not isinstance(doc, dict):
        return ProfileFacts("sglang:/get_server_info")
    merged: dict[str, Any] = dict(doc)
    states = doc.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        merged = {**states[0], **{k: v for k, v in doc.items() if v is not None}}
    return facts("sglang:/get_server_info",
                 max_batch=_int(merged.get("max_running_requests")),
                 kv_capacity_tokens=_int(merged.get("max_total_num_tokens")),
                 block_size=_int(merged.get("page_size")),
                 max_context_tokens=_int(merged.get("context_length")))


def parse_llamacpp_props(doc: Any) -> ProfileFacts:
    """llama.cpp's ``/props``: ``total_slots`` parallel sequences of ``n_ctx`` tokens each."""
    if not isinstance(doc, dict):
        return ProfileFacts("llama.cpp:/props")
    slots = _int(doc.get("total_slots"))
    settings = doc.get("default_generation_settings")
    n_ctx = _int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    n_ctx = n_ctx or _int(doc.get("n_ctx"))
    capacity = slots * n_ctx if slots and n_ctx else None
    return facts("llama.cpp:/props", max_batch=slots, max_context_tokens=n_ctx,
                 kv_capacity_tokens=capacity)


def stated_facts(stated: Mapping[str, Any]) -> ProfileFacts:
    """The configuration's ``profile`` section (None fields left out)."""
    return facts("config", **{k: v for k, v in stated.items() if k in FIELDS})


def heartbeat_facts(profile: Mapping[str, Any]) -> ProfileFacts:
    """A switchyard worker's heartbeat ``profile`` (blocks, not tokens)."""
    blocks, block_size = _int(profile.get("num_kv_blocks")), _int(profile.get("block_size"))
    device = profile.get("device")
    return facts("heartbeat", device=device if isinstance(device, str) else None,
                 max_batch=_int(profile.get("max_batch")),
                 kv_capacity_tokens=blocks * block_size if blocks and block_size else None,
                 block_size=block_size,
                 max_context_tokens=_int(profile.get("max_context_tokens")),
                 prefill_tokens_per_s=_float(profile.get("prefill_tokens_per_s")))


def _valid(name: str, value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return None
    if name == "device":
        return value[:128] if isinstance(value, str) and value else None
    if name in _INT_FIELDS:
        return _int(value)
    return _float(value)


def _int(value: Any) -> int | None:
    """A positive integer figure, from an int or its decimal string; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not value.isdigit():
            return None
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and 0 < value < _MAX_INT else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


INFERRED_SOURCE = "inferred: running while requests waited"


class SaturationWatch:
    """Infers an engine's max batch from its scraped load, for engines that do not state it.

    While requests wait in an engine's queue, it runs as many as it can: its running count
    then is its batch limit (or what its KV allows). Seen at two scrapes in a row with the same
    running count (one scrape can catch a request between its arrival and the next engine
    step), that count is taken; a larger one seen so later replaces it (a limit is never less
    than what ran). Until then it knows nothing, so it never caps an engine below what it runs.

    Example::

        watch = SaturationWatch()
        watch.observe("vllm-0", running=8, waiting=3)     # None: once is not enough
        watch.observe("vllm-0", running=8, waiting=5)     # 8
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}  # name -> (running, waiting) last scrape
        self._inferred: dict[str, int] = {}

    def observe(self, name: str, running: int, waiting: int) -> int | None:
        """The inferred max batch after this scrape (None while unknown)."""
        last_running, last_waiting = self._last.get(name, (0, 0))
        self._last[name] = (running, waiting)
        known = self._inferred.get(name)
        is_saturated = (running > 0 and waiting > 0 and last_waiting > 0
                        and running == last_running)
        if (is_saturated or known is not None) and running > (known or 0):
            self._inferred[name] = known = running
        return known

    def forget(self, name: str) -> None:
        self._last.pop(name, None)
        self._inferred.pop(name, None)
