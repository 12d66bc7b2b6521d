"""The cache_room scorer: room left for reused prefixes after the request; neutral when unknown."""

from __future__ import annotations

import random

import pytest

from routing.plugins.cache_room import CacheRoomScorer
from routing.profile import build_profile
from routing.scheduler import schedule
from routing.types import BackendState
from tests.routing.builders import backend, cycle, profile, request, snapshot

STALE = 60.0
KV = profile(num_kv_blocks=1000, block_size=16)


def kv(name: str, kept: int | None, **fields: object) -> BackendState:
    """A backend with 1,000 KV blocks of 16 tokens, ``kept`` of them reused prefixes."""
    fields.setdefault("profile", KV)
    return backend(name, num_prefix_kv_blocks=kept, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("backends", "matched", "expected_rooms", "expected_scores"),
    [
        pytest.param([kv("a", 200), kv("b", 600)], {}, [0.7, 0.3], [1.0, 0.636],
                     id="nobody-holds-it-the-roomiest-wins"),
        pytest.param([kv("a", 0), kv("b", 380)], {}, [0.9, 0.52], [1.0, 1.0],
                     id="ample-room-everywhere-is-neutral"),
        pytest.param([kv("a", 200), kv("b", 200)], {}, [0.7, 0.7], [1.0, 1.0],
                     id="equal-room-is-neutral"),
        pytest.param([kv("a", 900), kv("b", 500)], {"a": 100}, [0.1, 0.4], [0.333, 1.0],
                     id="holder-needs-no-room-for-its-own-prefix"),
        pytest.param([kv("a", 900), kv("b", 850)], {"a": 100}, [0.1, 0.05], [1.0, 0.667],
                     id="full-holder-beats-fuller-stranger"),
        pytest.param([kv("a", 980), kv("b", 1000)], {}, [0.0, 0.0], [1.0, 1.0],
                     id="over-full-caches-have-no-room"),
        pytest.param([kv("a", 200, age_s=STALE), kv("b", 600)], {}, [0.0, 0.3],
                     [0.143, 1.0], id="stale-is-full-never-empty"),
        pytest.param([kv("a", None), kv("b", None)], {}, [None, None], [1.0, 1.0],
                     id="no-figures-neutral"),
        pytest.param([kv("a", 200), kv("b", 600), kv("c", None)], {}, [0.7, 0.3, None],
                     [1.0, 0.636, 0.818], id="unknown-gets-the-mean"),
        pytest.param([kv("a", 200, profile=profile()), kv("b", 600)], {}, [None, 0.3],
                     [1.0, 1.0], id="no-kv-capacity-is-unknown"),
    ],
)
def test_rooms_and_scores(backends: list[BackendState], matched: dict[str, int],
                          expected_rooms: list[float | None],
                          expected_scores: list[float]) -> None:
    # a 1,600-token prompt: 100 blocks of 16 to store where nothing is cached
    c = cycle(*backends, req=request(1600), matched=matched, block_tokens=16)
    scorer = CacheRoomScorer()
    rooms = scorer.rooms(c, backends)
    assert [None if r is None else round(r, 3) for r in rooms] == expected_rooms
    assert [round(s, 3) for s in scorer.score(c, backends)] == expected_scores


def test_no_candidates_no_scores() -> None:
    assert CacheRoomScorer().score(cycle(), []) == []


def test_block_size_from_the_profile_counts_the_need() -> None:
    # 1,600 tokens are 50 blocks of 32: a needs less room than its 16-token-block twin would
    big_blocks = kv("a", 200, profile=profile(num_kv_blocks=1000, block_size=32))
    c = cycle(big_blocks, req=request(1600))
    assert CacheRoomScorer().rooms(c, [big_blocks]) == [pytest.approx(0.75)]


def test_decides_between_equally_loaded_backends() -> None:
    # ttft alone cannot tell two idle non-holders apart; cache_room sends the prompt where it
    # evicts nothing others reuse
    routing = build_profile({"scorers": [{"type": "ttft", "weight": 4},
                                         {"type": "cache_room", "weight": 1}]})
    full, roomy = kv("full", 950), kv("roomy", 300)
    ranked = schedule(request(1600), snapshot(full, roomy), routing, now_s=100.0,
                      rng=random.Random(0))
    assert [r.backend for r in ranked] == ["roomy", "full"]
    assert dict(ranked[0].reasons)["cache_room"] == pytest.approx(1.0)


def test_does_not_override_an_idle_holder() -> None:
    routing = build_profile({"scorers": [{"type": "ttft", "weight": 4},
                                         {"type": "prefix", "weight": 1},
                                         {"type": "cache_room", "weight": 3}]})
    holder, stranger = kv("holder", 990), kv("stranger", 0)
    req = request(1600, block_hashes=tuple(range(100)))
    ranked = schedule(req, snapshot(holder, stranger, matched={"holder": 99}), routing,
                      now_s=100.0, rng=random.Random(0))
    assert ranked[0].backend == "holder"


@pytest.mark.parametrize("floor", [pytest.param(0, id="zero"), pytest.param(1.5, id="above-1")])
def test_floor_is_checked(floor: float) -> None:
    with pytest.raises(ValueError, match="floor"):
        CacheRoomScorer(floor=floor)
