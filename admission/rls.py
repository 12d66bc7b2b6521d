"""Recursive least squares with exponential forgetting: a linear model fitted one sample at a time.

For each sample ``(x, y)`` with forgetting factor ``lam`` (0 < lam <= 1)::

    e     = y - theta . x                     the a-priori error
    k     = P x / (lam + x' P x)              the gain
    theta = theta + k e
    P     = (P - k x' P) / lam

This minimises ``sum_i lam^(n-i) (y_i - theta . x_i)^2`` plus the prior's weight
(``P0^-1``): an exponentially weighted linear regression whose memory is about
``1 / (1 - lam)`` samples. Two guards keep it sane online: ``P``'s trace is capped at its
initial trace (forgetting with poorly varied inputs would otherwise blow it up: "windup"), and
``theta`` is projected onto ``theta >= lower`` (costs are never negative). O(d^2) per sample
for ``d`` features, plain Python (d is 3 here).

Example::

    model = Rls(theta=[0.0, 0.0], prior_variance=[1.0, 1.0])
    for x1 in range(100):
        model.update([1.0, x1 / 10], 0.5 + 0.2 * x1 / 10, lam=0.99)
    model.predict([1.0, 1.0])      # ~0.7
"""

from __future__ import annotations

from collections.abc import Sequence


class Rls:
    """One linear model ``y = theta . x`` fitted online."""

    __slots__ = ("_max_trace", "lower", "p", "theta")

    def __init__(self, theta: Sequence[float], prior_variance: Sequence[float],
                 lower: Sequence[float] | None = None) -> None:
        if len(theta) != len(prior_variance):
            raise ValueError("theta and prior_variance need the same length")
        n = len(theta)
        self.theta = list(theta)
        self.p = [[prior_variance[i] if i == j else 0.0 for j in range(n)] for i in range(n)]
        self.lower = list(lower) if lower is not None else [float("-inf")] * n
        self._max_trace = sum(prior_variance)

    def predict(self, x: Sequence[float]) -> float:
        theta = self.theta
        if len(theta) == 3 == len(x):  # the TTFT model's size, on every request: unrolled
            return theta[0] * x[0] + theta[1] * x[1] + theta[2] * x[2]
        return sum(t * xi for t, xi in zip(theta, x, strict=True))

    def update(self, x: Sequence[float], y: float, lam: float) -> float:
        """Fit one sample; returns the a-priori error ``y - predict(x)``."""
        theta, p = self.theta, self.p
        n = len(theta)
        error = y - self.predict(x)
        px = [sum(p[i][j] * x[j] for j in range(n)) for i in range(n)]
        denominator = lam + sum(x[i] * px[i] for i in range(n))
        gain = [v / denominator for v in px]
        for i in range(n):
            theta[i] = max(self.lower[i], theta[i] + gain[i] * error)
            row = p[i]
            for j in range(n):
                # P symmetric, so x' P = (P x)'
                row[j] = (row[j] - gain[i] * px[j]) / lam
        trace = sum(p[i][i] for i in range(n))
        if trace > self._max_trace:
            scale = self._max_trace / trace
            for row in p:
                for j in range(n):
                    row[j] *= scale
        return error

