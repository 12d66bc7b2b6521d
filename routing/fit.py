"""Does a request fit on a backend? The KV it would need there against the KV free there.

A request needs new KV for the part of its prompt the backend does not hold and for its
output::

    needed = (prompt - cached on this backend) + min(max_tokens or E, E)   E = 256 tokens

so a prefix holder needs only its few hundred uncached tokens, a non-holder the whole prompt.
The free KV comes from the backend's profile and load::

    free = kv_capacity_tokens * (1 - kv_usage) - prompt tokens sent there, not yet prefilled

``kv_usage`` is the engine's gauge (blocks held by running requests: vLLM's
``kv_cache_usage_perc``), ``age_s`` old, so the prompts this gateway sent since that have
not started yet are taken off too. Output is counted up to E tokens only: an engine grows a
sequence's KV as it decodes, and most answers end well before their ``max_tokens``.

Unknown capacity (a backend that states no profile and exposes none) or stale figures give
None: the caller then falls back on what else it knows (routing's ``not_saturated`` keeps a
KV-usage threshold as a last guard for non-holders only; admission looks at batch slots).

Example::

    needed = needed_kv_tokens(num_prompt_tokens=3000, num_cached_tokens=2800, max_tokens=64)
    fits(backend, needed)          # True: 264 tokens, where 1,000 are free
"""

from __future__ import annotations

from routing.types import BackendProfile, BackendState

EXPECTED_OUTPUT_TOKENS = 256


def needed_kv_tokens(num_prompt_tokens: int, num_cached_tokens: int,
                     max_tokens: int | None) -> int:
    """New KV tokens a request needs on a backend that holds ``num_cached_tokens`` of it."""
    output = EXPECTED_OUTPUT_TOKENS if max_tokens is None else min(max(0, max_tokens),
                                                                   EXPECTED_OUTPUT_TOKENS)
    return max(0, num_prompt_tokens - num_cached_tokens) + output


def holds(profile: BackendProfile, num_tokens: int) -> bool:
    """Whether a backend with ``profile`` could ever hold a sequence of ``num_tokens`` (prompt
    and output): its context length and its whole KV cache, where it states them."""
    if profile.max_context_tokens is not None and profile.max_context_tokens < num_tokens:
        return False
    num_kv_blocks, block_size = profile.num_kv_blocks, profile.block_size
    # ceil(num_tokens / block_size) <= num_kv_blocks, without the division
    return num_kv_blocks is None or not block_size or num_kv_blocks * block_size >= num_tokens


def free_kv_tokens(backend: BackendState, *, max_age_s: float) -> int | None:
    """KV tokens free on ``backend`` now; None when its capacity or load is unknown."""
    capacity = backend.profile.kv_capacity_tokens
    if capacity is None or backend.age_s > max_age_s:
        return None
    usage = min(1.0, max(0.0, backend.kv_usage))
    return int(capacity * (1.0 - usage)) - backend.num_in_flight_prompt_tokens


def fits(backend: BackendState, needed_tokens: int, *, max_age_s: float) -> bool | None:
    """Whether ``needed_tokens`` of new KV fit on ``backend``; None when unknown."""
    free = free_kv_tokens(backend, max_age_s=max_age_s)
    return None if free is None else needed_tokens <= free
