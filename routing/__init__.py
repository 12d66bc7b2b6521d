"""switchyard: routing — prefix hashing, prefix indexes and the pure scheduler.

Example::

    from routing import RouteRequest, FleetSnapshot, profile_by_name, schedule
    ranked = schedule(request, snapshot, profile_by_name(), now_s=now_s, rng=rng)
"""

from routing import native  # noqa: F401  (first: loads the compiled build when it matches)
from routing.index_approx import ApproxPrefixIndex
from routing.index_exact import ExactPrefixIndex
from routing.plugin import Cycle, Filter, Picker, Scorer
from routing.profile import SchedulingProfile, WeightedScorer, build_profile
from routing.profiles import DEFAULT_PROFILE, PROFILES, profile_by_name
from routing.registry import register_filter, register_picker, register_scorer
from routing.scheduler import schedule
from routing.types import (
    BackendProfile,
    BackendState,
    FleetSnapshot,
    PrefixMatch,
    Ranked,
    RouteRequest,
)

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "ApproxPrefixIndex",
    "BackendProfile",
    "BackendState",
    "Cycle",
    "ExactPrefixIndex",
    "Filter",
    "FleetSnapshot",
    "Picker",
    "PrefixMatch",
    "Ranked",
    "RouteRequest",
    "SchedulingProfile",
    "Scorer",
    "WeightedScorer",
    "build_profile",
    "profile_by_name",
    "register_filter",
    "register_picker",
    "register_scorer",
    "schedule",
]
