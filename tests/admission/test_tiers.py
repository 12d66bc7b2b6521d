"""Tier resolution: a key narrows the tenant's tier, a request may only ask for a lower one."""

from __future__ import annotations

import pytest

from admission.tiers import (
    DEFAULT_TIERS,
    Tier,
    TierConfigError,
    TierError,
    TierNotAllowedError,
    UnknownTierError,
    allowed_tiers,
    resolve_tier,
    tier_table,
)
from gateway.settings import default_tiers

TIERS = tier_table(DEFAULT_TIERS)


@pytest.mark.parametrize(
    ("tenant", "key", "requested", "expected"),
    [
        pytest.param("standard", None, None, "standard", id="tenant-default"),
        pytest.param("standard", None, "", "standard", id="empty-header-is-default"),
        pytest.param("interactive", "standard", None, "standard", id="key-narrows"),
        pytest.param("standard", "interactive", None, "standard", id="key-cannot-widen"),
        pytest.param("interactive", None, "batch", "batch", id="request-lowers"),
        pytest.param("interactive", "standard", "batch", "batch", id="lower-than-key"),
        pytest.param("standard", None, "standard", "standard", id="same-tier"),
        pytest.param("standard", None, " batch ", "batch", id="header-whitespace"),
    ],
)
def test_resolves(tenant: str, key: str | None, requested: str | None, expected: str) -> None:
    assert resolve_tier(TIERS, tenant, key, requested).name == expected


@pytest.mark.parametrize(
    ("tenant", "key", "requested", "error", "message"),
    [
        pytest.param("standard", None, "interactive", TierNotAllowedError,
                     "this key may use: standard, batch", id="raise-refused"),
        pytest.param("interactive", "batch", "standard", TierNotAllowedError,
                     "this key may use: batch", id="above-the-key"),
        pytest.param("standard", None, "gold", UnknownTierError,
                     "unknown tier 'gold' in x-switchyard-tier", id="unknown-requested"),
        pytest.param("gold", None, None, TierConfigError,
                     "configured tiers: interactive, standard, batch", id="unknown-tenant"),
        pytest.param("standard", "gold", None, TierConfigError, "API key's tier 'gold'",
                     id="unknown-key"),
    ],
)
def test_refuses(tenant: str, key: str | None, requested: str | None,
                 error: type[TierError], message: str) -> None:
    with pytest.raises(error, match=message):
        resolve_tier(TIERS, tenant, key, requested)
    assert issubclass(error, ValueError)


@pytest.mark.parametrize(
    ("tier", "expected_s"),
    [
        pytest.param(Tier("i", 0, 0.5, on_overload="reject"), 0.0, id="reject-never-waits"),
        pytest.param(Tier("s", 1, 2.0, max_queue_wait_s=5.0), 2.0, id="until-slo"),
        pytest.param(Tier("s", 1, 2.0, max_queue_wait_s=1.0), 1.0, id="until-shorter-wait"),
        pytest.param(Tier("s", 1, 2.0), 2.0, id="zero-wait-means-slo"),
        pytest.param(Tier("b", 2, 60.0, max_queue_wait_s=600.0, on_overload="queue"), 600.0,
                     id="queue-past-slo"),
        pytest.param(Tier("b", 2, 60.0, on_overload="queue"), 60.0, id="queue-default-slo"),
    ],
)
def test_max_wait(tier: Tier, expected_s: float) -> None:
    assert tier.max_wait_s == expected_s
    assert tier.queue_deadline_s(10.0) == 10.0 + expected_s


def test_from_settings_matches_defaults() -> None:
    assert tuple(tier_table(default_tiers()).values()) == DEFAULT_TIERS


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"name": ""}, id="no-name"),
        pytest.param({"priority": -1}, id="negative-priority"),
        pytest.param({"ttft_slo_s": 0.0}, id="zero-slo"),
        pytest.param({"max_queue_wait_s": -1.0}, id="negative-wait"),
        pytest.param({"on_overload": "drop"}, id="unknown-overload"),
    ],
)
def test_invalid_tier(fields: dict[str, object]) -> None:
    values: dict[str, object] = {"name": "t", "priority": 0, "ttft_slo_s": 1.0, **fields}
    with pytest.raises(ValueError, match="tier"):
        Tier(**values)  # type: ignore[arg-type]


def test_duplicate_names_refused() -> None:
    with pytest.raises(ValueError, match="repeated"):
        tier_table([*DEFAULT_TIERS, DEFAULT_TIERS[0]])


def test_allowed_tiers_highest_first() -> None:
    assert [t.name for t in allowed_tiers(TIERS, TIERS["interactive"])] == [
        "interactive", "standard", "batch"]
