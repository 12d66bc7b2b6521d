"""Engine invariants on the tiny random Llama: greedy output equals the reference decode loop
however the engine batches, chunks, caches or preempts, and every block comes back."""

from __future__ import annotations

import pytest
import torch

from backends.engine_core.block_manager import KvEvent
from backends.worker.engine import LLMEngine, RequestOutput
from backends.worker.greedy import greedy
from backends.worker.model import LlamaModel
from backends.worker.sampling import SamplingParams
from routing.prefix import token_block_hashes
from tests.backends.worker.checkpoints import tiny_model
from tests.backends.worker.engine_support import make_engine, prompt

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return tiny_model()


def _reference(model: LlamaModel, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    return [greedy(model, p, num_tokens) for p in prompts]


def _run_to_end(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    outputs: dict[str, list[RequestOutput]] = {}
    while engine.has_work:
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    return outputs


def _assert_all_blocks_free(engine: LLMEngine) -> None:
    manager = engine.block_manager
    assert (manager.num_used_blocks, manager.num_free_blocks) == (0, manager.num_blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_continuous_batching_matches_the_reference_and_frees_every_block(
        model: LlamaModel) -> None:
    engine = make_engine(model, num_kv_blocks=40, max_batch=4, max_num_batched_tokens=12)
    prompts = [prompt(seed, 3 + 5 * (seed % 4)) for seed in range(10)]
    max_tokens = [4 + seed % 7 for seed in range(10)]
    outputs: dict[str, list[RequestOutput]] = {}
    pending = list(range(10))
    while pending or engine.has_work:
        for _ in range(2):  # requests arrive between steps
            if pending:
                seed = pending.pop(0)
                engine.add_request(f"r{seed}", prompts[seed],
                                   SamplingParams(max_tokens=max_tokens[seed], ignore_eos=True))
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    for seed in range(10):
        steps = outputs[f"r{seed}"]
        tokens = [t for o in steps for t in o.new_token_ids]
        assert tokens == greedy(model, prompts[seed], max_tokens[seed])
        assert [o.finish_reason for o in steps] == [None] * (len(steps) - 1) + ["length"]
        assert [o.num_output_tokens for o in steps] == list(range(1, len(steps) + 1))
        assert steps[0].is_first and not any(o.is_first for o in steps[1:])
    _assert_all_blocks_free(engine)
    assert engine.num_requests_finished == {"length": 10}


def test_prefix_hit_reuses_blocks_and_keeps_the_output(model: LlamaModel) -> None:
    engine = make_engine(model)
    shared = prompt(1, 13)
    first, second = [*shared, 7, 8], [*shared, 50, 51, 52]
    first_seq = engine.add_request("first", first, GREEDY)
    engine.step()
    first_blocks = list(first_seq.block_table)
    _run_to_end(engine)
    second_seq = engine.add_request("second", second, GREEDY)
    outputs = engine.step()
    assert second_seq.num_cached_tokens == 12  # 3 full blocks of the shared 13 tokens
    assert second_seq.block_table[:3] == first_blocks[:3]
    outputs += _run_to_end(engine)["second"]
    assert outputs[0].num_cached_tokens == 12
    assert [t for o in outputs for t in o.new_token_ids] == greedy(model, second, 10)
    assert engine.load().prefix_cache_hits_tokens == 12
    _assert_all_blocks_free(engine)


def test_next_turn_reuses_the_previous_answer(model: LlamaModel) -> None:
    engine = make_engine(model)
    turn_1 = prompt(2, 6)
    (answer,) = engine.generate([turn_1], GREEDY)
    turn_2 = [*turn_1, *answer.token_ids, 9, 10, 11]
    (reply,) = engine.generate([turn_2], GREEDY)
    # 16 tokens = 6 prompt + 10 answer; the answer's last token was never computed, so 3
    # full blocks (12 tokens) come back, two of them mostly answer.
    assert reply.num_cached_tokens == 12
    assert list(reply.token_ids) == greedy(model, turn_2, 10)


def test_preempted_and_resumed_sequences_match_the_uninterrupted_ones(
        model: LlamaModel) -> None:
    prompts = [prompt(seed, 9) for seed in range(3)]
    params = SamplingParams(max_tokens=14, ignore_eos=True)
    roomy = make_engine(model, num_kv_blocks=64).generate(prompts, params)
    tight = make_engine(model, num_kv_blocks=14)  # 3 x 6 blocks at the end: someone waits
    cramped = tight.generate(prompts, params)
    assert tight.load().num_preemptions > 0
    assert [c.token_ids for c in cramped] == [c.token_ids for c in roomy]
    assert [list(c.token_ids) for c in roomy] == _reference(model, prompts, 14)
    _assert_all_blocks_free(tight)


def test_chunked_prefill_equals_one_shot(model: LlamaModel) -> None:
    prompts = [prompt(seed, 17 + seed) for seed in range(3)]
    one_shot = make_engine(model, max_num_batched_tokens=128)
    chunked = make_engine(model, max_num_batched_tokens=3)
    expected = one_shot.generate(prompts, GREEDY)
    assert chunked.generate(prompts, GREEDY) == expected
    assert chunked.num_steps > one_shot.num_steps + 10


def test_int8_kv_runs_and_stays_close(model: LlamaModel) -> None:
    prompts = [prompt(seed, 6 + 3 * seed) for seed in range(4)]
    exact = make_engine(model).generate(prompts, GREEDY)
    engine = make_engine(model, kv_dtype="int8")
    quantized = engine.generate(prompts, GREEDY)
    same = sum(a == b for e, q in zip(exact, quantized, strict=True)
               for a, b in zip(e.token_ids, q.token_ids, strict=True))
    assert same >= 0.8 * 10 * len(prompts)
    assert engine.kv_cache.keys.dtype == torch.int8
    _assert_all_blocks_free(engine)


def test_abort_frees_blocks_and_stops_outputs(model: LlamaModel) -> None:
    engine = make_engine(model, max_batch=1)
    engine.add_request("running", prompt(0, 10), GREEDY)
    engine.add_request("waiting", prompt(1, 10), GREEDY)
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    assert engine.abort("running") and engine.abort("waiting")
    assert not engine.abort("running")
    assert not engine.has_work and engine.step() == []
    _assert_all_blocks_free(engine)
    assert engine.num_requests_finished == {"abort": 2}


def test_kv_events_carry_the_gateways_prefix_hashes(model: LlamaModel) -> None:
    engine = make_engine(model, model_name="tiny-model")
    ids = prompt(3, 9)
    engine.generate([ids], SamplingParams(max_tokens=1))
    assert engine.drain_kv_events() == [
        KvEvent("stored", tuple(token_block_hashes(ids, 4, "tiny-model")), None)]
    assert engine.reset_prefix_cache()
    assert engine.drain_kv_events() == [KvEvent("cleared", ())]


def test_load_reports_the_queue(model: LlamaModel) -> None:
    engine = make_engine(model, max_batch=2, max_num_batched_tokens=8)
    for seed in range(4):
        engine.add_request(f"r{seed}", prompt(seed, 6), GREEDY)
    engine.step()
    load = engine.load()
    assert (load.num_running, load.num_waiting) == (2, 2)
    assert load.num_queued_prefill_tokens == 4 * 6 - 8
    assert 0 < load.kv_usage < 1


def test_profile_for_the_heartbeat(model: LlamaModel) -> None:
    engine = make_engine(model, kv_dtype="float16", num_kv_blocks=10)
    profile = engine.profile()
    assert {key: profile[key] for key in ("model", "device", "kv_dtype", "num_kv_blocks",
                                          "block_size", "kv_capacity_tokens")} == {
        "model": "tiny", "device": "cpu", "kv_dtype": "float16", "num_kv_blocks": 10,
        "block_size": 4, "kv_capacity_tokens": 40}
    assert profile["kv_cache_bytes"] == 10 * 4 * profile["kv_bytes_per_token"]
