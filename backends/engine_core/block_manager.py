"""Paged KV cache with automatic prefix caching, in the style of vLLM / nano-vllm.

The cache is ``num_blocks`` blocks of ``block_size`` tokens. Each full prompt block has a
chained hash (``routing.prefix``); once its KV is computed the block is registered in a
hash -> block map, so a later prompt with the same prefix reuses it instead of recomputing.

Free blocks come in two kinds: plain ones (no hash) and cached ones that still hold a
registered hash. Cached free blocks sit in an LRU list and are reused (evicting their hash)
only when no plain free block is left. A sequence's blocks are freed tail first, so its
tail is evicted before its head, which more requests share.

The simulator holds no KV data, so by default a hit is decided by hash equality alone. The
PyTorch engine sets ``check_tokens``: each cached block also keeps its token ids, and a hit
counts only while they equal the sequence's own tokens, so a 64-bit collision can never
serve another prefix's KV. The simulator hashes only prompt blocks (it has no output token
ids); a sequence that records its outputs (`Sequence.append_token`) has its full output
blocks hashed and cached too.

Every change to the set of cached hashes is recorded, in order, as a ``KvEvent``
("stored" / "removed" / "cleared") for the KV-event publisher to drain.

``num_prefix_blocks`` counts the cached blocks that a later request has hit: the prefixes this
worker keeps for reuse, as opposed to one-off prompt tails that LRU eviction reclaims first.
``num_blocks - num_prefix_blocks`` is the room left for a new prefix before reused ones are
evicted; workers publish it in their heartbeat and the router's ``cache_room`` scorer reads it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import NamedTuple

from backends.engine_core.sequence import Sequence


class KvEvent(NamedTuple):
    """A change to the cached block hashes, as published to the gateway's prefix index.

    ``parent_hash`` (only on "stored") is the hash of the block before the first stored
    one, or None when they start the chain.

    Example::

        KvEvent("stored", (0x1A, 0x2B), parent_hash=None)
        KvEvent("removed", (0x2B,))
        KvEvent("cleared", ())
    """

    kind: str
    block_hashes: tuple[int, ...]
    parent_hash: int | None = None


class BlockManager:
    """KV blocks of one worker: allocation, growth, freeing, prefix reuse and its events.

    Example::

        manager = BlockManager(num_blocks=8, block_size=4)
        if manager.can_allocate(seq):
            manager.allocate(seq)            # seq.num_cached_tokens = the prefix hit
        ...                                  # a step computes tokens
        manager.cache_computed_blocks(seq)   # full computed blocks become reusable
        if manager.can_append(seq):
            manager.append_slot(seq)         # room for the next decode token
        manager.deallocate(seq)              # blocks keep their hash, go to the LRU list
        manager.drain_events()               # [KvEvent("stored", (...)), ...]
    """

    def __init__(self, num_blocks: int, block_size: int, watermark_blocks: int = 0, *,
                 check_tokens: bool = False) -> None:
        if num_blocks < 1 or block_size < 1 or not 0 <= watermark_blocks < num_blocks:
            raise ValueError("need num_blocks >= 1, block_size >= 1, "
                             "0 <= watermark_blocks < num_blocks")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks
        self.check_tokens = check_tokens
        self._ref_counts = [0] * num_blocks
        self._hash_of_block: list[int | None] = [None] * num_blocks
        self._block_of_hash: dict[int, int] = {}
        self._tokens_of_block: list[tuple[int, ...] | None] = [None] * num_blocks
        self._free_plain: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._is_reused = [False] * num_blocks  # cached and hit by a later request
        self.num_prefix_blocks = 0  # blocks with _is_reused set
        self._events: list[KvEvent] = []
        self.prefix_cache_queries_tokens = 0
        self.prefix_cache_hits_tokens = 0
        self.num_token_check_misses = 0  # hash hits refused because the tokens differed

    # -- figures ------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_plain) + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences (vllm:kv_cache_usage_perc)."""
        return self.num_used_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose hash is registered, in use or free."""
        return len(self._block_of_hash)

    def resident_hashes(self) -> list[int]:
        """Every registered block hash (what a KV snapshot advertises)."""
        return list(self._block_of_hash)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def drain_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    # -- admission ----------------------------------------------------------------------

    def _hit_blocks(self, seq: Sequence) -> tuple[list[int], bool]:
        """Cached blocks of the longest cached prefix, leaving at least one token to compute,
        and whether the token check cut it short (a hash hit on different tokens)."""
        limit = min(len(seq.block_hashes), (seq.num_tokens - 1) // self.block_size)
        hits: list[int] = []
        for index, block_hash in enumerate(seq.block_hashes[:limit]):
            block_id = self._block_of_hash.get(block_hash)
            if block_id is None:
                break
            if self.check_tokens and self._tokens_of_block[block_id] != seq.block_token_ids(
                    index):
                return hits, True
            hits.append(block_id)
        return hits, False

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether blocks for all of ``seq``'s current tokens fit, keeping the watermark free."""
        hits, _ = self._hit_blocks(seq)
        num_taken_from_free = self.num_blocks_for(seq.num_tokens) - len(hits) + sum(
            1 for block_id in hits if self._ref_counts[block_id] == 0)
        return self.num_free_blocks - num_taken_from_free >= self.watermark_blocks

    def allocate(self, seq: Sequence) -> None:
        """Blocks for ``seq``'s current tokens, reusing its cached prefix; call can_allocate
        first. Sets ``num_cached_tokens`` and starts ``num_computed_tokens`` after the hit."""
        if seq.block_table:
            raise RuntimeError(f"{seq.seq_id!r} already holds blocks")
        hits, is_token_check_miss = self._hit_blocks(seq)
        self.num_token_check_misses += is_token_check_miss
        is_reused = self._is_reused
        for block_id in hits:
            if self._ref_counts[block_id] == 0:
                del self._free_cached[block_id]
            self._ref_counts[block_id] += 1
            if not is_reused[block_id]:
                is_reused[block_id] = True
                self.num_prefix_blocks += 1
        evicted: list[int] = []
        fresh = [self._take_free_block(evicted)
                 for _ in range(self.num_blocks_for(seq.num_tokens) - len(hits))]
        self._record_removed(evicted)
        seq.block_table = hits + fresh
        seq.num_hashed_blocks = len(hits)
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        self.prefix_cache_queries_tokens += seq.num_tokens
        self.prefix_cache_hits_tokens += seq.num_cached_tokens

    # -- progress -----------------------------------------------------------------------

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the hashes of ``seq``'s hashed blocks that are now full and computed.

        A hash another block already holds (the same prefix computed twice concurrently) is
        left to that block; this duplicate stays plain and is freed as such.
        """
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_hashes))
        first = seq.num_hashed_blocks
        stored: list[int] = []
        parent: int | None = None
        for index in range(first, num_full):
            block_hash, block_id = seq.block_hashes[index], seq.block_table[index]
            if block_hash not in self._block_of_hash:
                if not stored and index > 0:
                    parent = seq.block_hashes[index - 1]
                self._block_of_hash[block_hash] = block_id
                self._hash_of_block[block_id] = block_hash
                if self.check_tokens:
                    self._tokens_of_block[block_id] = seq.block_token_ids(index)
                stored.append(block_hash)
        seq.num_hashed_blocks = max(first, num_full)
        if stored:
            self._events.append(KvEvent("stored", tuple(stored), parent))

    def _has_room(self, seq: Sequence) -> bool:
        return len(seq.block_table) * self.block_size >= seq.num_tokens

    def can_append(self, seq: Sequence) -> bool:
        """Whether ``seq`` can hold KV for all its current tokens (at most one new block)."""
        return self._has_room(seq) or self.num_free_blocks > 0

    def append_slot(self, seq: Sequence) -> None:
        """Grow ``seq`` by one block if its last one is full; call can_append first."""
        if self._has_room(seq):
            return
        evicted: list[int] = []
        seq.block_table.append(self._take_free_block(evicted))
        self._record_removed(evicted)

    def deallocate(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks, tail first; hashed ones stay cached in the LRU list."""
        for block_id in reversed(seq.block_table):
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                if self._hash_of_block[block_id] is None:
                    self._free_plain.append(block_id)
                else:
                    self._free_cached[block_id] = None
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use, as in vLLM."""
        if self.num_used_blocks:
            return False
        for block_id in self._free_cached:
            self._hash_of_block[block_id] = None
            self._tokens_of_block[block_id] = None
            self._is_reused[block_id] = False
            self._free_plain.append(block_id)
        self.num_prefix_blocks = 0
        self._free_cached.clear()
        self._block_of_hash.clear()
        self._events.append(KvEvent("cleared", ()))
        return True

    # -- internals ----------------------------------------------------------------------

    def _take_free_block(self, evicted: list[int]) -> int:
        if self._free_plain:
            block_id = self._free_plain.popleft()
        elif self._free_cached:
            block_id, _ = self._free_cached.popitem(last=False)
            block_hash = self._hash_of_block[block_id]
            assert block_hash is not None
            del self._block_of_hash[block_hash]
            self._hash_of_block[block_id] = None
            self._tokens_of_block[block_id] = None
            if self._is_reused[block_id]:
                self._is_reused[block_id] = False
                self.num_prefix_blocks -= 1
            evicted.append(block_hash)
        else:
            raise RuntimeError("no free KV block: call can_allocate / can_append first")
        self._ref_counts[block_id] = 1
        return block_id

    def _record_removed(self, evicted: list[int]) -> None:
        if evicted:
            self._events.append(KvEvent("removed", tuple(evicted)))
