"""Time to first token, predicted per backend from the fleet snapshot and fitted online.

The model (one per backend, plus a fleet-wide one that seeds new backends)::

    prefill_tokens = queued_tokens + uncached_tokens       work ahead of the first token
    steps          = max(1, prefill_tokens / step_tokens)  engine steps until it is done
    ttft_s         = base_s
                   + prefill_tokens * s_per_token                    1 / prefill speed
                   + num_running * steps * running_step_s            decode interference
                   + num_ahead * per_ahead_s                         waiting for a batch slot

``queued_tokens`` follows ``routing.plugins.ttft``: the larger of the engine's
``num_queued_prefill_tokens`` (less what it prefilled since it reported it,
``BackendState.queued_prefill_now``) and the gateway's ``num_in_flight_prompt_tokens`` when the
backend's figures are fresh (the engine's count already includes what it has received of
ours); when stale, the worst engine backlog among the candidates plus ours. Decode
interference: each engine step that works on the prefill also decodes every running sequence.
``num_ahead``: requests ahead of it that have no batch slot (the engine's waiting count, or
this gateway's in-flight requests beyond ``max_batch``): each waits for a running one to end,
which scraped load alone (no queued-prefill figure) otherwise cannot see.

Fitting: recursive least squares with forgetting (``admission.rls``; memory about
``1 / (1 - forgetting)`` observations) on the features ``(1, prefill_tokens / 1000,
num_running * steps / 100, num_ahead / 10)``. A backend seen for the first time starts from
the fleet model's current fit, with ``s_per_token = 1 / profile.prefill_tokens_per_s`` when
it advertises one. Every observation updates both its backend's model and the fleet's.

Observe the TTFT from dispatch to first token (the gateway queue's wait is not the engine's),
with the features taken when the request was dispatched. Before each update the prediction
is scored: ``error_stats()`` gives MAPE, bias and count over the last ``window`` observations,
and ``margin_s(backend)`` how late the backend's first tokens came against their predictions
(a high quantile), which admission adds before comparing with an SLO.

Example::

    predictor = TtftPredictor()
    features = ttft_features(backend, uncached_tokens=1800, max_age_s=snapshot.max_age_s)
    predictor.predict_s(backend, features)          # 0.21
    predictor.observe(backend, features, ttft_s=0.25)
    predictor.error_stats()                         # ErrorStats(count=1, mape=0.16, ...)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from admission.rls import Rls
from routing.types import DEFAULT_PREFILL_TOKENS_PER_S, BackendState, FleetSnapshot

_TOKEN_SCALE = 1000.0  # features near 1 keep the regression well conditioned
_RUNNING_STEP_SCALE = 100.0
_AHEAD_SCALE = 10.0
_MARGIN_WINDOW = 64  # the last observations the lateness margin is taken over
_MIN_TTFT_S = 1e-3


@dataclass(slots=True, init=False)
class TtftFeatures:
    """What a backend's TTFT for one request depends on, taken from a snapshot."""

    queued_tokens: int  # prefill work ahead of the request
    uncached_tokens: int  # the request's own prefill (prompt minus cached prefix)
    num_running: int  # sequences decoding alongside
    num_ahead: int  # requests ahead of it that wait for a batch slot

    def __init__(self, queued_tokens: int, uncached_tokens: int, num_running: int = 0,
                 num_ahead: int = 0) -> None:
        self.queued_tokens = queued_tokens
        self.uncached_tokens = uncached_tokens
        self.num_running = num_running
        self.num_ahead = num_ahead

    @property
    def prefill_tokens(self) -> int:
        return self.queued_tokens + self.uncached_tokens


def ttft_features(backend: BackendState, uncached_tokens: int, *, max_age_s: float,
                  worst_queued_tokens: int = 0) -> TtftFeatures:
    """Features of ``backend`` for a request; stale figures fall back on ``worst_queued``.

    Requests ahead without a batch slot: the engine's waiting count, or this gateway's own
    in-flight requests beyond ``max_batch`` when that is larger (current, where the engine's
    count is a scrape old; all of them when this gateway is the engine's only client)."""
    queued, num_running, num_ahead = _load(backend, max_age_s, worst_queued_tokens)
    return TtftFeatures(queued, max(0, uncached_tokens), num_running, num_ahead)


def _load(backend: BackendState, max_age_s: float, worst_queued_tokens: int
          ) -> tuple[int, int, int]:
    """``ttft_features``' queued tokens, running sequences and requests ahead."""
    in_flight = backend.num_in_flight_prompt_tokens
    max_batch = backend.profile.max_batch
    beyond_batch = 0 if max_batch is None else max(0, backend.num_in_flight - max_batch)
    if backend.age_s > max_age_s:
        return (worst_queued_tokens + in_flight, max(backend.num_running, backend.num_in_flight),
                beyond_batch)
    rate = backend.profile.prefill_rate(DEFAULT_PREFILL_TOKENS_PER_S)
    return (max(backend.queued_prefill_now(rate), in_flight),
            backend.num_running, max(backend.num_waiting, beyond_batch))


