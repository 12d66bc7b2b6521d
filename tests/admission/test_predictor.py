"""The TTFT predictor: features from a snapshot, a fit that converges, its error reported."""

from __future__ import annotations

import random

import pytest

from admission.predictor import (
    PredictorConfig,
    TtftFeatures,
    TtftPredictor,
    snapshot_features,
    ttft_features,
)
from admission.rls import Rls
from routing.types import BackendProfile, BackendState, FleetSnapshot

STALE_S = 60.0

# The "true" engine for the synthetic data: 30 ms base, 8,000 prefill tokens/s,
# 0.4 ms per running sequence per 2,048-token step.
BASE_S, S_PER_TOKEN, RUNNING_STEP_S = 0.03, 1 / 8000, 4e-4


def true_ttft_s(f: TtftFeatures) -> float:
    steps = max(1.0, f.prefill_tokens / 2048)
    return BASE_S + f.prefill_tokens * S_PER_TOKEN + f.num_running * steps * RUNNING_STEP_S


def sample(rng: random.Random) -> TtftFeatures:
    return TtftFeatures(rng.randrange(0, 16_000), rng.randrange(0, 4000), rng.randrange(0, 64))


def backend(name: str = "w0", **fields: object) -> BackendState:
    return BackendState(name=name, models=frozenset({"m"}), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("b", "expected"),
    [
        pytest.param(backend(num_queued_prefill_tokens=3000, num_in_flight_prompt_tokens=1000,
                             num_running=5), TtftFeatures(3000, 500, 5), id="fresh-engine-larger"),
        pytest.param(backend(num_queued_prefill_tokens=100, num_in_flight_prompt_tokens=1000),
                     TtftFeatures(1000, 500, 0), id="fresh-gateway-larger"),
        pytest.param(backend(age_s=0.25, num_queued_prefill_tokens=3000,
                             num_in_flight_prompt_tokens=200),
                     TtftFeatures(500, 500, 0), id="engine-backlog-drained-since-reported"),
        pytest.param(backend(age_s=STALE_S, num_queued_prefill_tokens=0,
                             num_in_flight_prompt_tokens=1000, num_running=1, num_in_flight=3),
                     TtftFeatures(4000 + 1000, 500, 3), id="stale-worst-plus-own"),
    ],
)
def test_features(b: BackendState, expected: TtftFeatures) -> None:
    assert ttft_features(b, 500, max_age_s=5.0, worst_queued_tokens=4000) == expected


def test_snapshot_features_finds_the_backend() -> None:
    snapshot = FleetSnapshot(now_s=0.0, backends=(backend("a", num_queued_prefill_tokens=700),
                                                  backend("b", age_s=STALE_S)))
    assert snapshot_features(snapshot, "b", 100) == TtftFeatures(700, 100, 0)
    with pytest.raises(KeyError):
        snapshot_features(snapshot, "zz", 100)


def test_starts_from_advertised_speed() -> None:
    predictor = TtftPredictor(PredictorConfig(default_base_s=0.0))
    fast = backend(profile=BackendProfile(prefill_tokens_per_s=20_000))
    assert predictor.predict_s(fast, TtftFeatures(0, 20_000)) == pytest.approx(1.0)
    assert predictor.predict_s("unseen", TtftFeatures(0, 20_000)) == pytest.approx(2.0)


def test_converges_on_noisy_linear_data_and_reports_error() -> None:
    rng = random.Random(7)
    predictor = TtftPredictor()
    b = backend()
    for _ in range(600):
        f = sample(rng)
        predictor.observe(b, f, true_ttft_s(f) * rng.uniform(0.9, 1.1))
    held_out = [sample(rng) for _ in range(200)]
    mape = sum(abs(predictor.predict_s(b, f) - true_ttft_s(f)) / true_ttft_s(f)
               for f in held_out) / len(held_out)
    assert mape < 0.10
    fit = predictor.coefficients("w0")
    assert fit.prefill_tokens_per_s == pytest.approx(8000, rel=0.1)
    stats = predictor.error_stats("w0")
    assert stats.count == 256  # the window
    assert stats.mape < 0.10  # the window's a-priori errors: converged, noise is +-10 %
    assert abs(stats.bias_s) < 0.05
    assert predictor.error_stats().count == 256


def test_new_backend_starts_from_the_fleet_fit() -> None:
    rng = random.Random(1)
    predictor = TtftPredictor()
    for _ in range(300):
        f = sample(rng)
        predictor.observe(f"w{rng.randrange(4)}", f, true_ttft_s(f))
    f = TtftFeatures(8000, 1000, 10)
    assert predictor.predict_s("new", f) == pytest.approx(true_ttft_s(f), rel=0.1)
    assert predictor.error_stats("new").count == 0


def test_tracks_a_backend_that_slows_down() -> None:
    predictor = TtftPredictor()
    rng = random.Random(3)
    for speed in (8000, 4000):
        for _ in range(400):
            f = sample(rng)
            predictor.observe("w0", f, BASE_S + f.prefill_tokens / speed)
    assert predictor.coefficients("w0").prefill_tokens_per_s == pytest.approx(4000, rel=0.1)


