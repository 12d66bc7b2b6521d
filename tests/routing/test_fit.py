"""The fit rule: the KV a request needs on each backend against the KV free there; a prefix
holder that fits wins over a gauge threshold, one that does not fit loses."""

from __future__ import annotations

import random

import pytest

from routing.fit import EXPECTED_OUTPUT_TOKENS, fits, free_kv_tokens, needed_kv_tokens
from routing.plugins.filters import NotSaturatedFilter
from routing.profiles import profile_by_name
from routing.scheduler import schedule
from routing.types import BackendState
from tests.routing.builders import NOW_S, backend, cycle, profile, request, snapshot

# 10,000 tokens of KV in 16-token blocks
KV = profile(num_kv_blocks=625, block_size=16)


@pytest.mark.parametrize(
    ("prompt", "cached", "max_tokens", "needed"),
    [
        pytest.param(3000, 2800, 64, 264, id="holder-needs-its-uncached-part"),
        pytest.param(3000, 0, 64, 3064, id="non-holder-needs-the-whole-prompt"),
        pytest.param(3000, 0, None, 3000 + EXPECTED_OUTPUT_TOKENS, id="no-max-tokens"),
        pytest.param(100, 0, 100_000, 100 + EXPECTED_OUTPUT_TOKENS, id="output-counted-up-to-E"),
        pytest.param(100, 500, 0, 0, id="cached-beyond-prompt"),
    ],
)
def test_needed(prompt: int, cached: int, max_tokens: int | None, needed: int) -> None:
    assert needed_kv_tokens(prompt, cached, max_tokens) == needed


@pytest.mark.parametrize(
    ("b", "free"),
    [
        pytest.param(backend("a", profile=KV, kv_usage=0.75), 2500, id="capacity-less-usage"),
        pytest.param(backend("a", profile=KV, kv_usage=0.75, num_in_flight_prompt_tokens=2000),
                     500, id="less-prompts-sent-not-yet-prefilled"),
        pytest.param(backend("a", kv_usage=0.1), None, id="capacity-unknown"),
        pytest.param(backend("a", profile=KV, age_s=60.0), None, id="stale"),
        pytest.param(backend("a", profile=KV, kv_usage=1.7), 0, id="gauge-clamped"),
    ],
)
def test_free(b: BackendState, free: int | None) -> None:
    assert free_kv_tokens(b, max_age_s=5.0) == free


def test_fits() -> None:
    full = backend("a", profile=KV, kv_usage=0.97)  # 300 tokens free
    assert fits(full, 264, max_age_s=5.0) is True
    assert fits(full, 3064, max_age_s=5.0) is False
    assert fits(backend("b"), 10, max_age_s=5.0) is None


@pytest.mark.parametrize(
    ("backends", "matched", "kept"),
    [
        # KV usage 0.99 on both, 10,000-token caches (100 tokens free): only a holder of
        # all but 50 tokens fits, whatever the threshold says.
        pytest.param([backend("holder", profile=KV, kv_usage=0.99),
                      backend("other", profile=KV, kv_usage=0.99)],
                     {"holder": 59}, ["holder"], id="holder-that-fits-passes-at-gauge-0.99"),
        pytest.param([backend("holder", profile=KV, kv_usage=0.999),
                      backend("other", profile=KV, kv_usage=0.5)],
                     {"holder": 59}, ["other"], id="holder-that-does-not-fit-is-dropped"),
        pytest.param([backend("holder", kv_usage=1.0), backend("other", kv_usage=1.0)],
                     {"holder": 10}, ["holder"], id="unknown-capacity-guard-spares-holders"),
        pytest.param([backend("a", kv_usage=0.99), backend("b", kv_usage=0.5)],
                     {}, ["b"], id="unknown-capacity-guard-for-non-holders"),
    ],
)
def test_not_saturated_uses_the_fit(backends: list[BackendState], matched: dict[str, int],
                                    kept: list[str]) -> None:
    c = cycle(*backends, req=request(1000, max_tokens=0), matched=matched)
    assert [b.name for b in NotSaturatedFilter().filter(c, list(backends))] == kept


def test_prefix_affinity_keeps_a_conversation_on_its_full_holder() -> None:
    """A 4k-token conversation whose worker's gauge reads 0.99: its next turn still goes
    there (it needs ~300 new tokens), not to an idle backend that would prefill it all."""
    fleet = [backend("holder", profile=profile(num_kv_blocks=4000, block_size=16),
                     kv_usage=0.99, num_running=6),
             backend("idle", profile=profile(num_kv_blocks=4000, block_size=16))]
    snap = snapshot(*fleet, matched={"holder": 240})  # 3,840 of 4,000 tokens held
    ranked = schedule(request(4000, max_tokens=64), snap, profile_by_name("prefix_affinity"),
                      NOW_S, random.Random(0))
    assert ranked[0].backend == "holder"
