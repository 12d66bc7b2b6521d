"""Cache room: place a prompt where storing it evicts the fewest prefixes other requests reuse.

Affinity keeps each prefix on the backends that hold it, but a prompt that no backend holds
(new, or evicted everywhere) is placed by load alone, so which backend's cache must make room
for it is left to chance. Under KV pressure some caches end up holding more reused prefixes
than fit, and keep evicting them. This scorer prefers the backend with the most room left
after storing the request's uncached blocks::

    capacity    = profile.num_kv_blocks
    kept        = num_prefix_kv_blocks      cached blocks a later request hit (heartbeat)
    need        = prompt blocks - matched blocks      (from snapshot.prefix; 0 on a full holder)
    room        = min(ample, max(0, capacity - kept - need) / capacity)      in [0, ample]
    score       = (room + floor) / (max room + floor)             1 for the roomiest

A holder needs no room for the prompt it holds, so this never outranks affinity by itself: it
decides between backends the load scores find alike, and when an overloaded holder's prefix
spreads, it picks the second backend by room too. ``floor`` (5 % of a cache) keeps nearly full
caches from being told apart by noise; ``ample`` (half a cache) makes it neutral where there is
no pressure: every backend with at least that much room scores alike, so a few reused blocks on
an otherwise empty cache do not steer every new prompt away from it (with the max-score picker
such tiny differences would decide every tie).

Neutral where it knows nothing: a backend that publishes no ``num_prefix_kv_blocks`` or no KV
capacity (an engine switchyard did not start) gets the mean of the others' scores, and all 1.0
when none publishes. A stale backend's figure is unknown, so it is taken as full (room 0),
never as empty. Cost: O(backends).

Example::

    scorers:
      - {type: ttft, weight: 4}
      - {type: cache_room, weight: 1}
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.plugin import Cycle, check_number
from routing.registry import register_scorer
from routing.types import BackendState

DEFAULT_FLOOR = 0.05
DEFAULT_AMPLE = 0.5


@register_scorer("cache_room")
class CacheRoomScorer:
    """Scores the share of a backend's KV left free of reused prefixes after this request."""

    def __init__(self, floor: object = DEFAULT_FLOOR, ample: object = DEFAULT_AMPLE) -> None:
        self.floor = check_number("floor", floor, above=0, maximum=1)
        self.ample = check_number("ample", ample, above=0, maximum=1)

    def rooms(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float | None]:
        """Each candidate's room after the request, as a fraction of its KV; None if unknown."""
        return [None if r < 0.0 else r for r in _rooms(cycle, candidates)]

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        ample = self.ample
        rooms = [r if r < ample else ample for r in _rooms(cycle, candidates)]
        best = max(rooms, default=-1.0)
        if best < 0.0:  # no candidate publishes the figure
            return [1.0] * len(candidates)
        floor = self.floor
        scale = 1.0 / (best + floor)
        if min(rooms) >= 0.0:
            return [(r + floor) * scale for r in rooms]
        known = [(r + floor) * scale for r in rooms if r >= 0.0]
        mean = sum(known) / len(known)
        return [(r + floor) * scale if r >= 0.0 else mean for r in rooms]


def _rooms(cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
    """Each candidate's room after the request as a fraction of its KV; -1.0 if unknown."""
    prefix = cycle.snapshot.prefix
    get_num_blocks = prefix.num_blocks.get
    matched_block_tokens = prefix.block_tokens
    num_prompt_tokens = cycle.request.num_prompt_tokens
    stale_after_s = cycle.stale_after_s
    rooms = []
    need_at: dict[int | None, int] = {}  # uncached blocks where nothing is matched, by block size
    for b in candidates:
        kept = b.num_prefix_kv_blocks
        profile = b.profile
        capacity = profile.num_kv_blocks
        if kept is None or not capacity:
            rooms.append(-1.0)
            continue
        if b.age_s > stale_after_s:
            rooms.append(0.0)
            continue
        block_size = profile.block_size
        num_matched = get_num_blocks(b.name)
        if num_matched is None:
            need = need_at.get(block_size)
            if need is None:
                need = need_at[block_size] = _num_blocks(
                    num_prompt_tokens, block_size or matched_block_tokens)
        else:
            need = _num_blocks(num_prompt_tokens - num_matched * matched_block_tokens,
                               block_size or matched_block_tokens)
        taken = kept + need
        rooms.append((capacity - taken) / capacity if taken < capacity else 0.0)
    return rooms


def _num_blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size) if num_tokens > 0 else 0
