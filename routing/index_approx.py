"""Which backend probably holds which prefix, learned from the gateway's own routing decisions.

For engines that publish no KV events: after sending a request the gateway calls
:meth:`ApproxPrefixIndex.record` with the request's character-block chain
(``routing.prefix.char_block_hashes``) and the backend it went to, assuming the backend now
caches that prefix for a while. An entry is one block hash with, per backend, when it was last
recorded there:

- :meth:`match` walks the chain from the first block and stops at the first block no backend
  still holds — O(matched blocks * holders);
- a backend's claim on a block expires ``ttl_s`` after it was last recorded (engines evict
  what nobody reuses); :meth:`match` ignores expired claims, and expired entries are pruned
  from the least-recently-recorded end on every :meth:`record`, amortised O(1);
- at most ``max_entries`` blocks are kept; recording past that evicts the least recently
  recorded block (LRU; a chain's tail before its root), O(1) each. Memory: O(max_entries *
  holders), roughly 300 bytes per block with one holder.

**Feedback.** The index cannot see evictions, but every response says how much of its prompt
was really cached (``usage.prompt_tokens_details.cached_tokens``). :meth:`observe` takes that
for a claim of a known age: a miss means the backend evicted what was claimed that long ago,
so its claims as old as that are ignored at once (its claim lifetime shrinks to the missed
claim's age: under LRU, older ones are gone too); a hit at an age near the lifetime lets it
grow back, up to ``ttl_s``. A miss on a claim younger than ``MIN_TTL_S`` says nothing:
engines cache a block once it is computed, so a request that follows its prefix's first one
to a backend by less than that request's prefill misses with nothing evicted (in the virtual
fleet such misses set every backend's lifetime to the floor and doubled TTFT p99).
O(1); :meth:`ttl_for` says a backend's current lifetime.

Replicas share what they learned (the Redis I/O is ``backends/``' job): :meth:`entries`
exports ``(hash, backend, recorded_s)`` triples, :meth:`merge` folds another replica's in,
keeping the latest time per (hash, backend), so replicas that exchange entries converge.
Clocks must be comparable across replicas (e.g. wall-clock seconds). Not thread-safe.

Example::

    index = ApproxPrefixIndex(ttl_s=300, block_tokens=16)
    index.record(char_block_hashes(text, 64, "m"), "w1", now_s=100.0)
    index.match(char_block_hashes(text + " more", 64, "m"), now_s=101.0).num_blocks  # {"w1": n}
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import islice

from routing.types import PrefixMatch

Entry = tuple[int, str, float]  # (character-block hash, backend, recorded_s)
MIN_TTL_S = 1.0  # the shortest claim lifetime feedback can teach
_NEVER = -float("inf")


class ApproxPrefixIndex:
    """Prefix blocks per backend from routing history, with TTL and an LRU bound."""

    def __init__(self, ttl_s: float = 600.0, max_entries: int = 1 << 18,
                 block_tokens: int = 16) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.block_tokens = block_tokens  # estimated tokens per character block
        self._blocks: OrderedDict[int, dict[str, float]] = OrderedDict()
        # Claim lifetimes shorter than ttl_s, learned from what backends reported (observe).
        self._ttl_by_backend: dict[str, float] = {}

    def ttl_for(self, backend: str) -> float:
        """How long ``backend``'s claims count: ``ttl_s`` unless feedback shortened it."""
        return self._ttl_by_backend.get(backend, self.ttl_s)

    def observe(self, backend: str, claim_age_s: float, is_hit: bool) -> bool:
        """What ``backend`` reported for a claim recorded ``claim_age_s`` before: a miss
        shortens its claims' lifetime to that age (at least ``MIN_TTL_S``), a hit within 20 %
        of the lifetime lengthens it by a quarter (at most ``ttl_s``). A miss younger than
        ``MIN_TTL_S`` changes nothing (the prefix may not have been computed there yet).
        True when the lifetime changed: a lesson worth telling the other replicas."""
        before_s = ttl_s = self.ttl_for(backend)
        age_s = max(0.0, claim_age_s)
        if not is_hit and age_s < MIN_TTL_S:
            return False  # the claimed prefix may still have been in prefill there: no evidence
        if not is_hit:
            ttl_s = max(MIN_TTL_S, min(ttl_s, age_s))
        elif age_s >= 0.8 * ttl_s:
            ttl_s = min(self.ttl_s, max(ttl_s, age_s) * 1.25)
        if ttl_s >= self.ttl_s:
            self._ttl_by_backend.pop(backend, None)
        else:
            self._ttl_by_backend[backend] = ttl_s
        return self.ttl_for(backend) != before_s

    def claim_s(self, char_hashes: Sequence[int], num_blocks: int, backend: str) -> float | None:
        """When ``backend``'s claim on the ``num_blocks``-th block of the chain was recorded."""
        if not 0 < num_blocks <= len(char_hashes):
            return None
        holders = self._blocks.get(char_hashes[num_blocks - 1])
        return None if holders is None else holders.get(backend)

    def __len__(self) -> int:
        """Blocks held (each with one or more backends' claims)."""
        return len(self._blocks)

    def record(self, char_hashes: Sequence[int], backend: str, now_s: float) -> None:
        """``backend`` was sent a request with this chain at ``now_s``. O(chain).

        The chain is refreshed deepest block first, so its root is the most recently used and
        the LRU bound trims chains from their tails, keeping their prefixes matchable.
        """
        blocks = self._blocks
        oldest_s = now_s - self.ttl_s
        for h in reversed(char_hashes):
            holders = blocks.get(h)
            if holders is None:
                blocks[h] = {backend: now_s}
                continue
            holders[backend] = now_s
            if len(holders) > 1:
                for name in [n for n, t in holders.items() if t < oldest_s]:
                    del holders[name]
            blocks.move_to_end(h)
        self._prune(now_s)

    def match(self, char_hashes: Sequence[int], now_s: float) -> PrefixMatch:
        """For each backend, how many leading blocks of ``char_hashes`` it holds unexpired."""
        if self._ttl_by_backend:
            return self._match_per_backend(char_hashes, now_s)
        oldest_s = now_s - self.ttl_s
        get = self._blocks.get
        first = get(char_hashes[0]) if char_hashes else None
        alive = [n for n, t in first.items() if t >= oldest_s] if first else []
        depth = 1
        if len(alive) == 1:  # the common case under affinity: a tighter loop
            (name,) = alive
            for holders in map(get, islice(char_hashes, 1, None)):
                if holders is None or holders.get(name, _NEVER) < oldest_s:
                    break
                depth += 1
            return PrefixMatch({name: depth}, self.block_tokens, is_exact=False)
        return self._walk(char_hashes, alive, dict.fromkeys(alive, oldest_s))

    def _match_per_backend(self, char_hashes: Sequence[int], now_s: float) -> PrefixMatch:
        """``match`` with some backends' claims living shorter than ``ttl_s``."""
        ttl_for = self.ttl_for
        get = self._blocks.get
        first = get(char_hashes[0]) if char_hashes else None
        oldest = {n: now_s - ttl_for(n) for n in first} if first else {}
        alive = [n for n, t in first.items() if t >= oldest[n]] if first else []
        return self._walk(char_hashes, alive, oldest)

    def _walk(self, char_hashes: Sequence[int], alive: list[str],
              oldest: dict[str, float]) -> PrefixMatch:
        """How deep each of ``alive`` (the first block's live holders) holds the chain, a
        claim counting while recorded at or after ``oldest[holder]``."""
        get = self._blocks.get
        num_blocks: dict[str, int] = {}
        depth = 1
        for holders in map(get, islice(char_hashes, 1, None)) if alive else ():
            if holders is None:
                break
            dropped = [n for n in alive if holders.get(n, _NEVER) < oldest[n]]
            if dropped:
                for name in dropped:
                    num_blocks[name] = depth
                alive = [n for n in alive if n not in dropped]
                if not alive:
                    break
            depth += 1
        for name in alive:
            num_blocks[name] = depth
        return PrefixMatch(num_blocks, self.block_tokens, is_exact=False)

    def remove_backend(self, backend: str) -> None:
        """Forget every claim of ``backend``. O(entries)."""
        self._ttl_by_backend.pop(backend, None)
        blocks = self._blocks
        for h in [h for h, holders in blocks.items() if backend in holders]:
            holders = blocks[h]
            del holders[backend]
            if not holders:
                del blocks[h]

    def entries(self, since_s: float | None = None) -> list[Entry]:
        """Every claim as ``(hash, backend, recorded_s)``; only newer than ``since_s`` if given."""
        return [(h, name, t) for h, holders in self._blocks.items()
                for name, t in holders.items() if since_s is None or t > since_s]

    def merge(self, entries: Iterable[Entry], now_s: float | None = None) -> None:
        """Fold in another replica's claims, keeping the latest time per (hash, backend).

        Claims already expired at ``now_s`` (when given) are skipped. Merged blocks count as
        recently used (oldest claims first), then the LRU bound applies. O(entries log entries).
        """
        blocks = self._blocks
        oldest_s = _NEVER if now_s is None else now_s - self.ttl_s
        for h, backend, recorded_s in sorted(entries, key=lambda entry: entry[2]):
            if recorded_s < oldest_s:
                continue
            holders = blocks.get(h)
            if holders is None:
                blocks[h] = {backend: recorded_s}
            elif recorded_s > holders.get(backend, _NEVER):
                holders[backend] = recorded_s
                blocks.move_to_end(h)
        self._evict_over_bound()

    def _prune(self, now_s: float) -> None:
        blocks = self._blocks
        oldest_s = now_s - self.ttl_s
        while blocks:
            h, holders = next(iter(blocks.items()))
            if max(holders.values()) >= oldest_s:
                break
            del blocks[h]
        self._evict_over_bound()

    def _evict_over_bound(self) -> None:
        blocks = self._blocks
        while len(blocks) > self.max_entries:
            blocks.popitem(last=False)
