"""A deterministic trace of decisions, to compare the compiled modules with the interpreted.

``python -m admission.native_check`` prints ``routing.native.STATUS`` on its first line, then one
line per decision: seeded random fleets and requests through every built-in routing profile
(``schedule_scored``), SLO admission's policy (``admission.policy.decide``) with a predictor
that learns as it goes, the fair queue (pushes and pops) and the approximate prefix index.
Times are the trace's own, so two runs print the same lines exactly when the code decides the
same; ``scripts/build_native.py`` runs it with ``SWITCHYARD_NATIVE=0`` and ``=1`` and keeps a
build only when the two agree. Floats are printed with ``repr`` (every bit).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator

from routing import native

NUM_CASES = 400


def _snapshot(rng: random.Random, now_s: float, num_backends: int) -> object:
    from routing.types import BackendProfile, BackendState, FleetSnapshot, PrefixMatch

    backends = []
    for i in range(num_backends):
        max_batch = rng.choice([None, 8, 16, 64])
        profile = BackendProfile(num_kv_blocks=rng.choice([None, 512, 4096]), block_size=16,
                                 max_batch=max_batch, prefill_tokens_per_s=rng.choice(
                                     [None, 2000.0, 8000.0]))
        running = rng.randrange(0, 70)
        backends.append(BackendState(
            name=f"b{i}", models=frozenset({"m"}), is_healthy=rng.random() > 0.1,
            age_s=rng.choice([0.0, 0.2, 1.0, 9.0]), profile=profile, num_running=running,
            num_waiting=rng.randrange(0, 10), kv_usage=rng.random(),
            num_queued_prefill_tokens=rng.randrange(0, 5000),
            num_in_flight=rng.randrange(0, 70), num_in_flight_tokens=rng.randrange(0, 40000),
            num_in_flight_prompt_tokens=rng.randrange(0, 8000), num_ending=rng.randrange(0, 3),
            source=rng.choice(["heartbeat", "metrics", "config"])))
    held = {f"b{i}": rng.randrange(1, 40) for i in range(num_backends) if rng.random() < 0.4}
    return FleetSnapshot(now_s=now_s, backends=tuple(backends),
                         prefix=PrefixMatch(num_blocks=held, block_tokens=16,
                                            is_exact=rng.random() < 0.5),
                         positions={f"b{i}": i for i in range(num_backends)})


def trace() -> Iterator[str]:
    from admission.fair_queue import FairQueue
    from admission.policy import AdmissionRequest, decide
    from admission.predictor import TtftPredictor, snapshot_features
    from admission.sfq import QueueEntry
    from admission.tiers import DEFAULT_TIERS
    from routing.index_approx import ApproxPrefixIndex
    from routing.profiles import PROFILES, profile_by_name
    from routing.scheduler import schedule_scored
    from routing.types import FleetSnapshot, RouteRequest

    rng = random.Random(20261204)
    predictor = TtftPredictor()
    queue = FairQueue(DEFAULT_TIERS)
    index = ApproxPrefixIndex()
    profiles = [profile_by_name(name) for name in sorted(PROFILES)]
    for case in range(NUM_CASES):
        now_s = 100.0 + case * 0.01
        snapshot = _snapshot(rng, now_s, rng.choice([1, 4, 16, 64]))
        assert isinstance(snapshot, FleetSnapshot)
        chain = tuple(rng.randrange(1 << 62) for _ in range(rng.randrange(0, 12)))
        request = RouteRequest(model="m", num_prompt_tokens=rng.randrange(1, 9000),
                               char_hashes=chain, session_key=rng.choice([None, "s1", "s2"]),
                               tenant_id=f"t{case % 5}", max_tokens=rng.choice([None, 16, 512]))
        for profile in profiles:
            ranked, scored = schedule_scored(request, snapshot, profile, now_s,
                                             random.Random(case), max_ranked=2)
            picks = [(r.backend, repr(r.score), r.reasons, r.expected_cached_tokens)
                     for r in ranked]
            yield f"{case} {profile.name}: {picks} {[b.name for b in scored]}"
        tier = DEFAULT_TIERS[case % len(DEFAULT_TIERS)]
        admission = AdmissionRequest(tier=tier, tenant=f"t{case % 5}",
                                     prompt_tokens=request.num_prompt_tokens, model="m",
                                     arrival_s=now_s, max_tokens=request.max_tokens)
        decision = decide(admission, snapshot, predictor, now_s,
                          num_queued_ahead=rng.randrange(0, 4), reserved_slots=rng.randrange(0, 3),
                          slot_free_rate_per_s=rng.choice([0.0, 5.0, 50.0]))
        yield (f"{case} decide: {decision.action} {decision.code} {decision.reason!r} "
               f"{decision.retry_after_s!r} {decision.deadline_s!r}")
        backend = snapshot.backends[rng.randrange(len(snapshot.backends))]
        predictor.observe(backend, snapshot_features(snapshot, backend.name,
                                                     rng.randrange(0, 4000)),
                          rng.random() * 2)
        queue.push(QueueEntry(entry_id=f"e{case}", tenant=f"t{case % 7}", tier=tier.name,
                              cost_tokens=rng.randrange(1, 4000), arrival_s=now_s,
                              deadline_s=now_s + rng.choice([0.5, 5.0]),
                              weight=rng.choice([1.0, 2.0])), now_s)
        if case % 3 == 0:
            popped = queue.pop(now_s)
            yield f"{case} pop: {None if popped is None else popped.entry_id}"
        if chain:
            index.record(chain[:rng.randrange(1, len(chain) + 1)], backend.name, now_s)
            match = index.match(chain, now_s)
            yield f"{case} approx: {sorted(match.num_blocks.items())} {match.block_tokens}"


def main() -> int:
    status = native.STATUS
    print(status)
    for line in trace():
        print(line)
    if "compiled" in status:
        import routing.scheduler

        if not native.is_compiled(routing.scheduler):
            print("the build was reported loaded, but routing.scheduler is interpreted",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
