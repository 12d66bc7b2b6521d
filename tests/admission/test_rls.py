"""Recursive least squares: it fits, and it stays finite and accurate over a million updates."""

from __future__ import annotations

import math
import random

import pytest

from admission.rls import Rls

# The TTFT model's shape: (1, prefill / 1000, running * steps / 100, ahead / 10), widely
# varying inputs.
TRUE_THETA = (0.02, 0.125, 0.03, 0.5)


def samples(rng: random.Random, count: int, dims: int = 4) -> list[tuple[tuple[float, ...], float]]:
    out = []
    for _ in range(count):
        prefill = rng.uniform(0, 40_000)
        steps = max(1.0, prefill / 2048)
        x = (1.0, prefill / 1000, rng.randrange(0, 65) * steps / 100,
             rng.randrange(0, 20) / 10)[:dims]
        y = sum(t * xi for t, xi in zip(TRUE_THETA, x, strict=False)) + abs(rng.gauss(0, 0.3))
        out.append((x, y))
    return out


def is_positive_semidefinite(p: list[list[float]]) -> bool:
    """A Cholesky factorisation exists (with rounding slack on the pivots)."""
    n = len(p)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            total = p[i][j] - sum(low[i][k] * low[j][k] for k in range(j))
            if i == j:
                if total < -1e-12:
                    return False
                low[i][i] = math.sqrt(max(total, 0.0))
            else:
                low[i][j] = total / low[j][j] if low[j][j] > 1e-15 else 0.0
    return True


@pytest.mark.parametrize(
    ("seed", "dims", "count"),
    [
        pytest.param(0, 4, 1_000_000, id="ttft-shape-seed0-1e6"),
        pytest.param(1, 4, 1_000_000, id="ttft-shape-seed1-1e6"),
        pytest.param(2, 3, 200_000, id="generic-3-features"),
    ],
)
def test_a_million_updates_stay_finite_symmetric_and_accurate(seed: int, dims: int,
                                                              count: int) -> None:
    rng = random.Random(seed)
    data = samples(rng, 10_007, dims)
    model = Rls((0.02, 0.1, 0.02, 0.5)[:dims], [1.0] * dims, lower=(0.0, 1e-6, 0.0, 0.0)[:dims])
    worst_error = 0.0
    for n in range(count):
        x, y = data[n % len(data)]
        error = model.update(x, y, 0.995)
        if n >= 10_000:
            worst_error = max(worst_error, abs(error))
    assert all(math.isfinite(t) for t in model.theta)
    # noise is |N(0, 0.3)| on answers of up to ~20 s: the fit's error stays of that order
    assert worst_error < 2.5
    p = model.p
    assert all(p[i][j] == p[j][i] for i in range(dims) for j in range(dims))
    assert is_positive_semidefinite(p)
    assert all(p[i][i] <= 1.0 + 1e-9 for i in range(dims))  # each variance capped at its prior
    assert model.theta[1] == pytest.approx(TRUE_THETA[1], rel=0.05)


def test_an_unexcited_feature_does_not_change_the_others() -> None:
    """A feature that stays 0 must not eat the covariance of those that vary (one cap on the
    trace did, and slowed their tracking): the fit is the one without that feature."""
    rng = random.Random(3)
    with_idle = Rls((0.0, 0.1, 0.0), [1.0] * 3, lower=(0.0, 0.0, 0.0))
    without = Rls((0.0, 0.1), [1.0] * 2, lower=(0.0, 0.0))
    for slope in (0.125, 0.25):
        for _ in range(400):
            x1 = rng.uniform(0, 16)
            with_idle.update((1.0, x1, 0.0), 0.03 + slope * x1, lam=0.995)
            without.update((1.0, x1), 0.03 + slope * x1, lam=0.995)
    assert with_idle.theta[:2] == pytest.approx(without.theta, rel=1e-9)


def test_fits_a_line() -> None:
    model = Rls(theta=[0.0, 0.0], prior_variance=[1.0, 1.0])
    for x1 in range(200):
        model.update([1.0, x1 / 10], 0.5 + 0.2 * x1 / 10, lam=0.99)
    assert model.predict([1.0, 1.0]) == pytest.approx(0.7, abs=0.01)


def test_projection_keeps_coefficients_above_lower() -> None:
    model = Rls([0.5], [1.0], lower=[0.1])
    for _ in range(100):
        model.update([1.0], -3.0, lam=0.99)
    assert model.theta == [0.1]


def test_an_absurd_sample_restarts_from_the_prior() -> None:
    model = Rls([0.3, 0.1], [1.0, 1.0])
    model.update([1.0, 1e300], 1e300, lam=0.99)
    model.update([1.0, 1e300], -1e300, lam=0.99)
    assert all(math.isfinite(t) for t in model.theta)
    assert model.predict([1.0, 1.0]) == pytest.approx(0.4)


def test_refuses_bad_priors() -> None:
    with pytest.raises(ValueError, match="same length"):
        Rls([0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="prior variances"):
        Rls([0.0], [0.0])
