"""What one routing decision costs, in microseconds of CPU on the gateway's hot path.

A 4k-token prompt (256 blocks of 16 tokens) is routed over 64 backends with a populated exact
prefix index: every measured call runs ``ExactPrefixIndex.match`` on the request's block chain,
puts the match into the fleet snapshot and calls ``schedule()``; hashing the prompt is done
beforehand and not counted (the gateway hashes once per request, for routing and the index).
Each profile is timed with ``time.perf_counter_ns`` around each call::

    python -m bench.routing.cost                 # 5 rounds of 10,000 decisions per profile
    python -m bench.routing.cost --quick         # a smoke run (one round of 1,000)
    python -m bench.routing.cost --profile prefix_affinity --rounds 9

It prints p50 / p99 microseconds per decision and PASS/FAIL against the target (p99 <= 100 us
for ``prefix_affinity``, the default profile, ranking every candidate it scored: over 64
backends it scores a shortlist of the prompt's deepest holders and a random 8,
``routing.shortlist``; ``prefix_affinity_all`` scores and ranks all 64); nothing is asserted.
On a shared machine other processes only ever add time, so the figures come from the quietest
round (lowest p99), next to the median round's p99, the process CPU per call and how busy the
other processes kept the machine. ``top 2`` is the same decision as the gateway asks for it
(``gateway/proxy.py``: the pick and one retry, ``max_ranked=2``), also checked against the
target; ``top 4`` asks for the pick and three retries. ``gateway Router.rank`` is the whole
decision as the gateway takes it (``gateway/router.py``: the fleet snapshot from its 64
``Backend`` records, the match, ``schedule()``), with one dispatch and one finish between
calls, so each call rebuilds the states of the backends they changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.fleet.registry import Backend, BackendRegistry
from bench.common.procstat import busy_cpu_seconds
from bench.common.stats import percentile
from gateway.router import RoutePlan, Router
from routing import (
    DEFAULT_PROFILE,
    PROFILES,
    ApproxPrefixIndex,
    BackendProfile,
    BackendState,
    ExactPrefixIndex,
    FleetSnapshot,
    RouteRequest,
    profile_by_name,
    schedule,
)
from routing.prefix import token_block_hashes

NUM_BACKENDS = 64
BLOCK_SIZE = 16
NUM_PROMPT_TOKENS = 4096
NUM_REQUESTS = 32  # distinct prompts, cycled, so no single chain stays hot in the CPU caches
TARGET_P99_US = 100.0
GATEWAY_MAX_RANKED = 2  # what gateway/proxy.py asks for: the pick and one retry
MODEL = "bench-model"


def _fleet(rng: random.Random) -> tuple[BackendState, ...]:
    profile = BackendProfile(device="sim-h100", num_kv_blocks=24_576, block_size=BLOCK_SIZE,
                             max_batch=256, max_context_tokens=32_768,
                             prefill_tokens_per_s=rng.choice([8_000.0, 10_000.0, 12_000.0]))
    return tuple(
        BackendState(
            name=f"w{i:02d}", models=frozenset({MODEL}), age_s=rng.uniform(0.0, 2.0),
            profile=profile, num_running=rng.randrange(0, 64), num_waiting=rng.randrange(0, 8),
            kv_usage=rng.uniform(0.1, 0.9), num_queued_prefill_tokens=rng.randrange(0, 20_000),
            num_in_flight=rng.randrange(0, 32), num_in_flight_tokens=rng.randrange(0, 60_000),
            num_in_flight_prompt_tokens=rng.randrange(0, 8_000),
            num_prefix_kv_blocks=rng.randrange(0, 24_576), source="heartbeat",
        )
        for i in range(NUM_BACKENDS)
    )


def _requests_and_index(rng: random.Random) -> tuple[list[RouteRequest], ExactPrefixIndex]:
    """Prompts sharing 32 system prompts; each is held, to varying depth, by 1-6 backends,
    and every backend also holds 2,000 unrelated blocks."""
    index = ExactPrefixIndex(block_size=BLOCK_SIZE)
    requests = []
    for r in range(NUM_REQUESTS):
        tokens = [rng.randrange(50_000) for _ in range(NUM_PROMPT_TOKENS)]
        hashes = token_block_hashes(tokens, BLOCK_SIZE, MODEL)
        for name in rng.sample([f"w{i:02d}" for i in range(NUM_BACKENDS)], rng.randint(1, 6)):
            index.apply(name, "stored", hashes[:rng.randint(16, len(hashes))])
        requests.append(RouteRequest(model=MODEL, num_prompt_tokens=NUM_PROMPT_TOKENS,
                                     block_hashes=tuple(hashes), session_key=f"s{r}",
                                     max_tokens=256))
    for i in range(NUM_BACKENDS):
        index.apply(f"w{i:02d}", "stored", [rng.getrandbits(64) for _ in range(2_000)])
    return requests, index


@dataclass(frozen=True, slots=True)
class Round:
    """One round of timed decisions: wall-clock samples, and CPU per call over the round."""

    samples_us: list[float]
    cpu_us_per_call: float
    others_cores_busy: float  # other processes' load on the machine meanwhile

    @property
    def p50_us(self) -> float:
        return percentile(self.samples_us, 0.5)

    @property
    def p99_us(self) -> float:
        return percentile(self.samples_us, 0.99)


@dataclass(frozen=True, slots=True)
class Setup:
    backends: tuple[BackendState, ...]
    requests: list[RouteRequest]
    index: ExactPrefixIndex

    @classmethod
    def build(cls, seed: int = 0) -> Setup:
        rng = random.Random(seed)
        backends = _fleet(rng)
        return cls(backends, *_requests_and_index(rng))


def measure(setup: Setup, profile_name: str | None, num_calls: int,
            max_ranked: int | None = None, seed: int = 0) -> Round:
    """Microseconds per decision (match + snapshot + schedule), one sample per call;
    ``profile_name=None`` times ``ExactPrefixIndex.match`` alone."""
    backends, requests, index = setup.backends, setup.requests, setup.index
    profile = profile_by_name(profile_name or "random")
    # the gateway keeps the name -> index map per fleet membership (gateway/router.py)
    base = FleetSnapshot(now_s=100.0, backends=backends,
                         positions={b.name: i for i, b in enumerate(backends)})
    replace = dataclasses.replace
    decide_rng = random.Random(seed + 1)

    def decide(call: int) -> None:
        request = requests[call % NUM_REQUESTS]
        match = index.match(request.block_hashes)
        if profile_name is not None:
            snapshot = replace(base, prefix=match)
            schedule(request, snapshot, profile, 100.0, decide_rng, max_ranked=max_ranked)

    return _timed(num_calls, decide)


def _registry(backends: Sequence[BackendState]) -> BackendRegistry:
    """The gateway's records of ``backends``, load observed ``age_s`` before now."""
    records: list[Backend] = []
    for state in backends:
        record = Backend(state.name, f"http://127.0.0.1:{19_000 + len(records)}", state.models,
                         source="heartbeat", profile=state.profile)
        for name in _LOAD_FIELDS:
            setattr(record, name, getattr(state, name))
        records.append(record)
    return BackendRegistry(records)