def test_error_stats_signs_and_refuses_bad_input() -> None:
    predictor = TtftPredictor(PredictorConfig(default_base_s=0.0, default_running_step_s=0.0))
    predictor.observe("w0", TtftFeatures(0, 10_000), ttft_s=0.5)  # predicted 1.0 s
    stats = predictor.error_stats("w0")
    assert stats.count == 1
    assert stats.mape == pytest.approx(1.0)
    assert stats.bias_s == pytest.approx(0.5)
    with pytest.raises(ValueError, match="ttft_s"):
        predictor.observe("w0", TtftFeatures(0, 1), ttft_s=float("nan"))
    assert predictor.error_stats("never").count == 0


def test_prediction_is_never_negative() -> None:
    predictor = TtftPredictor()
    for _ in range(50):
        predictor.observe("w0", TtftFeatures(0, 100), ttft_s=0.0)
    assert predictor.predict_s("w0", TtftFeatures(0, 0)) >= 1e-3
    assert all(c >= 0 for c in Rls([0.0], [1.0], lower=[0.0]).theta)


def test_deterministic() -> None:
    def run() -> tuple[float, ...]:
        rng = random.Random(11)
        predictor = TtftPredictor()
        for _ in range(100):
            f = sample(rng)
            predictor.observe("w0", f, true_ttft_s(f))
        return tuple(predictor.predict_s("w0", sample(rng)) for _ in range(10))

    assert run() == run()


@pytest.mark.parametrize(
    ("b", "num_ahead"),
    [
        pytest.param(backend(num_waiting=3), 3, id="engine-queue"),
        pytest.param(backend(num_waiting=1, num_in_flight=12,
                             profile=BackendProfile(max_batch=8)), 4,
                     id="gateway-in-flight-beyond-max-batch"),
        pytest.param(backend(age_s=STALE_S, num_waiting=9, num_in_flight=10,
                             profile=BackendProfile(max_batch=8)), 2, id="stale-own-count"),
        pytest.param(backend(age_s=STALE_S, num_waiting=9), 0, id="stale-unknown"),
    ],
)
def test_requests_ahead_without_a_slot(b: BackendState, num_ahead: int) -> None:
    assert ttft_features(b, 100, max_age_s=5.0).num_ahead == num_ahead


def test_learns_the_wait_for_a_batch_slot_from_scraped_load_alone() -> None:
    """No queued-prefill figure (a vLLM server): the requests ahead in the engine's queue
    still explain the TTFT, and the fit learns what each costs (0.4 s here)."""
    rng = random.Random(5)
    predictor = TtftPredictor()
    for _ in range(800):
        f = TtftFeatures(0, rng.randrange(100, 2000), rng.randrange(0, 8), rng.randrange(0, 12))
        predictor.observe("vllm-0", f, true_ttft_s(f) + 0.4 * f.num_ahead)
    assert predictor.coefficients("vllm-0").per_ahead_s == pytest.approx(0.4, rel=0.05)
    f = TtftFeatures(0, 1000, 4, 10)
    assert predictor.predict_s("vllm-0", f) == pytest.approx(true_ttft_s(f) + 4.0, rel=0.05)


def test_margin_is_how_late_first_tokens_came_lately() -> None:
    predictor = TtftPredictor(PredictorConfig(forgetting=1.0, prior_variance=1e-12))
    assert predictor.margin_s("w0") == 0.0
    f = TtftFeatures(0, 1000)
    predicted = predictor.predict_s("w0", f)
    for i in range(100):  # a fit that cannot move: first tokens come 0..0.99 s late
        predictor.observe("w0", f, predicted + i / 100)
    # the 90th percentile of the last 64 (0.36..0.99 s late)
    assert predictor.margin_s("w0") == pytest.approx(0.93, abs=0.02)
    assert predictor.margin_s("other") == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quickest_is_the_per_backend_loop_in_one_pass(seed: int) -> None:
    """``quickest`` gives exactly the index and figure of ``predict_s`` + ``margin_s`` over
    ``ttft_features`` per backend: fitted and unseen backends, fresh and stale figures,
    advertised prefill speeds, batch limits, and ties (the first wins)."""
    rng = random.Random(seed)
    predictor = TtftPredictor()
    backends = []
    for i in range(40):
        profile = BackendProfile(
            max_batch=rng.choice([None, 4, 16]),
            prefill_tokens_per_s=rng.choice([None, 5_000.0, 20_000.0]),
            relative_speed=rng.choice([1.0, 0.5, 2.0]))
        backends.append(backend(
            f"w{i}", profile=profile, age_s=rng.choice([0.1, 9.0]),
            num_running=rng.randrange(20), num_waiting=rng.randrange(5),
            num_queued_prefill_tokens=rng.randrange(8_000), num_in_flight=rng.randrange(24),
            num_in_flight_prompt_tokens=rng.randrange(6_000)))
    backends.append(backends[3])  # a tie with an earlier one
    for b in backends[:25]:  # fitted models and lateness margins for some
        for _ in range(12):
            features = ttft_features(b, rng.randrange(3_000), max_age_s=5.0)
            predictor.observe(b, features, rng.uniform(0.01, 0.5))
    uncached = [rng.randrange(-10, 4_000) for _ in backends]
    worst = max(b.num_queued_prefill_tokens for b in backends)
    expected = [predictor.predict_s(b, ttft_features(b, u, max_age_s=5.0,
                                                     worst_queued_tokens=worst))
                + predictor.margin_s(b) for b, u in zip(backends, uncached, strict=True)]
    index, best_s = predictor.quickest(backends, uncached, max_age_s=5.0,
                                       worst_queued_tokens=worst)
    assert best_s == min(expected)
    assert index == expected.index(min(expected))
    assert any(predictor.margin_s(b) > 0 for b in backends)
