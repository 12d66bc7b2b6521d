"""The simulator's profiles: a routing profile (``routing.profiles``) with the prefix index
the gateway would have for it (``none``, ``exact`` or ``approx``; see ``bench/vsim/router.py``).

Example::

    PROFILES["prefix_affinity_approx"]        # ("prefix_affinity", "approx")
    exact_variant("prefix_affinity_approx")   # "prefix_affinity"
"""

from __future__ import annotations

MODEL = "vsim-llama-3-8b"
# vsim profile -> (routing profile, prefix index mode)
PROFILES: dict[str, tuple[str, str]] = {
    "round_robin": ("round_robin", "none"),
    "random": ("random", "none"),
    "least_load": ("least_load", "none"),
    "power_of_two": ("power_of_two", "none"),
    "prefix_affinity": ("prefix_affinity", "exact"),
    "prefix_affinity_approx": ("prefix_affinity", "approx"),
    "prefix_affinity_all": ("prefix_affinity_all", "exact"),
    "prefix_affinity_all_approx": ("prefix_affinity_all", "approx"),
    "prefix_affinity_no_room": ("prefix_affinity_no_room", "exact"),
    "prefix_affinity_no_room_approx": ("prefix_affinity_no_room", "approx"),
}
# Routing profiles that read no load: the replicas' in-flight counts cannot change a decision.
LOAD_BLIND = frozenset({"round_robin", "random"})


def no_exact_index(profile: str) -> str:
    """Why ``profile`` cannot run in third-party mode, and what to run instead."""
    routing_profile, _ = PROFILES[profile]
    return (f"{profile}: a third-party fleet sends no KV events, so there is no exact index; "
            f"use {routing_profile}_approx")


def exact_variant(profile: str) -> str | None:
    """The profile with the same routing over the exact index, if there is one."""
    routing_profile, index_mode = PROFILES[profile]
    if index_mode == "exact":
        return profile
    return next((name for name, (routing, index) in PROFILES.items()
                 if routing == routing_profile and index == "exact"), None)
