"""Own workers' KV events make the exact index the authority on what they hold: where it knows
no holder of a prompt, an approximate claim on such a worker counts only while it is younger
than the events' way to the gateway (``FOLLOWED_CLAIM_S``); on a backend without KV events
(listed statically) a claim counts for its whole lifetime."""

from __future__ import annotations

from backends.fleet.registry import Backend, BackendRegistry
from gateway.router import FOLLOWED_CLAIM_S, Router
from routing import ApproxPrefixIndex, ExactPrefixIndex, profile_by_name
from routing.prefix import char_block_hashes
from routing.types import RouteRequest

MODEL = "m"
NOW_S = 1_000.0


def setup() -> tuple[Router, ExactPrefixIndex, ApproxPrefixIndex, tuple[int, ...]]:
    backends = [Backend(name, f"http://127.0.0.1:{port}", frozenset({MODEL}))
                for name, port in (("own", 19000), ("listed", 19001))]
    exact, approx = ExactPrefixIndex(), ApproxPrefixIndex(ttl_s=600)
    exact.load_snapshot("own", [])  # its KV events are followed; it holds nothing yet
    router = Router(BackendRegistry(backends), profile_by_name("prefix_affinity"), exact,
                    approx, {}, wall_clock=lambda: NOW_S)
    chain = tuple(char_block_hashes("the house rules, once more. " * 40, 64, MODEL))
    return router, exact, approx, chain


def matched(router: Router, chain: tuple[int, ...], block_hashes: tuple[int, ...] = (7, 8, 9)
            ) -> dict[str, int]:
    request = RouteRequest(model=MODEL, num_prompt_tokens=600, block_hashes=block_hashes,
                           char_hashes=chain)
    return dict(router.snapshot(request, 0.0).prefix.num_blocks)


def test_an_old_claim_on_a_backend_with_kv_events_is_stale() -> None:
    router, _, approx, chain = setup()
    for name in ("own", "listed"):
        approx.record(chain, name, NOW_S - 10.0)
    assert matched(router, chain) == {"listed": len(chain)}
    # Without a tokenizer there is no exact index to ask: every claim counts.
    assert matched(router, chain, block_hashes=()) == {"own": len(chain), "listed": len(chain)}


def test_a_fresh_claim_counts_until_the_events_are_in() -> None:
    router, exact, approx, chain = setup()
    approx.record(chain, "own", NOW_S - FOLLOWED_CLAIM_S / 2)
    assert matched(router, chain) == {"own": len(chain)}
    exact.apply("own", "stored", [7, 8])  # the events came: the exact index answers alone
    assert matched(router, chain) == {"own": 2}


def test_a_cleared_backend_is_still_followed() -> None:
    router, exact, approx, chain = setup()
    exact.apply("own", "stored", [7, 8, 9])
    exact.apply("own", "cleared")
    approx.record(chain, "own", NOW_S - 10.0)
    assert exact.follows("own") and not exact.follows("listed")
    assert matched(router, chain) == {}
