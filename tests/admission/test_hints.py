"""Priority and SLO hints from other ecosystems: mapped onto tiers, never above the ceiling."""

from __future__ import annotations

import pytest

from admission.hints import TierHints, hinted_tier, hints_from
from admission.tiers import DEFAULT_TIERS, tier_table

TIERS = tier_table(DEFAULT_TIERS)  # interactive 0.5 s > standard 2 s > batch 60 s


@pytest.mark.parametrize(("ceiling", "hints", "expected"), [
    pytest.param("interactive", TierHints(), "interactive", id="no-hint"),
    pytest.param("interactive", TierHints(objective="batch"), "batch", id="objective-lower"),
    pytest.param("standard", TierHints(objective="interactive"), "standard",
                 id="objective-above-is-clamped"),
    pytest.param("interactive", TierHints(objective="gold", smg_priority="bulk"), "batch",
                 id="unknown-objective-next-hint"),
    pytest.param("interactive", TierHints(ttft_slo_ms="500"), "interactive", id="ttft-500"),
    pytest.param("interactive", TierHints(ttft_slo_ms="2500"), "standard", id="ttft-2500"),
    pytest.param("interactive", TierHints(ttft_slo_ms="120000"), "batch", id="ttft-2min"),
    pytest.param("standard", TierHints(ttft_slo_ms="100"), "standard",
                 id="ttft-none-meets-is-ceiling"),
    pytest.param("interactive", TierHints(ttft_slo_ms="soon", service_tier="flex"), "batch",
                 id="unparsable-ttft-next-hint"),
    pytest.param("interactive", TierHints(ttft_slo_ms="-5"), "interactive", id="negative-ttft"),
    pytest.param("interactive", TierHints(smg_priority=" Bulk "), "batch", id="smg-bulk"),
    pytest.param("standard", TierHints(smg_priority="system"), "standard", id="smg-system"),
    pytest.param("standard", TierHints(smg_priority="123"), "standard", id="smg-unknown"),
    pytest.param("interactive", TierHints(service_tier="flex"), "batch", id="openai-flex"),
    pytest.param("batch", TierHints(service_tier="priority"), "batch", id="openai-priority"),
    pytest.param("standard", TierHints(service_tier=7), "standard", id="openai-not-a-string"),
    pytest.param("interactive", TierHints(objective="standard", smg_priority="bulk"),
                 "standard", id="objective-wins"),
])
def test_hints_map_onto_tiers(ceiling: str, hints: TierHints, expected: str) -> None:
    assert hinted_tier(TIERS, TIERS[ceiling], hints).name == expected


def test_hints_are_read_from_headers_and_body() -> None:
    assert hints_from({}, {"model": "m"}) is None
    assert hints_from({"x-gateway-inference-objective": "batch", "x-slo-ttft-ms": "900"},
                      {}) == TierHints(objective="batch", ttft_slo_ms="900")
    assert hints_from({"x-llm-d-inference-objective": "new", "x-gateway-inference-objective":
                       "old", "x-smg-priority": "bulk"}, {"service_tier": "flex"}) == TierHints(
        objective="new", smg_priority="bulk", service_tier="flex")
