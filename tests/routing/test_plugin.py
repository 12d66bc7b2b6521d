"""Cycle: staleness counts the snapshot's own age; cached tokens come from the prefix match."""

from __future__ import annotations

import math

import pytest

from routing.plugin import check_number
from tests.routing.builders import NOW_S, backend, cycle, request


@pytest.mark.parametrize(
    ("age_s", "now_s", "is_stale"),
    [
        pytest.param(0.0, NOW_S, False, id="just-observed"),
        pytest.param(5.0, NOW_S, False, id="at-the-bound-is-fresh"),
        pytest.param(5.1, NOW_S, True, id="past-the-bound"),
        pytest.param(3.0, NOW_S + 2.5, True, id="snapshot-aged-since-taken"),
        pytest.param(3.0, NOW_S - 1.0, False, id="now-before-snapshot-adds-nothing"),
    ],
)
def test_is_stale_counts_backend_and_snapshot_age(age_s: float, now_s: float,
                                                  is_stale: bool) -> None:
    b = backend("a", age_s=age_s)
    c = cycle(b, now_s=now_s, max_age_s=5.0)
    assert c.is_stale(b) is is_stale
    assert c.has_stale([b]) is is_stale


def test_has_stale_of_no_candidates_is_false() -> None:
    assert cycle().has_stale([]) is False


@pytest.mark.parametrize(
    ("num_blocks", "block_tokens", "num_prompt_tokens", "cached"),
    [
        pytest.param(0, 16, 100, 0, id="no-match"),
        pytest.param(3, 16, 100, 48, id="three-blocks"),
        pytest.param(10, 16, 100, 100, id="capped-at-prompt"),
    ],
)
def test_num_cached_tokens(num_blocks: int, block_tokens: int, num_prompt_tokens: int,
                           cached: int) -> None:
    b = backend("a")
    c = cycle(b, req=request(num_prompt_tokens), matched={"a": num_blocks},
              block_tokens=block_tokens)
    assert c.num_cached_tokens(b) == cached


@pytest.mark.parametrize(
    ("value", "limits", "error"),
    [
        pytest.param(3, {}, None, id="int-ok"),
        pytest.param(0.5, {"minimum": 0, "maximum": 1}, None, id="in-range"),
        pytest.param("3", {}, "must be a number", id="string"),
        pytest.param(True, {}, "must be a number", id="bool"),
        pytest.param(math.inf, {}, "must be finite", id="inf"),
        pytest.param(-1, {"minimum": 0}, "must be >= 0", id="below-minimum"),
        pytest.param(0, {"above": 0}, "must be > 0", id="not-above"),
        pytest.param(2, {"maximum": 1}, "must be <= 1", id="above-maximum"),
    ],
)
def test_check_number_names_the_key(value: object, limits: dict[str, float],
                                    error: str | None) -> None:
    if error is None:
        assert check_number("k", value, **limits) == float(value)  # type: ignore[arg-type]
    else:
        with pytest.raises(ValueError, match=f"^k {error}"):
            check_number("k", value, **limits)
