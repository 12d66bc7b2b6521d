"""What an engine reports about itself: its load (heartbeats, ``/metrics``) and where one
request spent its time (phases). Shared by the simulated engine and the PyTorch worker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """A worker's load, for heartbeats and ``/metrics`` (vLLM names in the comments)."""

    num_running: int  # vllm:num_requests_running
    num_waiting: int  # vllm:num_requests_waiting
    kv_usage: float  # vllm:kv_cache_usage_perc, a fraction in [0, 1]
    num_free_kv_blocks: int
    num_cached_kv_blocks: int
    num_prefix_kv_blocks: int  # cached blocks a later request hit (BlockManager.num_prefix_blocks)
    num_queued_prefill_tokens: int
    prefix_cache_queries_tokens: int  # vllm:prefix_cache_queries_total
    prefix_cache_hits_tokens: int  # vllm:prefix_cache_hits_total
    num_preemptions: int  # vllm:num_preemptions_total


@dataclass(frozen=True, slots=True)
class EnginePhases:
    """Where a request spent its time in the engine, in the worker loop's clock (seconds):
    queued from ``arrival_s`` to ``scheduled_s``, prefilling until ``first_token_s``, decoding
    until ``finish_s``. A phase that never began (the client left) is None."""

    arrival_s: float
    scheduled_s: float | None
    first_token_s: float | None
    finish_s: float | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    num_preemptions: int

    @property
    def num_decode_steps(self) -> int:
        return max(0, self.num_output_tokens - 1)  # the first token comes from prefill
