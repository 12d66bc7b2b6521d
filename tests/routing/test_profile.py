"""build_profile: YAML-like dicts to profiles; every mistake is a ValueError naming its key."""

from __future__ import annotations

from typing import Any

import pytest

from routing.plugins.filters import HealthyFilter, ModelFilter, NotSaturatedFilter
from routing.plugins.pickers import MaxScorePicker, SoftmaxPicker
from routing.plugins.scorers import PrefixScorer, QueueScorer
from routing.profile import build_profile

EXAMPLE = {
    "filters": [{"type": "model"}, {"type": "healthy"}, {"type": "fresh"},
                {"type": "not_saturated", "max_waiting": 64}],
    "scorers": [{"type": "prefix", "weight": 3}, {"type": "queue", "weight": 1}],
    "picker": {"type": "max_score"},
}


def test_builds_the_example() -> None:
    profile = build_profile(EXAMPLE, name="example")
    assert profile.name == "example"
    assert [type(f) for f in profile.filters[:2]] == [ModelFilter, HealthyFilter]
    saturation = profile.filters[3]
    assert isinstance(saturation, NotSaturatedFilter)
    assert saturation.max_waiting == 64
    assert [(s.name, type(s.scorer), s.weight) for s in profile.scorers] == [
        ("prefix", PrefixScorer, 3.0), ("queue", QueueScorer, 1.0)]
    assert isinstance(profile.picker, MaxScorePicker)


def test_defaults() -> None:
    profile = build_profile({"scorers": [{"type": "queue"}]})
    assert profile.filters == ()
    assert profile.scorers[0].weight == 1.0
    assert isinstance(profile.picker, MaxScorePicker)


def test_picker_settings() -> None:
    picker = build_profile({"picker": {"type": "softmax", "temperature": 0.5}}).picker
    assert isinstance(picker, SoftmaxPicker)
    assert picker.temperature == 0.5


def test_config_is_not_modified() -> None:
    config: dict[str, Any] = {"scorers": [{"type": "queue", "weight": 2}]}
    build_profile(config)
    assert config == {"scorers": [{"type": "queue", "weight": 2}]}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param({"filter": []}, r"^filter: unknown profile key; expected filters, "
                     r"scorers, picker, shortlist$", id="unknown-section"),
        pytest.param({"filters": {"type": "model"}}, r"^filters: expected a list",
                     id="section-not-a-list"),
        pytest.param({"filters": ["model"]}, r"^filters\[0\]: expected a mapping",
                     id="entry-not-a-mapping"),
        pytest.param({"filters": [{"type": "model"}, {"kind": "healthy"}]},
                     r"^filters\[1\]\.type: missing", id="missing-type"),
        pytest.param({"filters": [{"type": "healty"}]},
                     r"^filters\[0\]\.type: unknown filter 'healty'; known: .*healthy",
                     id="unknown-filter"),
        pytest.param({"filters": [{"type": "not_saturated", "max_queue": 3}]},
                     r"^filters\[0\]\.max_queue: filter 'not_saturated' takes max_waiting, "
                     r"max_kv_usage$", id="unknown-setting"),
        pytest.param({"filters": [{"type": "not_saturated", "max_waiting": "lots"}]},
                     r"^filters\[0\]: max_waiting must be a number", id="bad-setting-value"),
        pytest.param({"scorers": [{"type": "queue"}, {"type": "prefix", "weight": -1}]},
                     r"^scorers\[1\]\.weight must be >= 0", id="negative-weight"),
        pytest.param({"scorers": [{"type": "prefix", "weight": "3"}]},
                     r"^scorers\[0\]\.weight must be a number", id="weight-not-a-number"),
        pytest.param({"scorers": [{"type": "latency"}]},
                     r"^scorers\[0\]\.type: unknown scorer 'latency'", id="unknown-scorer"),
        pytest.param({"picker": {"type": "best"}}, r"^picker\.type: unknown picker 'best'",
                     id="unknown-picker"),
        pytest.param({"picker": {"type": "softmax", "temperature": 0}},
                     r"^picker: temperature must be > 0", id="bad-picker-setting"),
        pytest.param({"picker": "max_score"}, r"^picker: expected a mapping",
                     id="picker-not-a-mapping"),
        pytest.param(["filters"], r"expected a mapping", id="config-not-a-mapping"),
        pytest.param({"shortlist": 8}, r"^shortlist: expected a mapping",
                     id="shortlist-not-a-mapping"),
        pytest.param({"shortlist": {"above": 16, "sample": 8}},
                     r"^shortlist\.sample: unknown setting; expected above, holders, sampled$",
                     id="shortlist-unknown-setting"),
        pytest.param({"shortlist": {"holders": -1}}, r"^shortlist\.holders must be >= 0",
                     id="shortlist-negative"),
        pytest.param({"shortlist": {"sampled": 2.5}},
                     r"^shortlist\.sampled must be a whole number", id="shortlist-fraction"),
        pytest.param({"shortlist": {"holders": 0, "sampled": 0}},
                     r"^shortlist: holders \+ sampled must be at least 1",
                     id="shortlist-empty"),
    ],
)
def test_errors_name_the_bad_key(config: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_profile(config)
