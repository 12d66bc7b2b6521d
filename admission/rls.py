"""Recursive least squares with exponential forgetting: a linear model fitted one sample at a time.

For each sample ``(x, y)`` with forgetting factor ``lam`` (0 < lam <= 1)::

    e     = y - theta . x                     the a-priori error
    k     = P x / (lam + x' P x)              the gain
    theta = theta + k e
    P     = (P - k x' P) / lam

This minimises ``sum_i lam^(n-i) (y_i - theta . x_i)^2`` plus the prior's weight
(``P0^-1``): an exponentially weighted linear regression whose memory is about
``1 / (1 - lam)`` samples.

Numerics: the covariance is kept as a square root ``S`` (``P = S S'``) and updated in Potter's
form (``S = (S - g a (S phi) phi') / sqrt(lam)`` with ``phi = S' x``, ``a = 1 / (lam + phi'
phi)``, ``g = 1 / (1 + sqrt(a lam))``), so ``P`` is symmetric and positive semi-definite by
construction whatever the rounding. The textbook update of ``P`` itself is not: with
forgetting, every update multiplies the rounding error by ``1 / lam``, ``P`` loses its
positive definiteness after a few thousand samples of widely varying inputs, and the fit runs
away (errors of 1e6 and more). Two more guards keep it sane online: each variance ``P_ii`` is
capped at its prior (forgetting with poorly varied inputs would otherwise blow the directions
no sample excites up, "windup"; capping each one alone keeps them from shrinking the gain of
the directions that are excited, as one cap on the trace would; rescaling a row of ``S`` is a
congruence, so ``P`` stays positive semi-definite), and ``theta`` is projected onto
``theta >= lower`` (costs are never negative); a fit that still turned non-finite (an absurd
sample) restarts from the prior. O(d^2) per sample for ``d``
features, plain Python (d is 4 here).

Example::

    model = Rls(theta=[0.0, 0.0], prior_variance=[1.0, 1.0])
    for x1 in range(100):
        model.update([1.0, x1 / 10], 0.5 + 0.2 * x1 / 10, lam=0.99)
    model.predict([1.0, 1.0])      # ~0.7
"""

from __future__ import annotations

import math
from collections.abc import Sequence


