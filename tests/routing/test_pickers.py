"""Pickers: best score, softmax, power of two, random, round robin; seeded rng reproduces."""

from __future__ import annotations

from collections import Counter
from random import Random

import pytest

from routing.plugin import Picker, below
from routing.plugins.pickers import (
    MaxScorePicker,
    PowerOfTwoPicker,
    RandomPicker,
    RoundRobinPicker,
    SoftmaxPicker,
)
from tests.routing.builders import backend

CANDIDATES = [backend(f"w{i}") for i in range(4)]


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_below_draws_what_randrange_draws_from_the_same_stream(seed: int) -> None:
    """The pickers and the shortlist use ``below`` for ``randrange``: the same seed must give
    the same decisions as before (the simulator's figures depend on it)."""
    ours, theirs = Random(seed), Random(seed)
    sizes = [n for n in range(1, 70)] + [2**k for k in range(1, 12)] + [1000, 4097]
    assert [below(ours, n) for n in sizes * 5] == [theirs.randrange(n) for n in sizes * 5]
    assert ours.random() == theirs.random()  # the streams stay in step after


def picks(picker: Picker, scores: list[float], num_picks: int = 400,
          seed: int = 0) -> Counter[int]:
    rng = Random(seed)
    return Counter(picker.pick(CANDIDATES[:len(scores)], scores, rng) for _ in range(num_picks))


@pytest.mark.parametrize(
    ("scores", "allowed"),
    [
        pytest.param([0.1, 0.9, 0.5, 0.2], {1}, id="single-best"),
        pytest.param([0.9, 0.1, 0.9, 0.2], {0, 2}, id="tie-between-two"),
        pytest.param([0.3], {0}, id="one-candidate"),
    ],
)
def test_max_score_picks_a_best(scores: list[float], allowed: set[int]) -> None:
    assert set(picks(MaxScorePicker(), scores)) == allowed


def test_max_score_breaks_ties_at_random() -> None:
    counts = picks(MaxScorePicker(), [1.0, 1.0, 1.0, 0.0])
    assert set(counts) == {0, 1, 2}
    assert min(counts.values()) > 80


@pytest.mark.parametrize(
    ("temperature", "best_share"),
    [
        pytest.param(0.01, (0.99, 1.0), id="cold-is-argmax"),
        pytest.param(100.0, (0.2, 0.32), id="hot-is-uniform"),
    ],
)
def test_softmax_temperature(temperature: float, best_share: tuple[float, float]) -> None:
    counts = picks(SoftmaxPicker(temperature), [0.0, 1.0, 0.5, 0.2], num_picks=2000)
    low, high = best_share
    assert low <= counts[1] / 2000 <= high


def test_softmax_temperature_must_be_positive() -> None:
    with pytest.raises(ValueError, match="temperature must be > 0"):
        SoftmaxPicker(0)


def test_power_of_two_never_takes_the_worst_and_favours_the_best() -> None:
    counts = picks(PowerOfTwoPicker(), [0.4, 0.9, 0.1, 0.6], num_picks=1200)
    assert counts[2] == 0  # the worst loses every pair it is in
    assert counts[1] == max(counts.values())
    assert counts[1] / 1200 == pytest.approx(0.5, abs=0.06)  # in 3 of the 6 pairs


def test_power_of_two_with_one_candidate() -> None:
    assert PowerOfTwoPicker().pick(CANDIDATES[:1], [0.0], Random(0)) == 0


def test_random_ignores_scores() -> None:
    counts = picks(RandomPicker(), [1.0, 0.0, 0.0, 0.0], num_picks=2000)
    assert all(400 < n < 600 for n in counts.values())


def test_round_robin_rotates_and_keeps_its_own_counter() -> None:
    first, second = RoundRobinPicker(), RoundRobinPicker()
    rng = Random(0)
    assert [first.pick(CANDIDATES, [0.0] * 4, rng) for _ in range(6)] == [0, 1, 2, 3, 0, 1]
    assert second.pick(CANDIDATES, [0.0] * 4, rng) == 0
    second.start_at(6)  # a replica's own start: out of step with the others
    assert [second.pick(CANDIDATES, [0.0] * 4, rng) for _ in range(3)] == [2, 3, 0]


def test_each_gateway_process_starts_its_rotation_elsewhere() -> None:
    from gateway.app import scheduling_profile
    from gateway.settings import RoutingSettings

    settings = RoutingSettings(profile="round_robin")
    firsts = {scheduling_profile(settings).picker.pick(CANDIDATES, [0.0] * 4, Random(0))
              for _ in range(40)}
    assert len(firsts) > 1  # in step, every one would start at 0


@pytest.mark.parametrize(
    "picker",
    [
        pytest.param(MaxScorePicker(), id="max_score"),
        pytest.param(SoftmaxPicker(0.5), id="softmax"),
        pytest.param(PowerOfTwoPicker(), id="power_of_two"),
        pytest.param(RandomPicker(), id="random"),
    ],
)
def test_same_seed_same_picks(picker: Picker) -> None:
    scores = [0.5, 0.5, 0.4, 0.5]

    def sequence(seed: int) -> list[int]:
        rng = Random(seed)
        return [picker.pick(CANDIDATES, scores, rng) for _ in range(50)]

    assert sequence(3) == sequence(3)
