"""Chained prefix-block hashes, shared by the gateway and every worker so their hashes agree.

A prompt is cut into full blocks (``block_size`` tokens, or ``block_chars`` characters for the
tokenizer-free approximate index); block *i*'s hash covers block *i* and, through its parent's
hash, every block before it::

    h_0 = H(root, block_0)        h_i = H(h_{i-1}, block_i)
    root = H("switchyard-prefix-v1", model, cache_salt)

so equal hashes mean equal prefixes (up to 64-bit collisions; workers check tokens on a hit).
A trailing partial block is never hashed: it cannot be shared. H is BLAKE2b with an 8-byte
digest, read as an unsigned little-endian integer. Cost: O(prompt length), one hash per block.

Example::

    hashes = token_block_hashes([1, 2, 3, 4, 5], block_size=2, model="m")  # 2 hashes
    assert hashes[0] == token_block_hashes([1, 2, 9], block_size=2, model="m")[0]
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from hashlib import blake2b

HASH_VERSION = b"switchyard-prefix-v1"


# Roots already computed, by (model, cache salt): every request hashes from one, and a BLAKE2b
# object costs more than the blocks of a short prompt. Emptied when full (salts can be many).
_ROOTS: dict[tuple[str, str], int] = {}
MAX_ROOTS = 4096


def root_hash(model: str, cache_salt: str | None = None) -> int:
    """The seed of every chain for ``model`` (and ``cache_salt``, which isolates tenants)."""
    key = (model, cache_salt or "")
    found = _ROOTS.get(key)
    if found is not None:
        return found
    digest = blake2b(HASH_VERSION, digest_size=8)
    digest.update(b"\x00" + model.encode())
    digest.update(b"\x00" + key[1].encode())
    root = int.from_bytes(digest.digest(), "little")
    if len(_ROOTS) >= MAX_ROOTS:
        _ROOTS.clear()
    _ROOTS[key] = root
    return root


def chain_hash(parent: int, block: bytes) -> int:
    """The hash of one block given its parent's hash."""
    digest = blake2b(parent.to_bytes(8, "little"), digest_size=8)
    digest.update(block)
    return int.from_bytes(digest.digest(), "little")


def token_block_bytes(tokens: Sequence[int]) -> bytes:
    return array("I", tokens).tobytes()


def token_block_hashes(
    tokens: Sequence[int],
    block_size: int,
    model: str,
    cache_salt: str | None = None,
    *,
    parent: int | None = None,
) -> list[int]:
    """Hashes of the full ``block_size``-token blocks of ``tokens``, in order."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    current = root_hash(model, cache_salt) if parent is None else parent
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        current = chain_hash(current, token_block_bytes(tokens[start:start + block_size]))
        hashes.append(current)
    return hashes


def char_block_hashes(
    text: str, block_chars: int, model: str, cache_salt: str | None = None
) -> list[int]:
    """Hashes of the full ``block_chars``-character blocks of ``text`` (approximate index)."""
    if block_chars < 1:
        raise ValueError("block_chars must be >= 1")
    current = root_hash(model, cache_salt)
    hashes = []
    for start in range(0, len(text) - block_chars + 1, block_chars):
        current = chain_hash(current, text[start:start + block_chars].encode())
        hashes.append(current)
    return hashes


def num_shared_blocks(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading block hashes two chains share (their common prefix, in blocks)."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count
