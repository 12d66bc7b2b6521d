"""What routing keeps of a prompt is bounded: the prefix it hashes, the text it tokenizes and
the token cache it keeps, whatever clients send (an 8 MiB prompt, unique prompts for hours)."""

from __future__ import annotations

from backends.fleet.registry import Backend, BackendRegistry
from backends.tokenizer import ApproxTokenizer
from gateway.app import make_router
from gateway.router import MAX_PREFIX_BLOCKS, MAX_TOKENIZED_CHARS, Router, _SegmentCache
from gateway.settings import RoutingSettings
from routing import ApproxPrefixIndex, ExactPrefixIndex, profile_by_name

MODEL = "m"


def router(tokenize: bool) -> tuple[Router, Backend]:
    backend = Backend("w0", "http://127.0.0.1:19000", frozenset({MODEL}))
    tokenizers = {MODEL: ApproxTokenizer()} if tokenize else {}
    return Router(BackendRegistry([backend]), profile_by_name("prefix_affinity"),
                  ExactPrefixIndex(), ApproxPrefixIndex(), tokenizers), backend


def chat(chars: int) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "word " * (chars // 5)}]}


def test_a_huge_prompt_hashes_a_bounded_prefix_and_is_not_tokenized() -> None:
    route, backend = router(tokenize=True)
    plan = route.describe(MODEL, chat(8 * 1024 * 1024), "t")
    assert len(plan.request.char_hashes) == MAX_PREFIX_BLOCKS
    assert not plan.request.is_exact_count and not plan.request.block_hashes
    assert plan.request.num_prompt_tokens > 2_000_000  # still its estimated size
    route.started(backend, plan)
    assert len(route.approx_index) == MAX_PREFIX_BLOCKS


def test_a_large_prompt_under_the_limit_is_counted_exactly() -> None:
    route, _ = router(tokenize=True)
    plan = route.describe(MODEL, chat(MAX_TOKENIZED_CHARS // 2), "t")
    assert plan.request.is_exact_count
    assert 0 < len(plan.request.block_hashes) <= MAX_PREFIX_BLOCKS
    assert len(plan.request.char_hashes) == MAX_PREFIX_BLOCKS


def test_the_token_cache_is_bounded_in_bytes() -> None:
    cache = _SegmentCache(max_bytes=256 * 1024)
    tokenizer = ApproxTokenizer()
    for index in range(2_000):  # unique segments, ~4 KB of tokens each: ~8 MB if unbounded
        cache.encode(tokenizer, f"user {index}\n" + "lorem ipsum dolor " * 200)
    assert 0 < cache.num_bytes <= 256 * 1024
    again = cache.encode(tokenizer, "user 1999\n" + "lorem ipsum dolor " * 200)
    assert list(again) == tokenizer.encode("user 1999\n" + "lorem ipsum dolor " * 200)


def test_the_bounds_come_from_the_routing_settings() -> None:
    settings = RoutingSettings(tokenizers={MODEL: "approx"}, segment_cache_mib=0.25,
                               approx_max_blocks=2048)
    backend = Backend("w0", "http://127.0.0.1:19000", frozenset({MODEL}))
    route = make_router(settings, BackendRegistry([backend]))
    for index in range(300):  # unique prompts of ~2,000 tokens: ~2.4 MB of ids, 60k blocks
        plan = route.describe(MODEL, {"messages": [
            {"role": "user", "content": f"{index} " + "lorem ipsum dolor " * 450}]}, "t")
        assert plan.request.is_exact_count
        route.started(backend, plan)
    assert 0 < route.segment_cache_bytes <= 256 * 1024
    assert 0 < len(route.approx_index) <= 2048


def test_a_zero_segment_cache_keeps_nothing_and_still_counts() -> None:
    cache = _SegmentCache(max_bytes=0)
    tokenizer = ApproxTokenizer()
    assert list(cache.encode(tokenizer, "hello there")) == tokenizer.encode("hello there")
    assert cache.num_bytes == 0 and len(cache) == 0
