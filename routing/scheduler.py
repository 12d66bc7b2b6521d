"""``schedule()``: one routing decision — filters, then scorers, then the picker.

The returned list is every surviving candidate: the picker's pick first, then the others by
total score (ties in candidate order, starting after the pick), so a retry walks down the list
to the next-best backend. Each :class:`Ranked` carries its total, each scorer's weighted
contribution (recorded here, by the framework, under the scorer's type name) and the prompt
tokens the backend is expected to have cached. An empty list means no backend can take the
request (wrong model, all unhealthy, too long for every backend). ``max_ranked`` cuts the
list to the pick and its best retries, which saves building the rest. A profile with a
``shortlist`` (``routing.shortlist``) decides over a large fleet's prefix holders and a random
sample, and over the whole fleet only when those cannot decide; the list then holds the
shortlist's survivors.

Pure and cheap: no I/O, no clock (``now_s`` is passed in), randomness only from ``rng``. Cost:
O(backends * plugins + backends log backends), with backends the shortlist's size when it
applies; timing each plugin is the caller's business.

Example::

    ranked = schedule(request, snapshot, profile_by_name("prefix_affinity"), now_s=12.0,
                      rng=random.Random(7))
    ranked[0].backend, ranked[0].reasons   # "w3", (("ttft", 4.0), ("prefix", 0.9), ...)
"""

from __future__ import annotations

from random import Random

from routing.plugin import Cycle
from routing.profile import SchedulingProfile
from routing.types import BackendState, FleetSnapshot, Ranked, RouteRequest


def schedule(request: RouteRequest, snapshot: FleetSnapshot, profile: SchedulingProfile,
             now_s: float, rng: Random, *, max_ranked: int | None = None) -> list[Ranked]:
    """The candidates for ``request``, best first; see the module docstring.

    ``max_ranked`` keeps only that many (the pick and the best retries); building a Ranked
    for every one of a large fleet is most of a decision's cost.
    """
    return schedule_scored(request, snapshot, profile, now_s, rng, max_ranked=max_ranked)[0]


def schedule_scored(request: RouteRequest, snapshot: FleetSnapshot, profile: SchedulingProfile,
                    now_s: float, rng: Random, *, max_ranked: int | None = None
                    ) -> tuple[list[Ranked], list[BackendState]]:
    """``schedule``'s list, and the backends it scored: every filter's survivors, over the
    shortlist when it decided (empty when no backend can take the request). SLO admission
    predicts TTFTs over those alone (``admission.policy.decide``'s ``shortlist``): the backends
    this request can go to, not the whole fleet."""
    if max_ranked is not None and max_ranked < 1:
        raise ValueError(f"max_ranked must be >= 1 or None, got {max_ranked}")
    cycle = Cycle(request, snapshot, now_s)
    shortlist = profile.shortlist
    candidates: list[BackendState] | None = None
    if shortlist is not None and shortlist.applies(snapshot):
        candidates = _filtered(profile, cycle, shortlist.candidates(snapshot, rng), strict=True)
    if candidates is None:
        candidates = _filtered(profile, cycle, list(snapshot.backends), strict=False)
    if not candidates:
        return [], []
    num_candidates = len(candidates)
    totals = [0.0] * num_candidates
    columns: list[tuple[str, list[float]]] = []
    for weighted in profile.scorers:
        scores = weighted.scorer.score(cycle, candidates)
        if len(scores) != num_candidates:
            raise ValueError(f"scorer {weighted.name!r} returned {len(scores)} scores "
                             f"for {num_candidates} candidates")
        column = _clamped_times(scores, weighted.weight)
        totals = [t + c for t, c in zip(totals, column, strict=True)] if columns else column
        columns.append((weighted.name, column))
    pick = profile.picker.pick(candidates, totals, rng)
    if not 0 <= pick < num_candidates:
        raise ValueError(f"picker of profile {profile.name!r} picked {pick} of "
                         f"{num_candidates} candidates")
    # The rest by score; the sort is stable, so ties keep candidate order from after the pick.
    order = [*range(pick + 1, num_candidates), *range(pick)]
    order.sort(key=totals.__getitem__, reverse=True)
    order.insert(0, pick)
    if max_ranked is not None:
        del order[max_ranked:]
    num_blocks = snapshot.prefix.num_blocks
    block_tokens = snapshot.prefix.block_tokens
    num_prompt_tokens = request.num_prompt_tokens
    ranked = []
    for i in order:
        name = candidates[i].name
        num_cached = num_blocks.get(name, 0) * block_tokens if num_blocks else 0
        expected = num_cached if num_cached < num_prompt_tokens else num_prompt_tokens
        reasons = tuple([(scorer, column[i]) for scorer, column in columns])
        ranked.append(Ranked(name, totals[i], reasons, expected))
    return ranked, candidates


def _filtered(profile: SchedulingProfile, cycle: Cycle, candidates: list[BackendState], *,
              strict: bool) -> list[BackendState] | None:
    """The candidates every filter keeps. A soft filter that keeps nobody keeps them all; with
    ``strict`` (a shortlist) that and a hard filter keeping nobody return None: undecided."""
    for plugin in profile.filters:
        kept = plugin.filter(cycle, candidates)
        if not kept:
            if strict:
                return None
            if not plugin.soft:
                return kept
            continue
        candidates = kept
    return candidates


def _clamped_times(scores: list[float], weight: float) -> list[float]:
    """Each score clamped to [0, 1] (NaN to 0), times ``weight``."""
    return [weight if s >= 1.0 else weight * s if s > 0.0 else 0.0 for s in scores]
