"""bench.vsim with gateway replicas: each replica's own view, the shared ``sy:approx`` stream
with claims and in-flight counts, staggered round-robin rotations (``bench/vsim/replicas.py``,
``bench/vsim/approx_share.py``, ``bench/vsim/replica_report.py``)."""

from __future__ import annotations

import heapq
import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from backends.fleet.peer_load import PeerLoad
from backends.fleet.registry import Backend, BackendRegistry
from bench.run.workloads.base import TokenRange, WorkloadOptions
from bench.vsim import SharedPrefix, SimConfig, Simulation
from bench.vsim.approx_share import FLUSH_INTERVAL_S, ApproxShare, no_clock
from bench.vsim.cli import main
from routing.index_approx import ApproxPrefixIndex

OPTIONS = WorkloadOptions(system_tokens=TokenRange(200, 400), question_tokens=TokenRange(5, 20),
                          max_tokens=TokenRange(2, 8))
# Requests 2 s apart: each has finished before the next arrives, so no decision turns on load.
NUM_REQUESTS = 60
SEQUENTIAL = [2.0 * (i + 1) for i in range(NUM_REQUESTS)]
THIRD_PARTY = SimConfig(num_workers=4, num_requests=NUM_REQUESTS, mode="third-party",
                        profile="prefix_affinity_approx", warmup_fraction=0.0, seed=1)


def run_sequential(config: SimConfig) -> Simulation:
    simulation = Simulation(config, SharedPrefix(OPTIONS, num_groups=6, seed=1), SEQUENTIAL)
    simulation.run()
    return simulation


def workers_by_group(simulation: Simulation) -> dict[int, set[int]]:
    found: dict[int, set[int]] = defaultdict(set)
    recorder = simulation.recorder
    for group, worker in zip(recorder.group, recorder.worker, strict=True):
        found[group].add(worker)
    return found


def cached_fraction(simulation: Simulation) -> float:
    recorder = simulation.recorder
    return sum(recorder.num_cached_tokens) / sum(recorder.num_prompt_tokens)


@pytest.mark.parametrize(("config", "num_replicas", "share_approx"), [
    pytest.param(THIRD_PARTY, 4, True, id="third-party-shared"),
    pytest.param(replace(THIRD_PARTY, mode="own", profile="prefix_affinity"), 4, False,
                 id="own-exact-index-unshared"),
])
def test_replicas_that_know_what_one_knows_route_as_one(config: SimConfig, num_replicas: int,
                                                        share_approx: bool) -> None:
    """Claims shared at once (or the exact index every replica reads): each group stays on one
    worker and the cached share is one replica's."""
    one = run_sequential(config)
    many = run_sequential(replace(config, num_replicas=num_replicas, share_approx=share_approx,
                                  share_flush_s=0.0))
    assert all(len(workers) == 1 for workers in workers_by_group(many).values())
    assert cached_fraction(many) == cached_fraction(one) > 0.5
    assert many.recorder.worker != [-1] * NUM_REQUESTS


def test_replicas_that_share_nothing_lose_cache_hits() -> None:
    one = run_sequential(THIRD_PARTY)
    alone = run_sequential(replace(THIRD_PARTY, num_replicas=4, share_approx=False,
                                   peer_load=False))
    assert alone.share is None
    assert cached_fraction(alone) < cached_fraction(one) - 0.1
    assert max(len(workers) for workers in workers_by_group(alone).values()) > 1


def test_each_replica_keeps_its_own_books_and_index() -> None:
    simulation = Simulation(replace(THIRD_PARTY, num_replicas=3, share_approx=False,
                                    num_requests=9), SharedPrefix(OPTIONS, 6, seed=1),
                            [0.001 * (i + 1) for i in range(9)])
    simulation.run()
    # The round-robin front dealt 3 of the 9 to each; each heard only its own responses.
    assert [sum(b.cache_feedback.num_responses for b in r.backends)
            for r in simulation.replicas] == [3, 3, 3]
    assert all(b.num_in_flight == 0 for r in simulation.replicas for b in r.backends)
    indexes = [r.router.approx_index for r in simulation.replicas]
    assert len({id(index) for index in indexes}) == 3
    assert all(index is not None and len(index) > 0 for index in indexes)