_LOAD_FIELDS = ("num_running", "num_waiting", "kv_usage", "num_queued_prefill_tokens",
                "num_in_flight", "num_in_flight_tokens", "num_in_flight_prompt_tokens",
                "num_prefix_kv_blocks")


def measure_gateway(setup: Setup, profile_name: str, num_calls: int,
                    max_ranked: int = GATEWAY_MAX_RANKED) -> Round:
    """Microseconds per ``Router.rank`` (snapshot + match + schedule), one sample per call."""
    registry = _registry(setup.backends)
    router = Router(registry, profile_by_name(profile_name), setup.index, ApproxPrefixIndex(),
                    {}, seed=1)
    now_s = time.monotonic()
    for record, state in zip(registry.backends, setup.backends, strict=True):
        record.load_observed(now_s - state.age_s)
    plans = [RoutePlan(request, request.num_prompt_tokens + 256) for request in setup.requests]
    records = registry.backends

    def prepare(call: int) -> None:
        plan = plans[call % NUM_REQUESTS]
        plan.snapshot = None
        # one request dispatched and one finished since the last decision
        other = records[(call * 7) % NUM_BACKENDS]
        router.started(other, plan)
        router.finished(other, plan, had_first_token=False)

    def decide(call: int) -> None:
        router.rank(plans[call % NUM_REQUESTS], max_ranked=max_ranked)

    return _timed(num_calls, decide, prepare)


