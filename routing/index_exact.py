"""Which backend holds which token block, exactly, from the workers' KV-cache events.

Workers publish ``stored`` / ``removed`` / ``cleared`` events with block hashes from
``routing.prefix`` (the gateway's ``backends/`` layer reads them from Redis and calls
:meth:`ExactPrefixIndex.apply`; a reconnecting reader calls :meth:`load_snapshot`). Two maps
are kept in step:

- ``hash -> frozenset of backends`` answers :meth:`match`: walk the request's chain from the
  first block, narrowing the set of backends still matching, and stop at the first block none
  of them holds — O(matched blocks * holders), independent of fleet and index size. Equal
  holder sets are interned (one shared frozenset per distinct set, reference-counted), so
  memory is one dict slot per hash and consecutive blocks with the same holders cost one
  identity check each;
- ``backend -> set of hashes`` bounds memory: at most ``max_hashes_per_backend`` per backend
  (set it to at least the largest engine's ``num_kv_blocks``; the bound only guards against
  lost ``removed`` events). Past it, arbitrary hashes of that backend are evicted
  (``set.pop``), which can only make a later match shorter, never wrong.

Memory: about 100 bytes per distinct hash plus 50 per (hash, backend). Not thread-safe (one
event loop).

Example::

    index = ExactPrefixIndex(block_size=16)
    index.apply("w0", "stored", [h0, h1, h2])
    index.match([h0, h1, h9]).num_blocks    # {"w0": 2}
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import Literal

from routing.types import PrefixMatch

EventKind = Literal["stored", "removed", "cleared"]
EVENT_KINDS = ("stored", "removed", "cleared")


class ExactPrefixIndex:
    """Resident token-block hashes per backend, fed by KV events; see the module docstring."""

    def __init__(self, block_size: int = 16, max_hashes_per_backend: int = 1 << 20) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if max_hashes_per_backend < 1:
            raise ValueError(f"max_hashes_per_backend must be >= 1, got {max_hashes_per_backend}")
        self.block_size = block_size
        self.max_hashes_per_backend = max_hashes_per_backend
        self._holders: dict[int, frozenset[str]] = {}
        self._resident: dict[str, set[int]] = {}
        # Interned holder sets and how many hashes point at each.
        self._interned: dict[frozenset[str], frozenset[str]] = {}
        self._num_refs: dict[frozenset[str], int] = {}

    def __len__(self) -> int:
        """Distinct hashes held by any backend."""
        return len(self._holders)

    def backends(self) -> list[str]:
        return sorted(self._resident)

    def follows(self, backend: str) -> bool:
        """Whether this index hears ``backend``'s KV events (a snapshot or an event came, and
        it was not removed since): then what it says ``backend`` holds is what it holds, give
        or take the events on their way."""
        return backend in self._resident

    def num_hashes(self, backend: str) -> int:
        return len(self._resident.get(backend, ()))

    def apply(self, backend: str, kind: EventKind, hashes: Iterable[int] = ()) -> None:
        """One KV event: ``stored`` or ``removed`` blocks, or ``cleared`` (hashes ignored)."""
        if kind == "stored":
            self._store(backend, hashes)
        elif kind == "removed":
            resident = self._resident.get(backend)
            if resident is not None:
                for h in hashes:
                    if h in resident:
                        resident.discard(h)
                        self._set_holders(h, self._holders[h] - {backend})
        elif kind == "cleared":
            self.remove_backend(backend)
            self._resident[backend] = set()  # still followed: it holds nothing now
        else:
            raise ValueError(f"unknown KV event kind {kind!r}; expected {', '.join(EVENT_KINDS)}")

    def load_snapshot(self, backend: str, hashes: Iterable[int]) -> None:
        """Replace everything known about ``backend`` with its full resident set."""
        self.remove_backend(backend)
        self._store(backend, hashes)

    def remove_backend(self, backend: str) -> None:
        """Forget ``backend`` (it left, or cleared its cache). O(its hashes)."""
        for h in self._resident.pop(backend, ()):
            self._set_holders(h, self._holders[h] - {backend})

    def match(self, block_hashes: Sequence[int]) -> PrefixMatch:
        """For each backend, how many leading blocks of ``block_hashes`` it holds."""
        num_blocks: dict[str, int] = {}
        alive: frozenset[str] | None = None  # backends holding every block so far
        depth = 0
        # Consecutive blocks with the same holders share one interned set, so groupby (which
        # compares by identity first, in C) walks the chain in runs: Python work per run, not
        # per block.
        for holders, run in groupby(map(self._holders.get, block_hashes)):
            if holders is None:
                break
            if alive is None:
                alive = holders
            elif not alive <= holders:
                for name in alive - holders:
                    num_blocks[name] = depth
                alive = alive & holders
                if not alive:
                    break
            depth += len(list(run))
        if alive:
            for name in alive:
                num_blocks[name] = depth
        return PrefixMatch(num_blocks, self.block_size, is_exact=True)

    def _store(self, backend: str, hashes: Iterable[int]) -> None:
        resident = self._resident.setdefault(backend, set())
        holders_of = self._holders
        single = frozenset((backend,))
        for h in hashes:
            if h in resident:
                continue
            resident.add(h)
            current = holders_of.get(h)
            self._set_holders(h, single if current is None else current | single)
        while len(resident) > self.max_hashes_per_backend:
            h = resident.pop()
            self._set_holders(h, self._holders[h] - single)

    def _set_holders(self, h: int, holders: frozenset[str]) -> None:
        """Point ``h`` at the interned copy of ``holders`` (or drop it when empty)."""
        num_refs = self._num_refs
        old = self._holders.get(h)
        if old is not None:
            remaining = num_refs[old] - 1
            if remaining:
                num_refs[old] = remaining
            else:
                del num_refs[old]
                del self._interned[old]
        if not holders:
            self._holders.pop(h, None)
            return
        interned = self._interned.setdefault(holders, holders)
        num_refs[interned] = num_refs.get(interned, 0) + 1
        self._holders[h] = interned