class Loop:
    """The simulation's event heap, for ``ApproxShare`` alone."""

    def __init__(self, num_replicas: int, flush_interval_s: float, end_s: float) -> None:
        self.heap: list[tuple[float, int]] = []
        self.now_s = 0.0
        self.indexes = [ApproxPrefixIndex(600.0) for _ in range(num_replicas)]
        self.end_s = end_s
        self.share = ApproxShare(self.indexes, ttl_s=600.0, flush_interval_s=flush_interval_s,
                                 rtt_s=0.001, push=self.push, has_work=self.has_work)
        self.share.start(0.0)

    def push(self, at_s: float, replica: int) -> None:
        heapq.heappush(self.heap, (at_s, replica))

    def has_work(self) -> bool:
        return self.now_s < self.end_s

    def run_until(self, until_s: float) -> None:
        while self.heap and self.heap[0][0] <= until_s:
            self.now_s, replica = heapq.heappop(self.heap)
            self.share.wake(replica, self.now_s)
        self.now_s = until_s


@pytest.mark.parametrize(("flush_interval_s", "recorded_s", "heard_s"), [
    # Replica 0's XREAD blocks from 0.0005 until 0.1005 (its reply at 0.101); it then flushes,
    # the entry is in the stream at 0.1015 and replica 1's next read brings it at 0.102.
    pytest.param(FLUSH_INTERVAL_S, 0.05, 0.102, id="idle-waits-for-the-block-timeout"),
    pytest.param(FLUSH_INTERVAL_S, 0.15, 0.203, id="next-cycle"),
    pytest.param(0.0, 0.05, 0.05, id="at-once"),
])
def test_a_claim_reaches_the_other_replica_after_a_flush_and_a_read(
        flush_interval_s: float, recorded_s: float, heard_s: float) -> None:
    loop = Loop(2, flush_interval_s, end_s=1.0)
    loop.run_until(recorded_s)
    loop.share.recorder(0)((11, 12), "w1", recorded_s)
    loop.indexes[0].record((11, 12), "w1", recorded_s)
    if heard_s > recorded_s:
        loop.run_until(heard_s - 1e-6)
        assert loop.indexes[1].match((11, 12), heard_s).num_blocks == {}
    loop.run_until(heard_s + 1e-9)  # float sums of half round trips
    assert loop.indexes[1].match((11, 12), heard_s).num_blocks == {"w1": 2}
    assert loop.indexes[1].claim_s((11, 12), 2, "w1") == recorded_s  # its own time


def test_the_stream_stops_when_the_run_has_no_work() -> None:
    loop = Loop(3, FLUSH_INTERVAL_S, end_s=0.5)
    loop.run_until(10.0)
    assert not loop.heap and loop.share.num_flushes == 0


