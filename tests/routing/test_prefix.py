"""Chained prefix hashes: equal prefixes agree, any difference propagates, seeds isolate."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from routing import prefix
from routing.prefix import (
    char_block_hashes,
    num_shared_blocks,
    root_hash,
    token_block_hashes,
)


@pytest.mark.parametrize(
    ("a", "b", "block_size", "shared"),
    [
        pytest.param(list(range(10)), list(range(10)), 4, 2, id="identical-2-full-blocks"),
        pytest.param([*range(8), 99], [*range(8), 7], 4, 2, id="differ-in-tail"),
        pytest.param([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 9, 4, 5, 6, 7], 4, 0,
                     id="first-block-differs-so-all-differ"),
        pytest.param([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 8], 4, 1,
                     id="second-block-differs"),
        pytest.param([1, 2, 3], [1, 2, 3], 4, 0, id="partial-block-not-hashed"),
    ],
)
def test_token_chains_share_exactly_the_common_full_blocks(
    a: list[int], b: list[int], block_size: int, shared: int
) -> None:
    ha = token_block_hashes(a, block_size, "m")
    hb = token_block_hashes(b, block_size, "m")
    assert len(ha) == len(a) // block_size
    assert num_shared_blocks(ha, hb) == shared


def test_roots_are_remembered_within_a_bound_and_never_change() -> None:
    first = root_hash("m", "salt-0")
    salts = [f"salt-{i}" for i in range(prefix.MAX_ROOTS + 10)]
    roots = [root_hash("m", salt) for salt in salts]  # overflows the memory once
    assert len(prefix._ROOTS) <= prefix.MAX_ROOTS
    assert len(set(roots)) == len(roots)
    assert root_hash("m", "salt-0") == first == roots[0]  # computed again after the clear
    assert root_hash("m", None) == root_hash("m", "")  # no salt is the empty salt, as before


def test_same_block_at_another_position_hashes_differently() -> None:
    hashes = token_block_hashes([5, 5, 5, 5], 2, "m")
    assert hashes[0] != hashes[1]


@pytest.mark.parametrize(
    ("model_a", "salt_a", "model_b", "salt_b"),
    [
        pytest.param("m1", None, "m2", None, id="model-seeds"),
        pytest.param("m", "tenant-a", "m", "tenant-b", id="cache-salt-isolates"),
        pytest.param("m", None, "m", "x", id="salt-vs-none"),
    ],
)
def test_seeds_separate_chains(
    model_a: str, salt_a: str | None, model_b: str, salt_b: str | None
) -> None:
    assert root_hash(model_a, salt_a) != root_hash(model_b, salt_b)
    tokens = list(range(16))
    assert token_block_hashes(tokens, 4, model_a, salt_a)[0] != token_block_hashes(
        tokens, 4, model_b, salt_b
    )[0]


def test_hashes_are_stable_across_processes() -> None:
    # Workers and gateways in different processes must agree: no per-process randomness.
    code = "from routing.prefix import token_block_hashes as t; print(t([1, 2, 3, 4], 2, 'm'))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outputs == {str(token_block_hashes([1, 2, 3, 4], 2, "m"))}
    assert char_block_hashes("abcdefgh", 4, "m") == char_block_hashes("abcdefghij", 4, "m")


def test_continuing_a_chain_from_a_parent_equals_hashing_the_whole() -> None:
    tokens = list(range(12))
    whole = token_block_hashes(tokens, 4, "m")
    tail = token_block_hashes(tokens[4:], 4, "m", parent=whole[0])
    assert whole[1:] == tail


@pytest.mark.parametrize("bad", [0, -1])
def test_block_size_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        token_block_hashes([1, 2], bad, "m")
