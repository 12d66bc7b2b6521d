"""The asyncio shell: concurrent streams, aborts, errors, load and KV events, on the tiny model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backends.worker.async_engine import AsyncEngine
from backends.worker.greedy import greedy
from backends.worker.sampling import SamplingParams
from tests.backends.worker.checkpoints import tiny_model
from tests.backends.worker.engine_support import make_engine, prompt

PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)


class RecordingPublisher:
    """Collects what `KvPublisher.record` would send to Redis."""

    def __init__(self) -> None:
        self.events: list[tuple[str, list[int]]] = []

    def record(self, event: str, hashes: list[int]) -> None:
        self.events.append((event, hashes))


@pytest.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    async_engine = AsyncEngine(make_engine(tiny_model(), max_batch=3, max_num_batched_tokens=8),
                               worker_id="test-worker")
    task = asyncio.create_task(async_engine.run())
    yield async_engine
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_concurrent_requests_stream_the_reference_tokens(engine: AsyncEngine) -> None:
    prompts = [prompt(seed, 4 + 3 * seed) for seed in range(6)]
    handles = [engine.submit(f"r{seed}", prompts[seed], PARAMS) for seed in range(6)]
    results = await asyncio.gather(*(handle.wait_finished() for handle in handles))
    model = engine.engine.model
    for seed, (token_ids, text) in enumerate(results):
        assert token_ids == greedy(model, prompts[seed], 8)
        assert text == engine.engine.tokenizer.decode(token_ids, skip_special_tokens=True)
        handle = handles[seed]
        assert (handle.finish_reason, handle.num_output_tokens) == ("length", 8)
        phases = handle.phases()
        assert phases.first_token_s is not None and phases.finish_s is not None
        assert phases.arrival_s <= phases.first_token_s <= phases.finish_s
    await asyncio.sleep(0.01)
    assert engine.load()["num_running"] == 0
    assert engine.engine.block_manager.num_used_blocks == 0
    assert engine.num_generation_tokens_total == 48
    assert engine.num_requests_finished == {"length": 6}


async def test_outputs_stream_one_token_at_a_time(engine: AsyncEngine) -> None:
    outputs = [o async for o in engine.generate("s", prompt(1, 5), PARAMS)]
    assert [o.num_output_tokens for o in outputs] == list(range(1, 9))
    assert outputs[-1].finish_reason == "length"
    assert outputs[0].num_prompt_tokens == 5


async def test_abort_mid_stream_frees_the_kv(engine: AsyncEngine) -> None:
    handle = engine.submit("long", prompt(2, 6), SamplingParams(max_tokens=100,
                                                                 ignore_eos=True))
    await handle.next_outputs()
    engine.abort("long")
    engine.abort("long")  # a second abort is a no-op
    for _ in range(100):
        await asyncio.sleep(0.005)
        if not engine.engine.has_work:
            break
    assert engine.engine.block_manager.num_used_blocks == 0
    assert engine.num_requests_finished.get("abort") == 1


async def test_consumer_leaving_early_aborts(engine: AsyncEngine) -> None:
    stream = engine.generate("early", prompt(3, 6), SamplingParams(max_tokens=100,
                                                                   ignore_eos=True))
    async for _ in stream:
        break
    await stream.aclose()
    for _ in range(100):
        await asyncio.sleep(0.005)
        if not engine.engine.has_work:
            break
    assert not engine.engine.has_work


async def test_submit_rejects_at_once(engine: AsyncEngine) -> None:
    with pytest.raises(ValueError, match="exceeds this worker's max_context_tokens"):
        engine.submit("big", prompt(0, 100), SamplingParams(max_tokens=100))
    engine.submit("dup", prompt(0, 4), PARAMS)
    with pytest.raises(ValueError, match="'dup' is already queued or running"):
        engine.submit("dup", prompt(0, 4), PARAMS)


async def test_a_failing_step_fails_its_requests_and_the_engine_carries_on(
        engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    real_step = engine.engine.step
    calls = 0

    def failing_step() -> list:  # type: ignore[type-arg]
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("CUDA error: out of memory")
        return real_step()

    monkeypatch.setattr(engine.engine, "step", failing_step)
    handle = engine.submit("doomed", prompt(4, 5), PARAMS)
    with pytest.raises(RuntimeError, match="out of memory"):
        await handle.wait_finished()
    token_ids, _ = await engine.submit("next", prompt(4, 5), PARAMS).wait_finished()
    assert len(token_ids) == 8
    assert engine.engine.block_manager.num_used_blocks == 0


async def test_kv_events_reach_the_publisher() -> None:
    publisher = RecordingPublisher()
    engine = AsyncEngine(make_engine(tiny_model()), publisher=publisher)  # type: ignore[arg-type]
    task = asyncio.create_task(engine.run())
    try:
        ids = prompt(6, 9)
        await engine.submit("r", ids, SamplingParams(max_tokens=1)).wait_finished()
        assert [kind for kind, _ in publisher.events] == ["stored"]
        assert publisher.events[0][1] == engine.resident_hashes()
        assert len(engine.resident_hashes()) == 2
        assert await engine.reset_prefix_cache()
        assert publisher.events[-1] == ("cleared", [])
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
