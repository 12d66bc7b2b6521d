"""A sequence's hashes, progress figures and finish rule."""

from __future__ import annotations

import pytest

from backends.engine_core.sequence import Sequence
from routing.prefix import token_block_hashes


def make(prompt: list[int], max_tokens: int = 4, stop: int | None = None) -> Sequence:
    return Sequence("s", prompt, max_tokens, 0.0, model="m", block_size=4, cache_salt="t",
                    stop_after_tokens=stop)


def test_block_hashes_are_routing_prefix_hashes() -> None:
    seq = make(list(range(10)))
    assert seq.block_hashes == tuple(token_block_hashes(list(range(10)), 4, "m", "t"))
    assert len(seq.block_hashes) == 2  # the trailing partial block is never hashed


@pytest.mark.parametrize(
    ("max_tokens", "stop", "num_output", "expected"),
    [
        pytest.param(4, None, 3, None, id="running"),
        pytest.param(4, None, 4, "length", id="max-tokens"),
        pytest.param(4, 2, 2, "stop", id="stop-length"),
        pytest.param(4, 4, 4, "length", id="length-wins-ties-like-vllm"),
    ],
)
def test_finish_reason(max_tokens: int, stop: int | None, num_output: int,
                       expected: str | None) -> None:
    seq = make([1, 2, 3], max_tokens, stop)
    seq.num_output_tokens = num_output
    assert seq.finish_reason_now() == expected


@pytest.mark.parametrize(
    ("computed", "outputs", "decoding", "queued_prefill"),
    [
        pytest.param(0, 0, False, 6, id="fresh"),
        pytest.param(4, 0, False, 2, id="chunk-done"),
        pytest.param(6, 1, True, 0, id="decoding"),
        pytest.param(0, 2, False, 8, id="preempted-recomputes-outputs-too"),
    ],
)
def test_progress(computed: int, outputs: int, decoding: bool, queued_prefill: int) -> None:
    seq = make([1, 2, 3, 4, 5, 6])
    seq.num_computed_tokens, seq.num_output_tokens = computed, outputs
    assert seq.is_decoding is decoding
    assert seq.num_queued_prefill_tokens == queued_prefill


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "stop"),
    [
        pytest.param([], 4, None, id="empty-prompt"),
        pytest.param([1], 0, None, id="no-output"),
        pytest.param([1], 4, 0, id="stop-zero"),
    ],
)
def test_rejects(prompt: list[int], max_tokens: int, stop: int | None) -> None:
    with pytest.raises(ValueError, match="sequence 's'"):
        make(prompt, max_tokens, stop)
