"""How soon a restarted replica routes warmed prefixes where the others do.

Right after a workload run (the workers' caches and the shared indexes warm), one probe per
prefix group (its system prompt, a one-token answer) goes to replica 0: the backend it picks
is the group's reference. The same probes to another replica that keeps running give the
baseline. Then the last replica is stopped (SIGTERM) and started again on the same port; once
it answers ``/readyz``, rounds of probes at set offsets each ask it about groups not asked
before (a probe is itself a routing decision the replica remembers, so only a group's first
probe says what the replica knew). Per round: the **agreement** (the share of its groups
routed to the reference backend) and the **hit share** (the share routed to a backend that
held the system prompt: over half the prompt tokens came back as ``cached_tokens``). A group
cached on two backends may go to either, so agreement can be below 1 for a replica that knows
everything; the hit share cannot. The replica has converged from the first round after which
every round's hit share is at least the running replica's. Example::

    figures = measure_convergence(fleet, key, prompts, offsets_s=(0.0, 0.5, 1.0, 2.0))
    figures["restart_to_ready_s"], figures["converged_after_ready_s"]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bench.replicas.figures import agreement, converged_after_s, hit_share
from bench.replicas.fleet import ReplicaFleet
from bench.run.client import BACKEND_HEADER
from gateway.cli.localproc import wait_http

OFFSETS_S = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
SETTLE_S = 1.0  # after the last request, for the replicas' last decisions to reach Redis


@dataclass(frozen=True, slots=True)
class Probe:
    backend: str  # where the replica routed it
    is_hit: bool  # the backend held the system prompt: over half the prompt came from cache


def probe(client: httpx.Client, origin: str, key: str, model: str, system_prompt: str
          ) -> Probe:
    """Where ``origin`` routes a request with ``system_prompt``, and whether it hit there."""
    response = client.post(origin + "/v1/chat/completions",
                           headers={"Authorization": f"Bearer {key}"},
                           json={"model": model, "max_tokens": 1, "stream": False,
                                 "messages": [{"role": "system", "content": system_prompt},
                                              {"role": "user", "content": "Which backend?"}]})
    if response.status_code != 200:
        raise RuntimeError(f"probe to {origin} failed: {response.status_code} "
                           f"{response.text[:200]}")
    usage = response.json().get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Probe(str(response.headers.get(BACKEND_HEADER, "unknown")),
                 cached > 0.5 * (usage.get("prompt_tokens") or 0))


def split_rounds(groups: Sequence[int], num_rounds: int) -> list[list[int]]:
    """``groups`` dealt into ``num_rounds`` rounds, as evenly as they go."""
    return [list(groups[i::num_rounds]) for i in range(num_rounds)]


def measure_convergence(fleet: ReplicaFleet, key: str, prompts: Sequence[str],
                        offsets_s: Sequence[float] = OFFSETS_S) -> dict[str, Any]:
    """Restart the last replica and probe it; see the module docstring."""
    if len(fleet.replicas) < 2:
        raise ValueError("convergence needs at least 2 replicas")
    model = fleet.front.model
    restarted = len(fleet.replicas) - 1
    witness = 1 if len(fleet.replicas) > 2 else 0
    groups = list(range(len(prompts)))
    time.sleep(SETTLE_S)
    with httpx.Client(timeout=30) as client:
        def ask(index: int, group: int) -> Probe:
            return probe(client, fleet.replicas[index].url, key, model, prompts[group])

        reference = {g: ask(0, g).backend for g in groups}
        witnessed = {g: ask(witness, g) for g in groups}
        baseline = {"agreement": agreement(reference, {g: p.backend
                                                         for g, p in witnessed.items()}),
                    "hit_share": hit_share(witnessed.values())}
        times = fleet.restart_replica(restarted)
        wait_http(fleet.replicas[restarted].url + "/readyz", timeout_s=60,
                  group=fleet.local.group, poll_s=0.01)
        ready_s = time.monotonic()
        rounds = []
        for offset_s, members in zip(offsets_s, split_rounds(groups, len(offsets_s)),
                                     strict=True):
            time.sleep(max(0.0, ready_s + offset_s - time.monotonic()))
            sent_after_s = time.monotonic() - ready_s
            probes = {g: ask(restarted, g) for g in members}
            rounds.append({"offset_s": offset_s, "sent_after_ready_s": sent_after_s,
                           "groups": members,
                           "picks": {str(g): p.backend for g, p in probes.items()},
                           "agreement": agreement(reference, {g: p.backend
                                                              for g, p in probes.items()}),
                           "hit_share": hit_share(probes.values())})
    converged = converged_after_s(rounds, baseline["hit_share"])
    return {"restarted_replica": restarted, "witness_replica": witness,
            "reference": {str(g): b for g, b in reference.items()},
            "baseline": baseline, "rounds": rounds,
            "stop_to_exit_s": times["exited_s"] - times["stopped_s"],
            "restart_to_ready_s": ready_s - times["started_s"],
            "converged_after_ready_s": converged,
            "restart_to_converged_s": (ready_s - times["started_s"] + converged
                                       if converged is not None else None)}
