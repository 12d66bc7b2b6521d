"""The named profiles: the baselines and ``prefix_affinity``, the default.

- ``round_robin``: each call the next candidate in turn (the counter lives in the picker);
- ``random``: uniform, from the seeded ``rng``;
- ``least_load``: fewest waiting + in-flight requests (``queue`` scorer), ties at random;
- ``power_of_two``: two sampled by ``rng``, the less loaded of them;
- ``session``: rendezvous hashing on ``session_key``; least-load without one;
- ``prefix_affinity`` (the default): the lowest estimated TTFT, the prefix cache's saving
  included, and a prompt no backend holds placed where it evicts the fewest reused prefixes;
- ``prefix_affinity_no_room``: the same without that placement (``cache_room``), for
  comparison;
- ``prefix_affinity_all``: ``prefix_affinity`` scoring every backend of a large fleet (no
  ``shortlist``), for comparison.

Every profile first keeps the backends that serve the model, are healthy and can hold the
request (``model``, ``healthy``, ``resources``), and prefers fresh ones (``fresh``: a stale
backend is unknown, never idle). The load-aware ones also steer around saturated backends
(``not_saturated``); ``session`` does not, as stickiness is its point.

**prefix_affinity's cost model.** A cached prefix only helps if the backend holding it starts
the request sooner than another one would. So the main score (weight 4) is ``ttft``
(``routing.plugins.ttft``): for each backend, ``(prefill backlog + uncached prompt tokens) / prefill
speed``, with the uncached tokens taken from the prefix index's match and the backlog from the
engine's queued prefill tokens and the gateway's own in-flight prompts. ``prefix`` (weight 1,
matched fraction of the request's blocks) adds a lean towards holders when estimates are
close, which keeps each prefix on few backends and the fleet's cache diverse; ``queue``
(weight 1) counts requests, which the token estimate misses (decode batch slots). A lightly
loaded holder wins by the seconds its cache saves; an overloaded holder of a hot prefix loses
to an idle backend as soon as its backlog costs more than recomputing the prefix, and the
prefix spreads to that second backend. For example, at 10k tokens/s, a 3,000-token prompt whose
2,800-token prefix one backend holds stays with that holder until about 3,700 tokens are queued
there (TTFT 0.39 s against the idle backend's 0.30 s: the prefix lean buys up to ~30 % slower
starts for cache locality), then goes to the idle one.

**Balance guard** (``balanced`` filter, soft): the TTFT estimate counts a holder's prefill
backlog, not its decode batch, and cache hits add almost nothing to the backlog, so a hot
prefix's holders would keep winning however many requests they run, and the set of holders
would stay whatever it was when the prefix got hot. A backend running both more than twice
and 32 more requests than the least loaded candidate is left out while another may take the
request, and the prefix spreads to that one (bench.vsim, hot prefix at 64 workers, seed 2:
busiest in flight 3.4 x the mean with the approximate index, 1.8 with the guard). A tighter
guard (16 more) balances the hot prefix better (1.3) but on the Zipf workload at 863 req/s
spreads popular prefixes into caches that then evict others (p99 54 -> 203 ms).

``cache_room`` (weight 2, ``routing.plugins.cache_room``) matters under KV pressure: a prompt
no backend holds would otherwise go wherever the load scores point, and some caches end up with more
reused prefixes than fit and keep evicting them. It scores each backend's KV left free of
reused prefixes after storing the request (a holder needs none for what it holds), so among
similarly loaded backends the prompt goes where it evicts the least. Weight 2 was chosen in
``bench.vsim`` at 35 % and 25 % KV (docs/benchmarks.md, "Cache room"); with ample KV every
backend has room and it is neutral.

**Shortlist** (``routing.shortlist``): over more than 16 backends, ``prefix_affinity`` scores
the 4 deepest holders of the prompt's prefix and a random draw of 8, not every backend; a
64-backend decision then costs about a third of scoring all 64 (docs/benchmarks.md, "Routing
decision cost"), and the shortlist falls back to the whole fleet when none of it may take the
request.

Example::

    profile = profile_by_name("prefix_affinity")
    ranked = schedule(request, snapshot, profile, now_s, rng)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routing.profile import SchedulingProfile, build_profile

DEFAULT_PROFILE = "prefix_affinity"

_HARD: list[dict[str, Any]] = [{"type": "model"}, {"type": "healthy"}, {"type": "resources"},
                               {"type": "fresh"}]
_NOT_SATURATED: dict[str, Any] = {"type": "not_saturated", "max_waiting": 64,
                                  "max_kv_usage": 0.98}
_BALANCED: dict[str, Any] = {"type": "balanced", "max_ratio": 2.0, "max_excess": 32}
_SHORTLIST: dict[str, Any] = {"above": 16, "holders": 4, "sampled": 8}

PROFILES: Mapping[str, Mapping[str, Any]] = {
    "round_robin": {"filters": _HARD, "picker": {"type": "round_robin"}},
    "random": {"filters": _HARD, "picker": {"type": "random"}},
    "least_load": {
        "filters": [*_HARD, _NOT_SATURATED],
        "scorers": [{"type": "queue", "weight": 1}],
        "picker": {"type": "max_score"},
    },
    "power_of_two": {
        "filters": [*_HARD, _NOT_SATURATED],
        "scorers": [{"type": "queue", "weight": 1}],
        "picker": {"type": "power_of_two"},
    },
    "session": {
        "filters": _HARD,
        "scorers": [{"type": "session", "weight": 1}],
        "picker": {"type": "max_score"},
    },
    "prefix_affinity": {
        "filters": [*_HARD, _NOT_SATURATED, _BALANCED],
        "scorers": [{"type": "ttft", "weight": 4}, {"type": "prefix", "weight": 1},
                    {"type": "queue", "weight": 1}, {"type": "cache_room", "weight": 2}],
        "picker": {"type": "max_score"},
        "shortlist": _SHORTLIST,
    },
    "prefix_affinity_all": {  # every backend scored, however large the fleet: for comparison
        "filters": [*_HARD, _NOT_SATURATED, _BALANCED],
        "scorers": [{"type": "ttft", "weight": 4}, {"type": "prefix", "weight": 1},
                    {"type": "queue", "weight": 1}, {"type": "cache_room", "weight": 2}],
        "picker": {"type": "max_score"},
    },
    "prefix_affinity_no_room": {
        "filters": [*_HARD, _NOT_SATURATED, _BALANCED],
        "scorers": [{"type": "ttft", "weight": 4}, {"type": "prefix", "weight": 1},
                    {"type": "queue", "weight": 1}],
        "picker": {"type": "max_score"},
        "shortlist": _SHORTLIST,
    },
}


def profile_by_name(name: str = DEFAULT_PROFILE) -> SchedulingProfile:
    """A fresh instance of the named profile (its own round-robin counter, if any)."""
    config = PROFILES.get(name)
    if config is None:
        raise ValueError(f"unknown routing profile {name!r}; known: {', '.join(PROFILES)}")
    return build_profile(config, name=name)
