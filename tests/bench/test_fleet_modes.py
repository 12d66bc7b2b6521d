"""bench.common.fleet_modes on hand-made values: the --mode switch, the static backends a
third-party gateway lists, and when a backend counts as ready in each mode."""

from __future__ import annotations

from typing import Any

import pytest

from bench.common.fleet_modes import Mode, describe, is_ready, key_of, parse_modes, static_backends

DISCOVERED = {"block_size": {"value": 16, "source": "vllm:/metrics"},
              "kv_capacity_tokens": {"value": 4800, "source": "vllm:/metrics"},
              "max_context_tokens": {"value": 8192, "source": "/v1/models"}}
THIRD_PARTY = {"name": "sim-19001", "is_healthy": True, "load_age_s": 0.2, "source": "config",
               "load_source": "metrics", "profile": DISCOVERED}
OWN = {**THIRD_PARTY, "source": "heartbeat", "load_source": "heartbeat",
       "profile": {name: {**field, "source": "heartbeat"} for name, field in DISCOVERED.items()}}


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("both", ("own", "third-party"), id="both-own-first"),
    pytest.param("own", ("own",), id="own"),
    pytest.param("third-party", ("third-party",), id="third-party"),
])
def test_parse_modes(text: str, expected: tuple[str, ...]) -> None:
    assert parse_modes(text) == expected


def test_parse_modes_says_what_it_takes() -> None:
    with pytest.raises(ValueError, match="own, third-party, both"):
        parse_modes("thirdparty")


def test_key_of() -> None:
    assert [key_of(m) for m in parse_modes("both")] == ["own", "third_party"]


def test_static_backends_are_named_as_the_sims_name_themselves() -> None:
    assert static_backends(["http://127.0.0.1:19001", "http://127.0.0.1:19002"], "m") == [
        {"name": "sim-19001", "url": "http://127.0.0.1:19001", "models": ["m"]},
        {"name": "sim-19002", "url": "http://127.0.0.1:19002", "models": ["m"]}]


@pytest.mark.parametrize(("backend", "mode", "expected"), [
    pytest.param(THIRD_PARTY, "third-party", True, id="third-party-ready"),
    pytest.param(OWN, "own", True, id="own-ready"),
    pytest.param(OWN, "third-party", False, id="heartbeat-is-not-third-party"),
    pytest.param(THIRD_PARTY, "own", False, id="config-is-not-own"),
    pytest.param({**THIRD_PARTY, "load_source": "books"}, "third-party", False,
                 id="no-load-metrics"),
    pytest.param({**THIRD_PARTY, "load_age_s": None}, "third-party", False, id="no-load-yet"),
    pytest.param({**THIRD_PARTY, "load_age_s": 4.0}, "third-party", False, id="stale-load"),
    pytest.param({**THIRD_PARTY, "is_healthy": False}, "third-party", False, id="unhealthy"),
    pytest.param({**THIRD_PARTY, "profile": {**DISCOVERED, "block_size": {
        "value": 16, "source": None}}}, "third-party", False, id="profile-not-discovered"),
    pytest.param({**THIRD_PARTY, "profile": {**DISCOVERED, "block_size": {
        "value": 32, "source": "config"}}}, "third-party", False, id="profile-stated"),
])
def test_is_ready(backend: dict[str, Any], mode: Mode, expected: bool) -> None:
    assert is_ready(backend, mode) is expected


def test_describe_says_how_the_gateway_knows_its_backends() -> None:
    known = describe([THIRD_PARTY, {**THIRD_PARTY, "name": "sim-19002"}])
    assert known["num_backends"] == 2
    assert (known["sources"], known["load_sources"]) == (["config"], ["metrics"])
    assert known["profile_sources"] == ["block_size: vllm:/metrics",
                                        "kv_capacity_tokens: vllm:/metrics",
                                        "max_context_tokens: /v1/models"]
