"""The model side of the simulator accuracy benchmark: the workload, a virtual-time replay, errors.

Pure: no I/O, no clock. The load driver (`bench.sim_accuracy.client`) and the replay both draw
each request from :func:`request_shape`, so the replay feeds a fresh ``SimEngineCore`` exactly the
prompts the live simulator saw, at the times the client sent them::

    observed = [ObservedRequest(worker=0, index=0, num_prompt_tokens=300, max_tokens=80,
                                send_s=0.0, first_token_s=0.05, finish_s=1.2,
                                num_output_tokens=80)]
    modelled = replay_worker(WorkerProfile(model="switchyard-sim"), observed, seed=1)
    e2e = relative_errors([o.e2e_s for o in observed], [m.e2e_s for m in modelled])
    summarize(e2e).median_abs
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from backends.sim.core import SimEngineCore
from backends.sim.profile import WorkerProfile
from backends.tokenizer.approx import SMOLLM2_VOCAB_SIZE
from bench.common.stats import percentile

MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS = 256, 1024
MIN_MAX_TOKENS, MAX_MAX_TOKENS = 64, 128


def request_shape(seed: int, worker: int, index: int) -> tuple[list[int], int]:
    """Prompt token ids and ``max_tokens`` of request ``index`` to ``worker``: seeded, distinct.

    Random ids make every prompt's first block unique, so no request hits the prefix cache.
    """
    rng = random.Random(f"sim-accuracy:{seed}:{worker}:{index}")
    num_prompt_tokens = rng.randint(MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS)
    max_tokens = rng.randint(MIN_MAX_TOKENS, MAX_MAX_TOKENS)
    # Ids in the model's vocabulary (the engine refuses others, as vLLM does).
    prompt_ids = [token % SMOLLM2_VOCAB_SIZE
                  for token in array("H", rng.randbytes(2 * num_prompt_tokens))]
    return prompt_ids, max_tokens


@dataclass(frozen=True, slots=True)
class ObservedRequest:
    """One streamed request as the client saw it; times on the client's monotonic clock."""

    worker: int
    index: int
    num_prompt_tokens: int
    max_tokens: int
    send_s: float
    first_token_s: float
    finish_s: float
    num_output_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.send_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.send_s


@dataclass(frozen=True, slots=True)
class ModelledRequest:
    send_s: float
    first_token_s: float
    finish_s: float
    num_output_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.send_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.send_s


def replay_worker(
    profile: WorkerProfile, requests: Sequence[ObservedRequest], seed: int
) -> list[ModelledRequest]:
    """What the latency model says each request of one worker should have taken.

    Requests join the core in send order at their send times, and are scheduled at the first
    step that starts at or after that time, as in ``SimWorker.run``: steps run back to back
    while there is work, and an idle core starts its next step when a request arrives.
    Returned in the order of ``requests``.
    """
    core = SimEngineCore(profile)
    order = sorted(range(len(requests)), key=lambda i: requests[i].send_s)
    first_token_s: dict[str, float] = {}
    finish_s: dict[str, float] = {}
    num_output_tokens: dict[str, int] = {}
    now_s = requests[order[0]].send_s if order else 0.0
    next_pos = 0
    while next_pos < len(order) or core.has_work:
        if not core.has_work:
            now_s = max(now_s, requests[order[next_pos]].send_s)
        while next_pos < len(order) and requests[order[next_pos]].send_s <= now_s:
            request = requests[order[next_pos]]
            prompt_ids, max_tokens = request_shape(seed, request.worker, request.index)
            core.add_request(str(order[next_pos]), prompt_ids, max_tokens, request.send_s)
            next_pos += 1
        _, step_s = core.step(now_s)
        now_s += step_s
        for token in core.finish_step(now_s).tokens:
            if token.is_first:
                first_token_s[token.seq_id] = now_s
            if token.finish_reason is not None:
                finish_s[token.seq_id] = now_s
                num_output_tokens[token.seq_id] = token.num_output_tokens
    return [
        ModelledRequest(request.send_s, first_token_s[str(i)], finish_s[str(i)],
                        num_output_tokens[str(i)])
        for i, request in enumerate(requests)
    ]


def relative_errors(observed_s: Sequence[float], modelled_s: Sequence[float]) -> list[float]:
    """(observed - modelled) / modelled per request: positive means the simulator was slow."""
    return [(obs - mod) / mod for obs, mod in zip(observed_s, modelled_s, strict=True)]


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """Relative errors of one latency over many requests (fractions, not percent)."""

    num_requests: int
    median_abs: float
    p90_abs: float
    p99_abs: float
    max_abs: float
    bias: float  # mean signed error: > 0 when observed latencies run long

    def to_json(self) -> dict[str, float]:
        return {"num_requests": self.num_requests, "median_abs": self.median_abs,
                "p90_abs": self.p90_abs, "p99_abs": self.p99_abs, "max_abs": self.max_abs,
                "bias": self.bias}


def summarize(errors: Sequence[float]) -> ErrorSummary:
    magnitudes = [abs(error) for error in errors]
    return ErrorSummary(
        num_requests=len(errors),
        median_abs=percentile(magnitudes, 0.5),
        p90_abs=percentile(magnitudes, 0.9),
        p99_abs=percentile(magnitudes, 0.99),
        max_abs=max(magnitudes, default=math.nan),
        bias=sum(errors) / len(errors) if errors else math.nan,
    )