def run_cli(tmp_path: Path, *args: str) -> dict[str, Any]:
    """``python -m bench.vsim`` on a small third-party fleet, 1 and 2 replicas; its JSON."""
    out = tmp_path / "replicas.json"
    code = main(["--workers", "2", "--requests", "200", "--groups", "6", "--rate", "30",
                 "--mode", "third-party", "--profiles", "round_robin,prefix_affinity_approx",
                 "--replicas", "1,2", "--system-tokens", "200-400", "--question-tokens", "5-20",
                 "--max-tokens", "2-8", "--json", str(out), *args])
    assert code == 0
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def test_cli_compares_replicas_with_one(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    document = run_cli(tmp_path, "--sharing", "both")
    captured = capsys.readouterr()
    assert "**N replicas / one**" in captured.out
    assert "| prefix_affinity_approx x2 unshared |" in captured.out
    rows = {(r["profile"], r["num_replicas"], r["sharing"]): r for r in document["replicas"]}
    assert set(rows) == {("round_robin", 2, "n/a"), ("prefix_affinity_approx", 2, "shared"),
                         ("prefix_affinity_approx", 2, "not shared")}
    assert [key for key, r in rows.items() if r["is_judged"]] == [
        ("prefix_affinity_approx", 2, "shared")]
    assert len(document["replica_targets"]) == 3
    ratio = rows[("prefix_affinity_approx", 2, "shared")]["cached_fraction"]["ratio"]
    assert ratio is not None and not math.isnan(ratio)


# Requests 5 ms apart, each with a few steps to run: many in flight at once, on every replica.
CONCURRENT = [0.005 * (i + 1) for i in range(NUM_REQUESTS)]


class CheckedSimulation(Simulation):
    """Checks, after each arrival, every replica's view of each worker's requests in flight."""

    num_checked = 0
    num_seen_from_peers = 0
    num_wrong = 0

    def _arrive(self, now_s: float) -> None:
        super()._arrive(now_s)
        fleet = [0] * self.config.num_workers
        for item in self._in_flight.values():
            fleet[item.worker] += 1
        for replica in self.replicas:
            for i, backend in enumerate(replica.backends):
                self.num_checked += 1
                self.num_seen_from_peers += backend.peer_in_flight
                self.num_wrong += backend.state(now_s).num_in_flight != fleet[i]


@pytest.mark.parametrize(("peer_load", "is_fleet_wide"), [
    pytest.param(True, True, id="peer-load-counts-the-fleet"),
    pytest.param(False, False, id="alone-counts-its-own"),
])
def test_peer_load_shared_at_once_makes_each_replica_count_the_fleet(
        peer_load: bool, is_fleet_wide: bool) -> None:
    config = replace(THIRD_PARTY, num_replicas=4, share_flush_s=0.0, peer_load=peer_load,
                     worker=replace(THIRD_PARTY.worker), rate_per_s=200.0)
    simulation = CheckedSimulation(config, SharedPrefix(
        replace(OPTIONS, max_tokens=TokenRange(20, 40)), num_groups=6, seed=1), CONCURRENT)
    simulation.run()
    assert simulation.num_checked == NUM_REQUESTS * 4 * 4
    assert (simulation.num_wrong == 0) is is_fleet_wide
    assert (simulation.num_seen_from_peers > 0) is peer_load


def peer_loop(num_replicas: int, **options: Any
              ) -> tuple[Loop, list[list[Backend]], list[tuple[int, int]]]:
    """``Loop`` with a ``PeerLoad`` per replica over its own two backends; ``options`` to
    ``ApproxShare`` (a writer's ``push_interval_s``, ``lazy_interval_s``)."""
    loop = Loop(num_replicas, FLUSH_INTERVAL_S, end_s=5.0)
    backends = [[Backend(f"w{i}", f"vsim://w{i}", frozenset({"m"})) for i in range(2)]
                for _ in range(num_replicas)]
    changed: list[tuple[int, int]] = []
    loop.share = ApproxShare(
        loop.indexes, ttl_s=600.0, flush_interval_s=FLUSH_INTERVAL_S, rtt_s=0.001,
        push=loop.push, has_work=loop.has_work, peer_backends=backends,
        peers=[PeerLoad(BackendRegistry(b), f"r{r}", clock=no_clock)
               for r, b in enumerate(backends)],
        peer_changed=lambda replica, backend: changed.append((replica, backend)), **options)
    loop.heap.clear()
    loop.share.start(0.0)
    return loop, backends, changed


def test_in_flight_counts_travel_as_claims_do() -> None:
    """A request sent at 0.05 s by replica 0 counts at replica 1 from 0.103 s: as a claim
    (``test_a_claim_reaches_the_other_replica_after_a_flush_and_a_read``), plus the round trip
    of replica 1's own first load entry (every replica sends one at its first flush); its finish
    follows the same way."""
    loop, backends, changed = peer_loop(2)
    loop.run_until(0.05)
    backends[0][1].book_started(reserved_tokens=300, pending_prefill_tokens=200)
    loop.run_until(0.103 - 1e-6)
    assert backends[1][1].peer_in_flight == 0
    loop.run_until(0.103 + 1e-9)
    peer = backends[1][1]
    assert (peer.peer_in_flight, peer.peer_in_flight_tokens,
            peer.peer_in_flight_prompt_tokens) == (1, 300, 200)
    assert peer.state(0.2).num_in_flight == 1 and backends[0][1].peer_in_flight == 0
    assert changed == [(1, 1)]
    backends[0][1].book_finished(300, 200, had_first_token=False, was_ending=False)
    loop.run_until(0.5)
    assert backends[1][1].peer_in_flight == 0 and changed == [(1, 1), (1, 1)]


def _heard_at(loop: Loop, at_s: float, count: Callable[[], int]) -> tuple[int, int]:
    """``count()`` just before ``at_s`` and just after it (float sums of half round trips)."""
    loop.run_until(at_s - 1e-6)
    before = count()
    loop.run_until(at_s + 1e-9)
    return before, count()


def test_counts_that_fall_wait_for_a_dispatch_or_the_lazy_interval() -> None:
    """With a writer (1 ms after each flush's reply) and a 20 ms lazy interval: a dispatch
    at 0.3 s is heard at 0.301 s (in the stream half a round trip after the flush, read half a
    round trip later); a finish at 0.4 s at 0.421 s; a finish at 0.5 s goes out with a
    dispatch at 0.505 s, heard at 0.506 s."""
    loop, backends, _ = peer_loop(2, push_interval_s=0.001, lazy_interval_s=0.02)
    share = loop.share
    loop.run_until(0.1)
    backends[1][0].book_started(reserved_tokens=10, pending_prefill_tokens=5)
    share.books_changed(1, 0.1)  # replica 1 says it exists (its first entry: every row)
    loop.run_until(0.3)
    sender, seen = backends[0][1], backends[1][1]
    for _ in range(2):
        sender.book_started(reserved_tokens=300, pending_prefill_tokens=200)
    share.books_changed(0, 0.3)
    assert _heard_at(loop, 0.301, lambda: seen.peer_in_flight) == (0, 2)
    sender.book_finished(300, 200, had_first_token=False, was_ending=False)
    share.books_changed(0, 0.4, urgent=False)
    assert _heard_at(loop, 0.421, lambda: seen.peer_in_flight) == (2, 1)
    sender.book_finished(300, 200, had_first_token=False, was_ending=False)
    share.books_changed(0, 0.5, urgent=False)
    loop.run_until(0.505)
    backends[0][0].book_started(reserved_tokens=10, pending_prefill_tokens=5)
    share.books_changed(0, 0.505)
    loop.run_until(0.506 + 1e-9)
    assert (seen.peer_in_flight, backends[1][0].peer_in_flight) == (0, 1)


@pytest.mark.parametrize(("is_pipelined", "heard_s"), [(False, 0.303), (True, 0.302)])
def test_a_pipelined_writer_does_not_wait_for_the_last_reply(is_pipelined: bool,
                                                             heard_s: float) -> None:
    """A dispatch at 0.3 s goes out at once and is heard at 0.301 s; a second at 0.3005 s waits
    for the first flush's reply (0.301 s) and 1 ms more, heard at 0.303 s; pipelined, only the
    1 ms after the first was sent: heard at 0.302 s."""
    loop, backends, _ = peer_loop(2, push_interval_s=0.001, is_pipelined=is_pipelined)
    share = loop.share
    loop.run_until(0.1)
    backends[1][0].book_started(reserved_tokens=10, pending_prefill_tokens=5)
    share.books_changed(1, 0.1)
    loop.run_until(0.3)
    sender, seen = backends[0][1], backends[1][1]
    sender.book_started(reserved_tokens=300, pending_prefill_tokens=200)
    share.books_changed(0, 0.3)
    loop.run_until(0.3005)
    sender.book_started(reserved_tokens=300, pending_prefill_tokens=200)
    share.books_changed(0, 0.3005)
    assert _heard_at(loop, 0.301, lambda: seen.peer_in_flight) == (0, 1)
    assert _heard_at(loop, heard_s, lambda: seen.peer_in_flight) == (1, 2)


class _Silent:
    """A replica's ``PeerLoad`` that says nothing more (compiled, its methods cannot be
    replaced on the instance): ``entry`` None, the rest as before."""

    def __init__(self, peers: PeerLoad) -> None:
        self._peers = peers

    def entry(self, now_s: float | None = None) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._peers, name)