def _timed(num_calls: int, decide: Callable[[int], None],
           prepare: Callable[[int], None] | None = None) -> Round:
    """``decide(call)`` timed per call after ``num_calls // 10`` untimed warm-up calls;
    ``prepare(call)`` runs before each, untimed."""
    clock = time.perf_counter_ns
    samples: list[float] = []
    num_warmup = num_calls // 10
    for call in range(num_warmup + num_calls):
        if call == num_warmup:
            samples.clear()
            cpu_start_ns, wall_start_ns = time.process_time_ns(), clock()
            busy_start_s = busy_cpu_seconds()
        if prepare is not None:
            prepare(call)
        start = clock()
        decide(call)
        samples.append((clock() - start) / 1000.0)
    cpu_s = (time.process_time_ns() - cpu_start_ns) / 1e9
    wall_s = (clock() - wall_start_ns) / 1e9
    others_s = busy_cpu_seconds() - busy_start_s - cpu_s
    return Round(samples, cpu_s * 1e6 / num_calls, max(0.0, others_s / wall_s))


def quietest(rounds: list[Round]) -> Round:
    """The round with the lowest p99: other processes only ever add time."""
    return min(rounds, key=lambda r: r.p99_us)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="decisions per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per profile")
    parser.add_argument("--profile", action="append", choices=sorted(PROFILES),
                        help="profile(s) to time (default: all)")
    parser.add_argument("--quick", action="store_true", help="1 round of 1,000 decisions")
    args = parser.parse_args(argv)
    num_calls, num_rounds = (1_000, 1) if args.quick else (args.calls, args.rounds)
    cases: list[tuple[str, str | None, int | None]] = [("index.match only", None, None)]
    cases += [(name, name, None) for name in args.profile or PROFILES]
    cases.append((f"{DEFAULT_PROFILE}, top 2", DEFAULT_PROFILE, GATEWAY_MAX_RANKED))
    cases.append((f"{DEFAULT_PROFILE}, top 4", DEFAULT_PROFILE, 4))
    gateway_case = f"gateway Router.rank, {DEFAULT_PROFILE}, top {GATEWAY_MAX_RANKED}"
    cases.append((gateway_case, DEFAULT_PROFILE, GATEWAY_MAX_RANKED))
    num_blocks = NUM_PROMPT_TOKENS // BLOCK_SIZE
    print(f"routing decision cost: {NUM_PROMPT_TOKENS}-token prompt ({num_blocks} blocks of "
          f"{BLOCK_SIZE}), {NUM_BACKENDS} backends, exact index match included; {num_rounds} "
          f"rounds of {num_calls} calls; Python {sys.version.split()[0]}")
    print("p50/p99: wall clock (perf_counter_ns) in the quietest round (lowest p99); "
          "p99 med: the median round's p99; cpu: process CPU per call; others: other "
          "processes' busy cores meanwhile")
    print(f"{'what':<26}{'p50 us':>9}{'p99 us':>9}{'p99 med':>9}{'cpu us':>9}{'others':>8}")
    setup = Setup.build()
    for label, name, max_ranked in cases:
        if label == gateway_case:
            rounds = [measure_gateway(setup, DEFAULT_PROFILE, num_calls)
                      for _ in range(num_rounds)]
        else:
            rounds = [measure(setup, name, num_calls, max_ranked) for _ in range(num_rounds)]
        best = quietest(rounds)
        p99_median = statistics.median(r.p99_us for r in rounds)
        cpu_us = statistics.median(r.cpu_us_per_call for r in rounds)
        others = statistics.median(r.others_cores_busy for r in rounds)
        if len(label) >= 26:
            print(label)
            label = ""
        print(f"{label:<26}{best.p50_us:>9.1f}{best.p99_us:>9.1f}{p99_median:>9.1f}"
              f"{cpu_us:>9.1f}{others:>8.2f}")
        if (label and name == DEFAULT_PROFILE
                and max_ranked in (None, GATEWAY_MAX_RANKED)):
            status = "PASS" if best.p99_us <= TARGET_P99_US else "FAIL"
            ranked = ("every scored candidate ranked" if max_ranked is None
                      else f"top {max_ranked}, as the gateway asks")
            print(f"  target p99 <= {TARGET_P99_US:g} us ({ranked}): {status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