class Rls:
    """One linear model ``y = theta . x`` fitted online."""

    __slots__ = ("_prior_s", "_prior_theta", "_prior_variance", "lower", "s", "theta")

    def __init__(self, theta: Sequence[float], prior_variance: Sequence[float],
                 lower: Sequence[float] | None = None) -> None:
        if len(theta) != len(prior_variance):
            raise ValueError("theta and prior_variance need the same length")
        if not all(math.isfinite(v) and v > 0 for v in prior_variance):
            raise ValueError(f"prior variances must be finite and > 0, got {prior_variance}")
        n = len(theta)
        self.theta = list(theta)
        self._prior_theta = tuple(theta)
        self._prior_s = tuple(math.sqrt(v) for v in prior_variance)
        self.s = [[self._prior_s[i] if i == j else 0.0 for j in range(n)] for i in range(n)]
        self.lower = list(lower) if lower is not None else [float("-inf")] * n
        self._prior_variance = tuple(prior_variance)

    @property
    def p(self) -> list[list[float]]:
        """The covariance ``S S'`` (symmetric, positive semi-definite)."""
        s = self.s
        n = len(s)
        return [[math.fsum(s[i][k] * s[j][k] for k in range(n)) for j in range(n)]
                for i in range(n)]

    def predict(self, x: Sequence[float]) -> float:
        theta = self.theta
        if len(theta) == 4 == len(x):  # the TTFT model's size, on every request: unrolled
            return theta[0] * x[0] + theta[1] * x[1] + theta[2] * x[2] + theta[3] * x[3]
        return sum(t * xi for t, xi in zip(theta, x, strict=True))

    def update(self, x: Sequence[float], y: float, lam: float) -> float:
        """Fit one sample; returns the a-priori error ``y - predict(x)``."""
        theta, s = self.theta, self.s
        n = len(theta)
        if n == 4 == len(x):  # the TTFT model, once per observed first token
            return self._update4(x, y, lam)
        error = y - self.predict(x)
        phi = [sum(s[i][j] * x[i] for i in range(n)) for j in range(n)]  # S' x
        p_x = [sum(row[j] * phi[j] for j in range(n)) for row in s]  # S phi = P x
        alpha = 1.0 / (lam + sum(v * v for v in phi))
        gamma = 1.0 / (1.0 + math.sqrt(alpha * lam))
        inv_sqrt_lam = 1.0 / math.sqrt(lam)
        lower, cap = self.lower, self._prior_variance
        is_finite = True
        for i in range(n):
            theta[i] = max(lower[i], theta[i] + alpha * p_x[i] * error)
            row = s[i]
            c = gamma * alpha * p_x[i]
            variance = 0.0
            for j in range(n):
                v = (row[j] - c * phi[j]) * inv_sqrt_lam
                row[j] = v
                variance += v * v
            is_finite = is_finite and self._cap_row(row, variance, cap[i])
        if not (is_finite and math.isfinite(sum(theta))):
            self.reset()
        return error

    def _update4(self, x: Sequence[float], y: float, lam: float) -> float:
        """``update`` for d = 4 (the TTFT model's size), unrolled: 3x faster in CPython."""
        theta, s, lower, cap = self.theta, self.s, self.lower, self._prior_variance
        x0, x1, x2, x3 = x
        t0, t1, t2, t3 = theta
        error = y - (t0 * x0 + t1 * x1 + t2 * x2 + t3 * x3)
        r0, r1, r2, r3 = s
        phi0 = r0[0] * x0 + r1[0] * x1 + r2[0] * x2 + r3[0] * x3
        phi1 = r0[1] * x0 + r1[1] * x1 + r2[1] * x2 + r3[1] * x3
        phi2 = r0[2] * x0 + r1[2] * x1 + r2[2] * x2 + r3[2] * x3
        phi3 = r0[3] * x0 + r1[3] * x1 + r2[3] * x2 + r3[3] * x3
        alpha = 1.0 / (lam + phi0 * phi0 + phi1 * phi1 + phi2 * phi2 + phi3 * phi3)
        gamma_alpha = alpha / (1.0 + math.sqrt(alpha * lam))
        inv_sqrt_lam = 1.0 / math.sqrt(lam)
        is_finite = True
        for i, row in enumerate(s):
            a, b, c, d = row
            p_x = a * phi0 + b * phi1 + c * phi2 + d * phi3
            theta[i] = max(lower[i], theta[i] + alpha * p_x * error)
            k = gamma_alpha * p_x
            a = (a - k * phi0) * inv_sqrt_lam
            b = (b - k * phi1) * inv_sqrt_lam
            c = (c - k * phi2) * inv_sqrt_lam
            d = (d - k * phi3) * inv_sqrt_lam
            row[0], row[1], row[2], row[3] = a, b, c, d
            variance = a * a + b * b + c * c + d * d
            if variance > cap[i] or variance != variance:
                is_finite = self._cap_row(row, variance, cap[i]) and is_finite
        if not (is_finite and math.isfinite(theta[0] + theta[1] + theta[2] + theta[3])):
            self.reset()
        return error

    @staticmethod
    def _cap_row(row: list[float], variance: float, cap: float) -> bool:
        """Scale ``row`` of ``S`` so that its variance ``P_ii`` is at most ``cap``; False when
        the variance is not finite."""
        if not math.isfinite(variance):
            return False
        if variance > cap:
            scale = math.sqrt(cap / variance)
            for j in range(len(row)):
                row[j] *= scale
        return True

    def reset(self) -> None:
        """Back to the prior: the starting fit and covariance."""
        n = len(self.theta)
        self.theta = list(self._prior_theta)
        self.s = [[self._prior_s[i] if i == j else 0.0 for j in range(n)] for i in range(n)]