def snapshot_features(snapshot: FleetSnapshot, backend_name: str,
                      uncached_tokens: int) -> TtftFeatures:
    """``ttft_features`` of one backend of ``snapshot`` (for ``observe`` after routing)."""
    worst_queued = max((b.num_queued_prefill_tokens for b in snapshot.backends), default=0)
    for backend in snapshot.backends:
        if backend.name == backend_name:
            return ttft_features(backend, uncached_tokens, max_age_s=snapshot.max_age_s,
                                 worst_queued_tokens=worst_queued)
    raise KeyError(f"backend {backend_name!r} is not in the snapshot")


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    """Priors and fitting knobs. ``step_tokens`` is the engine's prefill budget per step."""

    default_prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    default_base_s: float = 0.02
    default_running_step_s: float = 2e-4
    default_per_ahead_s: float = 0.05  # each request ahead waiting for a batch slot
    step_tokens: int = 2048
    forgetting: float = 0.995
    prior_variance: float = 1.0  # per scaled coefficient: larger trusts the prior less
    window: int = 256
    # The margin added for admission: this quantile of recent (observed - predicted), per
    # backend, so that a fit that runs low does not admit requests that then miss their SLO.
    margin_quantile: float = 0.9

    def __post_init__(self) -> None:
        if not 0 < self.forgetting <= 1:
            raise ValueError(f"forgetting must be in (0, 1], got {self.forgetting}")
        for name in ("default_prefill_tokens_per_s", "step_tokens", "prior_variance", "window"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Coefficients:
    """A fitted model in physical units."""

    base_s: float
    s_per_token: float
    running_step_s: float
    per_ahead_s: float = 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return 1 / self.s_per_token if self.s_per_token > 0 else math.inf


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """Prediction error over the recent window, scored before each update."""

    count: int
    mape: float  # mean |predicted - observed| / observed
    bias_s: float  # mean predicted - observed: positive over-predicts


class TtftPredictor:
    """Per-backend TTFT models with a fleet-wide prior; see the module docstring."""

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        c = self.config
        self._fleet = self._new_model((c.default_base_s,
                                       _TOKEN_SCALE / c.default_prefill_tokens_per_s,
                                       c.default_running_step_s * _RUNNING_STEP_SCALE,
                                       c.default_per_ahead_s * _AHEAD_SCALE))
        self._models: dict[str, Rls] = {}
        self._errors: dict[str | None, deque[tuple[float, float]]] = {}
        self._margins: dict[str, tuple[int, float]] = {}  # backend -> (at count, margin)
        self._num_observed: dict[str, int] = {}

    def predict_s(self, backend: BackendState | str, features: TtftFeatures) -> float:
        """Predicted TTFT in seconds (at least 1 ms)."""
        model = self._models.get(_name(backend))
        x = self._vector(features)
        if model is None:
            theta = self._seed_theta(backend)
            return max(_MIN_TTFT_S, sum(t * xi for t, xi in zip(theta, x, strict=True)))
        return max(_MIN_TTFT_S, model.predict(x))

    def quickest(self, backends: Sequence[BackendState], uncached_tokens: Sequence[int], *,
                 max_age_s: float, worst_queued_tokens: int = 0) -> tuple[int, float]:
        """The index of the backend with the lowest ``predict_s`` + ``margin_s`` for a request
        of ``uncached_tokens[i]`` on ``backends[i]`` (features as ``ttft_features`` takes
        them), and that sum; the first of equals. The same figures as calling those per
        backend, computed in one pass without a features object per backend: admission runs
        this over the backends routing scored, for every request. ``backends`` must not be
        empty."""
        # _vector, predict_s and margin_s's cache inlined, in the same order of float
        # operations (tests/admission/test_predictor.py checks the figures equal); a change to
        # one of those must be made here too.
        models, step_tokens = self._models, self.config.step_tokens
        margins, num_observed = self._margins, self._num_observed
        best_index, best_s = 0, math.inf
        for index, b in enumerate(backends):
            name = b.name
            queued, num_running, num_ahead = _load(b, max_age_s, worst_queued_tokens)
            prefill = queued + max(0, uncached_tokens[index])
            steps = max(1.0, prefill / step_tokens)
            model = models.get(name)
            t0, t1, t2, t3 = model.theta if model is not None else self._seed_theta(b)
            cached = margins.get(name)  # margin_s's cache, looked up here: no call per backend
            margin_s = (cached[1] if cached is not None
                        and num_observed.get(name, 0) - cached[0] < 16 else self.margin_s(name))
            predicted_s = max(_MIN_TTFT_S, t0 * 1.0 + t1 * (prefill / _TOKEN_SCALE)
                              + t2 * (num_running * steps / _RUNNING_STEP_SCALE)
                              + t3 * (num_ahead / _AHEAD_SCALE)) + margin_s
            if predicted_s < best_s:
                best_index, best_s = index, predicted_s
        return best_index, best_s

    def margin_s(self, backend: BackendState | str) -> float:
        """How much later than predicted ``backend``'s first tokens came lately: the
        ``margin_quantile`` of its last 64 (observed - predicted), at least 0. Recomputed every
        16 observations."""
        name = _name(backend)
        count = self._num_observed.get(name, 0)
        cached = self._margins.get(name)
        if cached is not None and count - cached[0] < 16:
            return cached[1]
        window = self._errors.get(name)
        margin = 0.0
        if window and len(window) >= 8:
            recent = list(window)[-_MARGIN_WINDOW:]
            late = sorted(o - p for p, o in recent)
            margin = max(0.0, late[min(len(late) - 1,
                                       int(self.config.margin_quantile * len(late)))])
        self._margins[name] = (count, margin)
        return margin

    def observe(self, backend: BackendState | str, features: TtftFeatures,
                ttft_s: float) -> None:
        """Fit one observed TTFT (dispatch to first token) taken with ``features``."""
        if not (math.isfinite(ttft_s) and ttft_s >= 0):
            raise ValueError(f"ttft_s must be a finite number >= 0, got {ttft_s}")
        name = _name(backend)
        self._num_observed[name] = self._num_observed.get(name, 0) + 1
        predicted_s = self.predict_s(backend, features)
        for key in (name, None):
            window = self._errors.get(key)
            if window is None:
                window = self._errors[key] = deque(maxlen=self.config.window)
            window.append((predicted_s, ttft_s))
        model = self._models.get(name)
        if model is None:
            model = self._models[name] = self._new_model(self._seed_theta(backend))
        x = self._vector(features)
        model.update(x, ttft_s, self.config.forgetting)
        self._fleet.update(x, ttft_s, self.config.forgetting)

    def error_stats(self, backend: str | None = None) -> ErrorStats:
        """MAPE, bias and count over the last ``window`` observations (all backends: None)."""
        window = self._errors.get(backend, ())
        if not window:
            return ErrorStats(count=0, mape=0.0, bias_s=0.0)
        mape = sum(abs(p - o) / max(o, _MIN_TTFT_S) for p, o in window) / len(window)
        bias_s = sum(p - o for p, o in window) / len(window)
        return ErrorStats(count=len(window), mape=mape, bias_s=bias_s)

    def coefficients(self, backend: str | None = None) -> Coefficients:
        """The current fit of ``backend`` (the fleet's for None or an unseen backend)."""
        model = (self._models.get(backend) if backend else None) or self._fleet
        base, per_ktoken, per_running_steps, per_ahead = model.theta
        return Coefficients(base, per_ktoken / _TOKEN_SCALE,
                            per_running_steps / _RUNNING_STEP_SCALE, per_ahead / _AHEAD_SCALE)

    def _vector(self, f: TtftFeatures) -> tuple[float, float, float, float]:
        prefill = f.prefill_tokens
        steps = max(1.0, prefill / self.config.step_tokens)
        return (1.0, prefill / _TOKEN_SCALE, f.num_running * steps / _RUNNING_STEP_SCALE,
                f.num_ahead / _AHEAD_SCALE)

    def _seed_theta(self, backend: BackendState | str) -> tuple[float, float, float, float]:
        """A new backend's starting fit: the fleet's, with its advertised prefill speed."""
        base, per_ktoken, per_running_steps, per_ahead = self._fleet.theta
        if isinstance(backend, BackendState):
            profile = backend.profile
            advertised = profile.prefill_tokens_per_s
            if advertised is not None and advertised > 0:
                per_ktoken = _TOKEN_SCALE / advertised
            elif profile.relative_speed != 1.0:
                per_ktoken /= profile.relative_speed
        return base, per_ktoken, per_running_steps, per_ahead

    def _new_model(self, theta: tuple[float, float, float, float]) -> Rls:
        return Rls(theta, [self.config.prior_variance] * 4, lower=(0.0, 1e-6, 0.0, 0.0))


def _name(backend: BackendState | str) -> str:
    return backend if isinstance(backend, str) else backend.name