def test_a_silent_replica_counts_for_nothing_after_expiry() -> None:
    loop, backends, _ = peer_loop(3)
    loop.run_until(0.05)
    backends[0][0].book_started(reserved_tokens=10, pending_prefill_tokens=10)
    backends[2][0].book_started(reserved_tokens=10, pending_prefill_tokens=10)
    loop.run_until(0.5)
    assert backends[1][0].peer_in_flight == 2
    assert loop.share.peers is not None
    # Replica 2 falls silent: its last counts expire 3 s after they were heard, while replica
    # 0's keepalives (every 1 s, unchanged counts) keep its own.
    loop.share.peers[2] = cast(PeerLoad, _Silent(loop.share.peers[2]))
    loop.run_until(4.0)
    assert backends[1][0].peer_in_flight == 1


@pytest.mark.parametrize(("num_replicas", "seed", "expected"), [
    pytest.param(1, 1, [0, 1, 2, 3], id="one-replica-starts-at-0"),
    pytest.param(4, 1, None, id="replicas-not-in-step"),
])
def test_round_robin_replicas_start_at_their_own_turn(num_replicas: int, seed: int,
                                                       expected: list[int] | None) -> None:
    config = replace(THIRD_PARTY, profile="round_robin", num_replicas=num_replicas, seed=seed)
    first = run_sequential(config).recorder.worker[:4]  # one arrival per replica
    if expected is not None:
        assert first == expected
    else:
        assert len(set(first)) > 1  # in step, all four would go to worker 0
        assert run_sequential(config).recorder.worker[:4] == first  # the seed decides
        other = run_sequential(replace(config, seed=seed + 1)).recorder.worker
        assert other != run_sequential(config).recorder.worker


