"""The five faults, each a coroutine over a `Run`: inject, wait for what it measures, finish
the load, return its figures (times in seconds, from the fault unless named otherwise).

- ``kill``: kill -9 one worker.
- ``stop``: SIGSTOP one worker for `STOP_S`, then SIGCONT.
- ``http_500``: the faulty engine (one of the listed backends) answers 500 until ejected,
  then answers correctly again until its breaker closes.
- ``redis_pause``: SIGSTOP Redis for `REDIS_PAUSE_S`, then SIGCONT; the tenant has
  ``max_concurrent`` `MAX_CONCURRENT`.
- ``redis_restart``: kill -9 Redis and start an empty one on the same port; the tenant and
  its key are made again at once (they went with the data).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import redis

from admission.quota.store import num_held, quota_keys
from bench.faults.fleet import TENANT_ID
from bench.faults.load import peak_in_flight
from bench.faults.run import WARMUP_S, Run, count_status
from bench.faults.watch import FleetSample, count_returns

STOP_S = 10.0
FLAP_WINDOW_S = 10.0
REDIS_PAUSE_S = 3.0
MAX_CONCURRENT = 48  # about twice the requests out at 20 req/s: phantom leases would show
AFTER_S = 3.0  # load kept on after recovery


def _unhealthy(url: str) -> Any:
    """Gone from /admin/fleet, or listed as not healthy."""
    return lambda s: not s.is_listed(url) or not s.backends[url]["is_healthy"]


def _out(url: str) -> Any:
    """Out of the routing set: gone, not healthy, or its breaker open (ejected)."""
    return lambda s: not s.is_routable(url)


def _gone(url: str) -> Any:
    return lambda s: not s.is_listed(url)


def _on(outcomes: list[Any], backend: str, t_s: float) -> list[Any]:
    return [o for o in outcomes if o.backend == backend and o.was_in_flight_at(t_s)]


async def kill_worker(run: Run) -> dict[str, Any]:
    victim = run.fleet.workers[0]
    await run.sleep_until(run.t0_s + WARMUP_S)
    victim.process.kill()
    t_kill = run.mark("kill")
    victim.process.wait(timeout=5)
    t_out = await run.watch.wait_for(_out(victim.url), after_s=t_kill, timeout_s=10)
    window_s = (t_out or t_kill, (t_out or t_kill) + FLAP_WINDOW_S)
    await run.sleep_until(window_s[1])
    outcomes = await run.finish()
    window = run.watch.between(*window_s)
    on_victim = _on(outcomes, victim.name, t_kill)
    t_unhealthy, t_gone = (run.watch.first(predicate(victim.url), after_s=t_kill)
                           for predicate in (_unhealthy, _gone))
    return {
        "victim": victim.name,
        "out_of_routing_s": run.since(t_out, t_kill),
        "unhealthy_or_gone_s": run.since(t_unhealthy, t_kill),
        "gone_s": run.since(t_gone, t_kill),
        "num_returns_in_10_s": count_returns(window, victim.url),
        "num_samples_healthy_in_10_s": sum(1 for s in window if s.is_routable(victim.url)),
        "num_in_flight_on_victim": len(on_victim),
        "num_streams_cut_on_victim": sum(o.kind.startswith("cut") for o in on_victim),
        "num_failed_after_kill": sum(o.kind == "failed" for o in outcomes if o.end_s > t_kill),
    }


async def stop_worker(run: Run) -> dict[str, Any]:
    victim = run.fleet.workers[0]
    await run.sleep_until(run.t0_s + WARMUP_S)
    os.kill(victim.pid, signal.SIGSTOP)
    t_stop = run.mark("sigstop")
    try:
        t_out = await run.watch.wait_for(_out(victim.url), after_s=t_stop, timeout_s=STOP_S)
        await run.sleep_until(t_stop + STOP_S)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    t_cont = run.mark("sigcont")
    t_back = await run.watch.wait_for(lambda s: s.is_routable(victim.url), after_s=t_cont,
                                      timeout_s=20)
    await run.sleep_until((t_back or t_cont) + AFTER_S)
    outcomes = await run.finish()
    in_flight = [o for o in outcomes if o.was_in_flight_at(t_stop)]
    sent_during = [o for o in outcomes if t_stop <= o.sent_s < t_cont]
    on_victim = _on(outcomes, victim.name, t_stop)
    t_unhealthy, t_gone = (run.watch.first(predicate(victim.url), after_s=t_stop)
                           for predicate in (_unhealthy, _gone))
    return {
        "victim": victim.name,
        "out_of_routing_s": run.since(t_out, t_stop),
        "unhealthy_or_gone_s": run.since(t_unhealthy, t_stop),
        "gone_s": run.since(t_gone if t_gone is not None and t_gone < t_cont else None, t_stop),
        "back_after_sigcont_s": run.since(t_back, t_cont),
        "num_in_flight_at_stop": len(in_flight),
        "num_in_flight_on_victim": len(on_victim),
        "worst_in_flight_latency_s": round(max((o.latency_s for o in in_flight), default=0), 3),
        "worst_latency_sent_during_stop_s": round(max((o.latency_s for o in sent_during),
                                                      default=0), 3),
        "num_served_by_victim_after_sigcont": sum(1 for o in outcomes if o.sent_s > t_cont
                                                  and o.backend == victim.name),
    }


async def http_500(run: Run) -> dict[str, Any]:
    fleet = run.fleet
    url = fleet.faulty_url
    assert url is not None
    await run.sleep_until(run.t0_s + WARMUP_S)
    num_warmup = await asyncio.to_thread(fleet.faulty_requests)
    t_fault = run.mark("fault_http_500")
    num_at_fault = await asyncio.to_thread(fleet.set_fault, "http_500")
    t_eject = await run.watch.wait_for(lambda s: s.breaker_state(url) == "open",
                                       after_s=t_fault, timeout_s=20)
    num_at_eject = await asyncio.to_thread(fleet.faulty_requests)
    ejected: FleetSample | None = next((s for s in run.watch.samples if s.t_s == t_eject), None)
    t_ok = run.mark("fault_ok")
    await asyncio.to_thread(fleet.set_fault, "ok")
    t_closed = await run.watch.wait_for(lambda s: s.breaker_state(url) == "closed",
                                        after_s=t_ok, timeout_s=40)
    await run.sleep_until((t_closed or t_ok) + AFTER_S)
    num_at_end = await asyncio.to_thread(fleet.faulty_requests)
    await run.finish()
    breaker = ejected.backends[url]["breaker"] if ejected else {}
    return {
        "faulty_requests_in_warmup": num_warmup,
        "faulty_requests_before_ejection": num_at_eject - num_at_fault,
        "ejected_after_s": run.since(t_eject, t_fault),
        "ejection_reason": breaker.get("reason"),
        "closed_after_ok_s": run.since(t_closed, t_ok),
        "faulty_requests_after_closed": num_at_end - num_at_eject,
        "num_ejections": max((s.backends[url]["breaker"]["num_ejections"]
                              for s in run.watch.samples if url in s.backends), default=0),
    }


async def redis_pause(run: Run) -> dict[str, Any]:
    assert run.counter is not None
    process = run.fleet.redis_process
    await run.sleep_until(run.t0_s + WARMUP_S)
    os.kill(process.pid, signal.SIGSTOP)
    t_stop = run.mark("redis_sigstop")
    try:
        await asyncio.sleep(REDIS_PAUSE_S)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    t_cont = run.mark("redis_sigcont")
    await asyncio.sleep(5.0)
    outcomes = await run.finish()
    await asyncio.sleep(1.0)  # deferred settles and cancels land
    t_last = run.counter.last_increase_after(t_cont)
    client = redis.Redis.from_url(run.fleet.redis_url)
    try:
        seconds, micros = client.time()
        num_leases = num_held(client.hgetall(quota_keys(TENANT_ID)[2]),
                              seconds * 1_000_000 + micros)
    finally:
        client.close()
    return {
        "max_concurrent": MAX_CONCURRENT,
        "peak_in_flight": peak_in_flight(outcomes),
        "num_429_before_pause": count_status([o for o in outcomes if o.sent_s < t_stop], 429),
        "num_429_after_resume": count_status(outcomes, 429, after_s=t_cont),
        "served_from_redis_after_s": round(t_last - t_cont, 3) if t_last else 0.0,
        "num_fail_open": run.counter.value_at(time.monotonic()) - run.counter.value_at(t_stop),
        "num_leases_left": int(num_leases),
        "worst_latency_sent_during_pause_s": round(max(
            (o.latency_s for o in outcomes if t_stop <= o.sent_s < t_cont), default=0), 3),
    }


async def redis_restart(run: Run) -> dict[str, Any]:
    fleet = run.fleet
    workers = fleet.workers
    await run.sleep_until(run.t0_s + WARMUP_S)
    t_kill, t_up = await asyncio.to_thread(fleet.restart_redis)
    run.mark("redis_killed", t_kill)
    run.mark("redis_answering", t_up)
    t_made = run.mark("key_made_again", await asyncio.to_thread(
        fleet.reprovision, run.gateway, run.api_key))
    if fleet.mode == "own":
        def known(s: FleetSample) -> bool:
            return all(s.heartbeat_after(w.url, t_up) for w in workers)
    else:
        def known(s: FleetSample) -> bool:
            return all(s.is_listed(w.url) and s.backends[w.url]["is_healthy"] for w in workers)
    t_known = await run.watch.wait_for(known, after_s=t_up, timeout_s=15)
    await run.sleep_until((t_known or t_up) + AFTER_S)
    outcomes = await run.finish()
    after = run.watch.between(t_kill, time.monotonic())
    return {
        "redis_down_s": round(t_up - t_kill, 3),
        "key_made_again_after_s": round(t_made - t_up, 3),
        "workers_known_after_s": run.since(t_known, t_up),
        "min_workers_listed": min((sum(s.is_listed(w.url) for w in workers) for s in after),
                                  default=None),
        "num_404_model_not_found": count_status(outcomes, 404, code="model_not_found"),
        "num_401": count_status(outcomes, 401),
    }


SCENARIOS = {"kill": kill_worker, "stop": stop_worker, "http_500": http_500,
             "redis_pause": redis_pause, "redis_restart": redis_restart}
