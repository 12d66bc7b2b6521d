from __future__ import annotations

import pytest
import torch

from backends.worker.greedy import greedy
from tests.backends.worker.checkpoints import tiny_model

PROMPT = [4, 8, 15, 16, 23, 42]


def _greedy_without_cache(model, prompt: list[int], num_tokens: int) -> list[int]:  # type: ignore[no-untyped-def]
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(num_tokens):
            hidden = model(torch.tensor([ids]), torch.arange(len(ids))[None])
            ids.append(int(model.compute_logits(hidden[0, -1]).argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed-{s}") for s in (0, 1, 2)])
def test_matches_recomputing_the_whole_sequence(seed: int) -> None:
    model = tiny_model(seed=seed)
    assert greedy(model, PROMPT, 12) == _greedy_without_cache(model, PROMPT, 12)


def test_stops_after_a_stop_token() -> None:
    model = tiny_model()
    tokens = greedy(model, PROMPT, 12)
    stop = tokens[4]
    first = tokens.index(stop)
    assert greedy(model, PROMPT, 12, stop_ids={stop}) == tokens[: first + 1]


def test_needs_a_prompt() -> None:
    with pytest.raises(ValueError, match="prompt"):
        greedy(tiny_model(), [], 3)
