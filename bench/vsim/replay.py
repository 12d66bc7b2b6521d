"""A live routing run's requests as a vsim workload, to replay them in virtual time.

``bench.routing.live`` writes each request's record (``records.json``: index, send time,
status, TTFT, cached tokens, worker). Its requests are ``bench.run`` 's shared-prefix specs
for the run's seed and options, in index order. ``replay_requests`` regenerates those specs,
renders and tokenizes each prompt as the live sim worker does (``--tokenizer approx``) and
keeps the prompt text the gateway hashes; ``LiveReplay`` serves them in send order, and
``arrivals_s`` gives ``Simulation`` the live send times. So both sides see the same prompts,
output lengths and arrival times, and differ only in what they model.

Example::

    requests, arrivals_s = replay_requests(records, WorkloadOptions(num_groups=24), seed=1)
    simulate(SimConfig(num_requests=len(requests), ...), LiveReplay(requests), arrivals_s)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any

from backends.tokenizer import get_tokenizer
from bench.run.spec import TenantSpec
from bench.run.workloads import WORKLOADS, WorkloadOptions
from bench.vsim.workloads import VRequest
from gateway.router import prompt_text  # the text the gateway's approximate index hashes


class LiveReplay:
    """A fixed list of requests, served in order (the ``Workload`` protocol)."""

    name = "replay"

    def __init__(self, requests: Sequence[VRequest]) -> None:
        self._requests = list(requests)
        self.working_set_tokens = 0  # not used: the KV size comes from the live run
        self.max_request_tokens = max((len(r.prompt_ids) + r.max_tokens for r in requests),
                                      default=0)

    def next_request(self, index: int) -> VRequest:
        return self._requests[index]

    def finished(self, request: VRequest) -> None:
        pass


def replay_requests(records: Sequence[Mapping[str, Any]], options: WorkloadOptions, seed: int
                    ) -> tuple[list[VRequest], list[float]]:
    """The live run's requests in send order (index = position) and their send times.

    Raises ValueError when a regenerated prompt's length differs from the token count the
    live worker reported: then the specs are not the ones the live run sent.
    """
    if options.num_groups is None:
        raise ValueError("the replay needs the live run's number of groups")
    ordered = sorted(records, key=lambda r: (r["sent_at_s"], r["index"]))
    last = max((r["index"] for r in ordered), default=-1)
    # Only the tenant of a spec depends on the tenants; names as routing_live's make_tenants.
    tenants = [TenantSpec(f"bench-standard-{i}", "standard") for i in range(options.num_groups)]
    specs = list(islice(WORKLOADS["shared-prefix"](options, tenants, seed), last + 1))
    tokenizer = get_tokenizer("approx")
    requests: list[VRequest] = []
    for position, record in enumerate(ordered):
        spec = specs[record["index"]]
        ids = tuple(tokenizer.encode_chat(list(spec.messages)))
        reported = record.get("num_prompt_tokens")
        if reported is not None and reported != len(ids):
            raise ValueError(f"request {record['index']}: {len(ids)} prompt tokens here, "
                             f"{reported} in the live run")
        requests.append(VRequest(position, ids, spec.max_tokens, spec.group or 0,
                                 text=prompt_text({"messages": list(spec.messages)})))
    return requests, [float(r["sent_at_s"]) for r in ordered]