def test_cli_runs_peer_load_both_ways(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    document = run_cli(tmp_path, "--peer-load", "both")
    assert "| prefix_affinity_approx x2 no peer load |" in capsys.readouterr().out
    rows = {(r["profile"], r["peer_load"]): r["is_judged"] for r in document["replicas"]}
    assert rows == {("round_robin", "n/a"): False, ("prefix_affinity_approx", "on"): True,
                    ("prefix_affinity_approx", "off"): False}
    assert sorted((r["num_replicas"], r["is_peer_load"]) for r in document["results"]
                  if r["profile"] == "prefix_affinity_approx") == [
        (1, True), (2, False), (2, True)]


@pytest.mark.parametrize("share_lessons", [True, False])
def test_replicas_share_what_responses_taught_them(share_lessons: bool) -> None:
    """Under KV pressure misses teach each replica shorter claim lifetimes. Shared, every
    replica ends with the lifetimes it was taught by anyone's responses; kept to itself,
    each replica knows only what its own responses taught it."""
    worker = replace(THIRD_PARTY.worker, num_kv_blocks=30)  # each worker: room for ~1 prompt
    config = replace(THIRD_PARTY, num_replicas=2, worker=worker, share_lessons=share_lessons,
                     num_requests=400)
    simulation = Simulation(config, SharedPrefix(OPTIONS, num_groups=6, seed=1),
                            [0.5 * (i + 1) for i in range(400)])
    simulation.run()
    assert simulation.share is not None
    ttls = [dict(replica.router.approx_index._ttl_by_backend)
            for replica in simulation.replicas]
    assert all(ttls), "misses taught every replica something"
    if share_lessons:
        assert simulation.share.num_lessons_sent > 0
        assert ttls[0] == ttls[1]
    else:
        assert simulation.share.num_lessons_sent == 0
        assert ttls[0] != ttls[1]


@pytest.mark.parametrize("share_scrapes", [True, False])
def test_replicas_share_their_scrapes(share_scrapes: bool) -> None:
    """Third-party, 4 replicas: with shared scrapes each engine is read about once a scrape
    interval in all (replica 0's tick comes first; the others hear its figures a round trip
    later and skip), and every replica's figures are as fresh as one replica's; without, each
    replica reads every engine itself."""
    config = replace(THIRD_PARTY, num_replicas=4, share_scrapes=share_scrapes)
    simulation = run_sequential(config)
    per_engine_s = (sum(r.pages.num_scrapes for r in simulation.replicas if r.pages)
                    - 4 * config.num_workers) / config.num_workers / SEQUENTIAL[-1]
    if share_scrapes:
        assert 0.9 <= per_engine_s <= 1.2
        assert all(r.pages is not None and r.pages.scrapes is not None
                   for r in simulation.replicas)
        heard = [r.pages.scrapes.num_heard for r in simulation.replicas[1:]
                 if r.pages is not None and r.pages.scrapes is not None]
        assert min(heard) > config.num_workers * SEQUENTIAL[-1] * 0.8
    else:
        assert 3.6 <= per_engine_s <= 4.4
    # Every replica routes on a current view either way: no backend's figures are older than
    # an interval plus the round trip.
    end_s = max(r.pages.now_s for r in simulation.replicas if r.pages is not None)
    for replica in simulation.replicas:
        for backend in replica.backends:
            assert backend.load_observed_s is not None
            assert end_s - backend.load_observed_s <= config.scrape_interval_s * 1.01 + 0.002


def test_the_run_counts_scrapes_per_engine() -> None:
    """``RunResult.scrapes_per_engine_s``: about one a second shared, one per replica not."""
    workload = SharedPrefix(OPTIONS, num_groups=6, seed=1)
    shared = Simulation(replace(THIRD_PARTY, num_replicas=4, share_scrapes=True), workload,
                        SEQUENTIAL).run()
    alone = Simulation(replace(THIRD_PARTY, num_replicas=4, share_scrapes=False),
                       SharedPrefix(OPTIONS, num_groups=6, seed=1), SEQUENTIAL).run()
    own = Simulation(replace(THIRD_PARTY, mode="own", profile="prefix_affinity"),
                     SharedPrefix(OPTIONS, num_groups=6, seed=1), SEQUENTIAL).run()
    assert 0.9 <= shared.scrapes_per_engine_s <= 1.2
    assert 3.6 <= alone.scrapes_per_engine_s <= 4.4
    assert own.scrapes_per_engine_s == 0.0
