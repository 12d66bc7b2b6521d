"""The engine on the real SmolLM2-135M-Instruct (CPU, float32): batched, chunked and
prefix-cached greedy output equals the reference decode loop (itself checked against a plain
float64 reference in test_real_model.py); the int8 KV cache stays close. Single-threaded."""

from __future__ import annotations

import pytest
import torch

from backends.worker.engine import EngineConfig, LLMEngine
from backends.worker.greedy import greedy
from backends.worker.kv_cache import KVCacheSpec, PagedKVCache
from backends.worker.paged_attention import PagedKVView, StepBatch, StepRow
from backends.worker.sampling import SamplingParams

NUM_TOKENS = 16
SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in a few words."}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine.from_path(device="cpu", config=EngineConfig(
        num_kv_blocks=128, block_size=16, max_num_batched_tokens=32))


def _prompts(engine: LLMEngine) -> list[list[int]]:
    tokenizer = engine.tokenizer
    return [tokenizer.encode("The capital of France is"),
            tokenizer.encode("def fibonacci(n):"),
            tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "Name a primary colour."}])]


def test_batched_chunked_greedy_matches_the_reference(engine: LLMEngine) -> None:
    prompts = _prompts(engine)
    completions = engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS))
    for prompt_ids, completion in zip(prompts, completions, strict=True):
        expected = greedy(engine.model, prompt_ids, NUM_TOKENS, stop_ids=engine.eos_token_ids)
        assert list(completion.token_ids) == expected
        assert completion.text == engine.tokenizer.decode(expected, skip_special_tokens=True)
    assert completions[0].text.startswith(" Paris")
    assert engine.block_manager.num_used_blocks == 0


def test_shared_system_prompt_is_served_from_the_cache(engine: LLMEngine) -> None:
    tokenizer = engine.tokenizer
    first = tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "Capital of Italy?"}])
    second = tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "Capital of Spain?"}])
    engine.generate([first], SamplingParams(max_tokens=2))
    (completion,) = engine.generate([second], SamplingParams(max_tokens=8))
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert completion.num_cached_tokens == shared // 16 * 16 > 0
    assert list(completion.token_ids) == greedy(engine.model, second, 8,
                                                stop_ids=engine.eos_token_ids)


def test_stop_string_on_real_text(engine: LLMEngine) -> None:
    ids = engine.tokenizer.encode("The capital of France is")
    (completion,) = engine.generate([ids], SamplingParams(max_tokens=NUM_TOKENS, stop=("\n",)))
    assert (completion.text, completion.finish_reason, completion.stop_reason) == (
        " Paris.", "stop", "\n")


@torch.inference_mode()
def _teacher_forced_logits(engine: LLMEngine, ids: list[int], kv_dtype: str) -> torch.Tensor:
    spec = KVCacheSpec.from_config(engine.model.config, block_size=16, kv_dtype=kv_dtype)
    cache = PagedKVCache(spec, 16, device="cpu", compute_dtype=torch.float32)
    table, logits = list(range(16)), []
    for start in range(0, len(ids), 24):  # in chunks, so int8 blocks fill over several steps
        batch = StepBatch.build([], [StepRow(ids[start:start + 24], start, table)],
                                block_size=16, device=torch.device("cpu"))
        hidden = engine.model(batch.input_ids, batch.positions, PagedKVView(cache, batch))
        logits.append(engine.model.compute_logits(hidden[0]))
    return torch.cat(logits)


def test_int8_kv_stays_close_to_float32(engine: LLMEngine) -> None:
    """Teacher-forced over each prompt and its greedy continuation: top-1 agreement and mean
    absolute logit error. Measured: 100% and 0.20 here (bfloat16 KV: ~0.015); on 512 tokens of
    DESIGN.md, 98% and +0.1% perplexity."""
    exact, quantized = [], []
    for prompt_ids in _prompts(engine):
        ids = prompt_ids + greedy(engine.model, prompt_ids, NUM_TOKENS)
        exact.append(_teacher_forced_logits(engine, ids, "float32"))
        quantized.append(_teacher_forced_logits(engine, ids, "int8"))
    want, got = torch.cat(exact), torch.cat(quantized)
    assert (want.argmax(-1) == got.argmax(-1)).float().mean() >= 0.95
    assert (want - got).abs().mean() <= 0.3
