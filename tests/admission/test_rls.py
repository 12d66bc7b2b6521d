"""Recursive least squares: it fits, and it stays finite and accurate over a million updates."""

from __future__ import annotations

import math
import random

import pytest

from admission.rls import Rls

# The TTFT model's shape: (1, prefill / 1000, running * steps / 100), widely varying inputs.
TRUE_THETA = (0.02, 0.125, 0.03)


def samples(rng: random.Random, count: int) -> list[tuple[tuple[float, float, float], float]]:
    out = []
    for _ in range(count):
        prefill = rng.uniform(0, 40_000)
        steps = max(1.0, prefill / 2048)
        x = (1.0, prefill / 1000, rng.randrange(0, 65) * steps / 100)
        y = sum(t * xi for t, xi in zip(TRUE_THETA, x, strict=True)) + abs(rng.gauss(0, 0.3))
        out.append((x, y))
    return out


def is_positive_semidefinite(p: list[list[float]]) -> bool:
    """Sylvester's criterion on the 3x3 leading minors, with rounding slack."""
    a, b, c = p[0][0], p[0][1], p[0][2]
    d, e, f = p[1][1], p[1][2], p[2][2]
    minor2 = a * d - b * b
    det = a * (d * f - e * e) - b * (b * f - e * c) + c * (b * e - d * c)
    return a >= -1e-12 and minor2 >= -1e-12 and det >= -1e-12


@pytest.mark.parametrize("seed", [0, 1])
def test_a_million_updates_stay_finite_symmetric_and_accurate(seed: int) -> None:
    rng = random.Random(seed)
    data = samples(rng, 10_007)
    model = Rls((0.02, 0.1, 0.02), [1.0] * 3, lower=(0.0, 1e-6, 0.0))
    worst_error = 0.0
    for n in range(1_000_000):
        x, y = data[n % len(data)]
        error = model.update(x, y, 0.995)
        if n >= 10_000:
            worst_error = max(worst_error, abs(error))
    assert all(math.isfinite(t) for t in model.theta)
    # noise is |N(0, 0.3)| on answers of up to ~20 s: the fit's error stays of that order
    assert worst_error < 2.5
    p = model.p
    assert all(p[i][j] == p[j][i] for i in range(3) for j in range(3))
    assert is_positive_semidefinite(p)
    assert sum(p[i][i] for i in range(3)) <= 3.0 + 1e-9  # the trace cap
    assert model.theta[1] == pytest.approx(TRUE_THETA[1], rel=0.05)


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
