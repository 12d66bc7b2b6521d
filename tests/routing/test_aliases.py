"""Aliases: smooth weighted round robin over targets, then the other targets, then fallbacks."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from routing.aliases import Alias, ModelAliases, alias_problems


def _picks(aliases: ModelAliases, name: str, num: int) -> list[str]:
    picks = []
    for _ in range(num):
        candidates = aliases.candidates(name)
        assert candidates is not None
        picks.append(candidates[0])
    return picks


@pytest.mark.parametrize(("weights", "num"), [
    pytest.param({"a": 1.0, "b": 1.0}, 100, id="equal"),
    pytest.param({"a": 9.0, "b": 1.0}, 2000, id="canary-10pc"),
    pytest.param({"a": 99.0, "b": 1.0}, 2000, id="canary-1pc"),
    pytest.param({"a": 5.0, "b": 3.0, "c": 2.0}, 1000, id="three"),
    pytest.param({"a": 0.7, "b": 0.3}, 1000, id="fractional"),
])
def test_shares_follow_the_weights_within_one_request(weights: dict[str, float],
                                                       num: int) -> None:
    aliases = ModelAliases([Alias("chat", tuple(weights.items()))])
    counts = Counter(_picks(aliases, "chat", num))
    total = sum(weights.values())
    for model, weight in weights.items():
        assert abs(counts[model] - num * weight / total) <= 1.0, (model, counts)


def test_a_canary_is_spread_out_not_bunched() -> None:
    aliases = ModelAliases([Alias("chat", (("stable", 9.0), ("canary", 1.0)))])
    picks = _picks(aliases, "chat", 100)
    positions = [i for i, model in enumerate(picks) if model == "canary"]
    assert len(positions) == 10
    assert all(later - earlier == 10 for earlier, later in pairwise(positions))


def test_candidates_are_the_pick_then_other_targets_by_weight_then_fallbacks() -> None:
    aliases = ModelAliases([Alias("chat", (("v1", 1.0), ("v2", 5.0), ("v3", 2.0)),
                                  ("small", "v1", "tiny"))])
    seen = {}
    for _ in range(8):
        candidates = aliases.candidates("chat")
        assert candidates is not None
        seen[candidates[0]] = candidates
    assert seen == {
        "v2": ("v2", "v3", "v1", "small", "tiny"),
        "v3": ("v3", "v2", "v1", "small", "tiny"),
        "v1": ("v1", "v2", "v3", "small", "tiny"),
    }


def test_a_model_with_fallbacks_alone_is_its_own_target() -> None:
    aliases = ModelAliases([Alias("big", (("big", 1.0),), ("small",))])
    assert aliases.candidates("big") == ("big", "small")
    assert aliases.candidates("small") is None
    assert "big" in aliases and "small" not in aliases
    assert aliases.names == ["big"]


def test_no_aliases_is_falsy_and_resolves_nothing() -> None:
    aliases = ModelAliases()
    assert not aliases
    assert aliases.candidates("anything") is None


@pytest.mark.parametrize(("aliases", "problem"), [
    pytest.param([Alias("a", (("m", 1.0),)), Alias("a", (("n", 1.0),))],
                 "alias names must be unique; 'a' is repeated", id="repeated-name"),
    pytest.param([Alias("a", ())], "alias 'a' has no targets", id="no-targets"),
    pytest.param([Alias("a", (("m", 1.0), ("m", 2.0)))], "lists the target 'm' twice",
                 id="repeated-target"),
    pytest.param([Alias("a", (("m", 0.0),))], "the weight of 'm' must be > 0", id="zero-weight"),
    pytest.param([Alias("a", (("m", 1.0),), ("b",)), Alias("b", (("n", 1.0),))],
                 "alias 'a' names the alias 'b'", id="fallback-is-an-alias"),
    pytest.param([Alias("a", (("b", 1.0),)), Alias("b", (("a", 1.0),))],
                 "alias 'a' names the alias 'b'", id="a-loop"),
])
def test_problems_are_named(aliases: list[Alias], problem: str) -> None:
    problems = alias_problems(aliases)
    assert any(problem in message for _, message in problems), problems
    with pytest.raises(ValueError, match="alias"):
        ModelAliases(aliases)


def test_an_alias_may_canary_under_its_own_name() -> None:
    aliases = ModelAliases([Alias("llama", (("llama", 95.0), ("llama-next", 5.0)))])
    assert alias_problems([Alias("llama", (("llama", 95.0), ("llama-next", 5.0)))]) == []
    assert alias_problems([Alias("a", (("m", 1.0),)), Alias("a", (("n", 1.0),))]) == [
        (1, "alias names must be unique; 'a' is repeated")]
    assert Counter(_picks(aliases, "llama", 200)) == {"llama": 190, "llama-next": 10}
