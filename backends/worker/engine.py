"""`LLMEngine`: the synchronous engine loop of the PyTorch worker.

It owns the model, the tokenizer, the paged KV cache, and the torch-free scheduler and block
manager it shares with the simulator (``backends.sim``). Each `step` schedules a batch
(continuous batching, chunked prefill, preemption by recompute), runs it (`ModelRunner`),
samples (`Sampler`), applies the stop checks (EOS, stop token ids, stop strings via
`IncrementalDetokenizer`; ``max_tokens`` in the scheduler) and returns one `RequestOutput` per
request that produced a token. Not thread-safe: `AsyncEngine` drives it from one thread.

Example::

    engine = LLMEngine.from_path(device="cpu", config=EngineConfig(num_kv_blocks=512))
    engine.add_request("r1", engine.tokenizer.encode("The capital of France is"),
                       SamplingParams(max_tokens=8))
    while engine.has_work:
        for output in engine.step():
            print(output.text_delta, end="")
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass

import torch

from backends.engine_core.block_manager import BlockManager, KvEvent
from backends.engine_core.scheduler import Scheduler
from backends.engine_core.sequence import Sequence
from backends.engine_core.types import EngineLoad
from backends.tokenizer import Tokenizer
from backends.worker.detokenizer import IncrementalDetokenizer
from backends.worker.kv_cache import KVCacheSpec, PagedKVCache, kv_dtype_name, plan_num_blocks
from backends.worker.loading import load_model_and_tokenizer
from backends.worker.model import LlamaModel
from backends.worker.runner import ModelRunner
from backends.worker.sampling import Sampler, SamplingParams

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine settings. KV capacity: ``num_kv_blocks``, else ``kv_cache_gib``, else
    ``kv_memory_fraction`` of free memory (see `plan_num_blocks`). ``kv_dtype`` None stores KV
    in the model's dtype. ``max_context_tokens`` None is the model's context length.

    Example::

        EngineConfig(model_name="SmolLM2-135M-Instruct", kv_dtype="int8", kv_cache_gib=1.0)
    """

    model_name: str = DEFAULT_MODEL_NAME
    block_size: int = 16
    kv_dtype: str | None = None
    num_kv_blocks: int | None = None
    kv_cache_gib: float | None = None
    kv_memory_fraction: float | None = None
    kv_watermark_blocks: int = 0
    max_batch: int = 64
    max_num_batched_tokens: int = 512
    max_context_tokens: int | None = None
    check_prefix_tokens: bool = True  # compare stored tokens on a prefix-cache hash hit
    seed: int | None = None  # of the generator unseeded requests share


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one step produced for one request (at most one token).

    ``text_delta`` may be empty (a partial character, or text held back in case it starts a
    stop string); ``finish_reason`` is "stop" (EOS, stop token or stop string: ``stop_reason``
    says which, None for EOS) or "length" on the request's last output.
    """

    request_id: str
    new_token_ids: tuple[int, ...]
    text_delta: str
    finish_reason: str | None
    stop_reason: str | int | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    is_first: bool


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole request's result, from `LLMEngine.generate`."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    stop_reason: str | int | None
    num_cached_tokens: int


@dataclass(slots=True)
class _Request:
    seq: Sequence
    params: SamplingParams
    generator: torch.Generator | None
    detokenizer: IncrementalDetokenizer
    stop_token_ids: frozenset[int]
    num_cached_tokens: int = 0
    stop_reason: str | int | None = None


class LLMEngine:
    """See the module docstring."""

    def __init__(self, model: LlamaModel, tokenizer: Tokenizer,
                 config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.device = model.device
        kv_dtype = kv_dtype_name(config.kv_dtype or model.dtype)
        self.kv_spec = KVCacheSpec.from_config(model.config, block_size=config.block_size,
                                               kv_dtype=kv_dtype)
        num_blocks = plan_num_blocks(
            self.kv_spec, self.device, num_blocks=config.num_kv_blocks,
            kv_cache_gib=config.kv_cache_gib, memory_fraction=config.kv_memory_fraction)
        self.kv_cache = PagedKVCache(self.kv_spec, num_blocks, device=self.device,
                                     compute_dtype=model.dtype)
        self.block_manager = BlockManager(num_blocks, config.block_size,
                                          config.kv_watermark_blocks,
                                          check_tokens=config.check_prefix_tokens)
        max_context = config.max_context_tokens or model.config.max_position_embeddings
        if max_context > model.config.max_position_embeddings:
            raise ValueError(f"max_context_tokens ({max_context}) exceeds the model's context "
                             f"length ({model.config.max_position_embeddings})")
        self.scheduler = Scheduler(self.block_manager, max_batch=config.max_batch,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_context_tokens=max_context)
        self.runner = ModelRunner(model, self.kv_cache)
        self.sampler = Sampler(self.device, config.seed)
        self.eos_token_ids = frozenset({tokenizer.eos_token_id, *model.config.eos_token_ids})
        self._requests: dict[str, _Request] = {}
        self._num_generate_calls = 0
        self.num_steps = 0
        self.num_prompt_tokens_total = 0
        self.num_generation_tokens_total = 0
        self.num_requests_finished: dict[str, int] = {}

    @classmethod
    def from_path(cls, path: str | os.PathLike[str] | None = None, *,
                  device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                  config: EngineConfig | None = None) -> LLMEngine:
        """Load a GGUF file or a Hugging Face directory (default: the bundled SmolLM2 GGUF)
        with its tokenizer, offline."""
        model, tokenizer = load_model_and_tokenizer(path, device=device, dtype=dtype)
        return cls(model, tokenizer, config)

    # -- requests -----------------------------------------------------------------------

    def make_sequence(self, request_id: str, prompt_token_ids: Iterable[int],
                      params: SamplingParams, *, cache_salt: str | None = None,
                      arrival_time_s: float | None = None) -> Sequence:
        """A validated sequence for the request, not yet queued: ValueError (with what to
        change) if this engine can never serve it. Safe to call from another thread."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        ids = tuple(prompt_token_ids)
        vocab_size = self.model.config.vocab_size
        bad = [t for t in ids if type(t) is not int or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab_size}); got "
                             f"{bad[:3]}")
        seq = Sequence(request_id, ids, params.max_tokens,
                       time.monotonic() if arrival_time_s is None else arrival_time_s,
                       model=self.config.model_name, block_size=self.config.block_size,
                       cache_salt=cache_salt)
        self.scheduler.check_servable(seq)
        return seq

    def embed(self, prompts: SequenceOf[SequenceOf[int]]) -> list[list[float]]:
        """One unit vector per prompt: the model's final (normed) hidden state at its last
        token, the pooling vLLM applies to a decoder served for embeddings (``--runner pooling
        --convert embed``), so the same model gives the same vectors from either engine. One
        forward pass per prompt with causal attention and no KV cache (nothing is cached or
        evicted); ValueError (with what to change) for a token id outside the vocabulary or a
        prompt longer than the model's context. Call it from the engine's thread."""
        vocab_size = self.model.config.vocab_size
        max_tokens = self.model.config.max_position_embeddings
        for index, ids in enumerate(prompts):
            if not ids:
                raise ValueError(f"input {index} has no tokens")
            if len(ids) > max_tokens:
                raise ValueError(f"input {index} has {len(ids)} tokens, more than the model's "
                                 f"context of {max_tokens}; shorten it")
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"token ids must be integers in [0, {vocab_size}); input "
                                 f"{index} has {bad[:3]}")
        device = self.model.device
        vectors = []
        with torch.inference_mode():
            for ids in prompts:
                input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)
                positions = torch.arange(len(ids), device=device)[None]
                pooled = self.model(input_ids, positions)[0, -1].float()
                vectors.append(torch.nn.functional.normalize(pooled, dim=0).tolist())
        return vectors

    def add_request(self, request_id: str, prompt_token_ids: Iterable[int],
                    params: SamplingParams, *, cache_salt: str | None = None) -> Sequence:
        """Queue a request; ValueError if it can never be served (see `make_sequence`)."""
        return self.add_sequence(
            self.make_sequence(request_id, prompt_token_ids, params, cache_salt=cache_salt),
            params)

    def add_sequence(self, seq: Sequence, params: SamplingParams) -> Sequence:
        """Queue a sequence from `make_sequence`."""
        self.scheduler.add(seq)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        self._requests[seq.seq_id] = _Request(
            seq, params, self.sampler.new_generator(params.seed),
            IncrementalDetokenizer(self.tokenizer, stop=params.stop,
                                   skip_special_tokens=params.skip_special_tokens),
            frozenset(stop_ids))
        self.num_prompt_tokens_total += seq.num_prompt_tokens
        return seq

    def abort(self, request_id: str) -> bool:
        """Drop a request and free its KV blocks; False if it is not here."""
        if self._requests.pop(request_id, None) is None:
            return False
        self.scheduler.abort(request_id)
        self._count_finished("abort")
        return True

    # -- steps --------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[RequestOutput]:
        """Run one batch; the outputs of the requests that produced a token in it."""
        plan = self.scheduler.schedule(time.monotonic())
        if plan.is_empty:
            return []  # only right after a preemption emptied the batch
        step = self.runner.run(plan, self.scheduler)
        requests = [self._requests[seq_id] for seq_id in step.seq_ids]
        token_ids = self.sampler.sample(step.logits, [r.params for r in requests],
                                        [r.generator for r in requests])
        finish_reasons = {}
        for request, token_id in zip(requests, token_ids, strict=True):
            if token_id in request.stop_token_ids:
                finish_reasons[request.seq.seq_id] = "stop"
                request.stop_reason = None if token_id in self.eos_token_ids else token_id
            elif request.detokenizer.add_token(token_id):
                finish_reasons[request.seq.seq_id] = "stop"
                request.stop_reason = request.detokenizer.stop_reason
        outcome = self.scheduler.complete_step(
            plan, time.monotonic(), dict(zip(step.seq_ids, token_ids, strict=True)),
            finish_reasons)
        self.num_steps += 1
        outputs = []
        for token in outcome.tokens:
            request = self._requests[token.seq_id]
            if token.is_first:
                request.num_cached_tokens = request.seq.num_cached_tokens
            is_finished = token.finish_reason is not None
            outputs.append(RequestOutput(
                request_id=token.seq_id,
                new_token_ids=() if token.token_id is None else (token.token_id,),
                text_delta=request.detokenizer.take_delta(is_finished),
                finish_reason=token.finish_reason,
                stop_reason=request.stop_reason if token.finish_reason == "stop" else None,
                num_prompt_tokens=request.seq.num_prompt_tokens,
                num_output_tokens=token.num_output_tokens,
                num_cached_tokens=request.num_cached_tokens,
                is_first=token.is_first,
            ))
            self.num_generation_tokens_total += 1
            if token.finish_reason is not None:
                del self._requests[token.seq_id]
                self._count_finished(token.finish_reason)
        return outputs

    def generate(self, prompts: SequenceOf[SequenceOf[int]],
                 params: SamplingParams | SequenceOf[SamplingParams]) -> list[Completion]:
        """Run ``prompts`` together to completion (offline use, tests, benchmarks); the engine
        must be idle. One `SamplingParams` for all, or one per prompt."""
        if self.has_work:
            raise RuntimeError("generate() needs an idle engine; step() the queued requests")
        all_params = [params] * len(prompts) if isinstance(params, SamplingParams) \
            else list(params)
        if len(all_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(all_params)} SamplingParams")
        self._num_generate_calls += 1
        ids = [f"generate-{self._num_generate_calls}-{i}" for i in range(len(prompts))]
        for request_id, prompt, request_params in zip(ids, prompts, all_params, strict=True):
            self.add_request(request_id, prompt, request_params)
        outputs: dict[str, list[RequestOutput]] = {request_id: [] for request_id in ids}
        while self.has_work:
            for output in self.step():
                outputs[output.request_id].append(output)
        completions = []
        for request_id in ids:
            steps = outputs[request_id]
            completions.append(Completion(
                token_ids=tuple(t for o in steps for t in o.new_token_ids),
                text="".join(o.text_delta for o in steps),
                finish_reason=steps[-1].finish_reason or "abort",
                stop_reason=steps[-1].stop_reason,
                num_cached_tokens=steps[-1].num_cached_tokens))
        return completions

    def _count_finished(self, reason: str) -> None:
        self.num_requests_finished[reason] = self.num_requests_finished.get(reason, 0) + 1

    # -- load, metrics, KV events -------------------------------------------------------

    def profile(self) -> dict[str, str | int | float]:
        """The heartbeat's resource profile (the keys `backends.fleet.sync` reads, as the
        simulator's `WorkerProfile.to_json` writes them, plus the KV cache's make-up)."""
        device = self.device
        if device.type == "cuda":
            device_name = f"{device} ({torch.cuda.get_device_name(device)})"
        else:
            device_name = str(device)
        return {
            "model": self.config.model_name,
            "device": device_name,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "kv_dtype": self.kv_spec.kv_dtype,
            "num_kv_blocks": self.block_manager.num_blocks,
            "block_size": self.config.block_size,
            "kv_capacity_tokens": self.block_manager.num_blocks * self.config.block_size,
            "kv_bytes_per_token": self.kv_spec.bytes_per_token,
            "kv_cache_bytes": self.kv_cache.num_bytes,
            "max_batch": self.scheduler.max_batch,
            "max_num_batched_tokens": self.scheduler.max_num_batched_tokens,
            "max_context_tokens": self.scheduler.max_context_tokens,
        }

    def load(self) -> EngineLoad:
        """The figures for heartbeats and /metrics (the simulator's `EngineLoad`)."""
        manager = self.block_manager
        return EngineLoad(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_usage=manager.usage,
            num_free_kv_blocks=manager.num_free_blocks,
            num_cached_kv_blocks=manager.num_cached_blocks,
            num_prefix_kv_blocks=manager.num_prefix_blocks,
            num_queued_prefill_tokens=self.scheduler.num_queued_prefill_tokens,
            prefix_cache_queries_tokens=manager.prefix_cache_queries_tokens,
            prefix_cache_hits_tokens=manager.prefix_cache_hits_tokens,
            num_preemptions=self.scheduler.num_preemptions,
        )

    def drain_kv_events(self) -> list[KvEvent]:
        return self.block_manager.drain_events()

    def resident_hashes(self) -> list[int]:
        return self.block_manager.resident_hashes()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix (one "cleared" event); False while requests hold KV."""
        return self.block_manager.reset_prefix_cache()
