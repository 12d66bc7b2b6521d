"""The live routing benchmark's pure parts on hand-made values: the worker KV it sizes, the
warm-up it leaves out, and the split of requests into prefix hits and misses."""

from __future__ import annotations

import math
from typing import Any

import pytest

from backends.tokenizer import get_tokenizer
from bench.routing.figures import ideal_per_request, miss_split, run_figures, turns_kept
from bench.routing.live import MIN_KV_BLOCKS, Settings, kv_blocks_for, main_kv_blocks
from bench.run.spec import Record

WORKING_SET = 3294
COUNTERS = {"generation_tokens": 0.0, "cache_hit_tokens": 0.0, "cache_query_tokens": 0.0,
            "preemptions": 0.0, "num_steps": 0.0, "lateness_s": 0.0}


def record(index: int, sent_at_s: float, ttft_s: float, cached: int, prompt: int = 100,
           worker: str = "w0") -> Record:
    return Record(index=index, tenant="t", tier="standard", phase=0, is_stream=True,
                  sent_at_s=sent_at_s, status=200, ttft_s=ttft_s, e2e_s=ttft_s,
                  num_prompt_tokens=prompt, num_completion_tokens=1, num_cached_tokens=cached,
                  worker=worker)


@pytest.mark.parametrize(("settings", "expected"), [
    pytest.param(Settings(kv_fraction=0.5), 1647, id="half-the-working-set"),
    pytest.param(Settings(kv_fraction=0.35), 1153, id="rounded-up"),
    pytest.param(Settings(kv_fraction=0.01), MIN_KV_BLOCKS, id="never-under-the-minimum"),
    pytest.param(Settings(kv_fraction=0.5, num_kv_blocks=900), 900, id="blocks-win"),
    pytest.param(Settings(kv_fraction=None), None, id="sim-default"),
])
def test_main_kv_blocks(settings: Settings, expected: int | None) -> None:
    assert main_kv_blocks(settings, WORKING_SET) == expected


def test_kv_blocks_for_whole_working_set() -> None:
    assert kv_blocks_for(1.0, WORKING_SET) == WORKING_SET


@pytest.mark.parametrize(("cached", "ideal", "expected_share"), [
    pytest.param([96, 96], [96, 96], 0.0, id="all-hits"),
    pytest.param([0, 96], [96, 96], 0.5, id="one-missed"),
    pytest.param([32, 64], [96, 96], 0.5, id="under-half-of-ideal-is-a-miss"),
    pytest.param([0, 0], [0, 0], 0.0, id="nothing-to-hit-is-no-miss"),
])
def test_miss_split(cached: list[int], ideal: list[int], expected_share: float) -> None:
    records = [record(i, 0.0, 0.01 * (i + 1), c) for i, c in enumerate(cached)]
    split = miss_split(records, dict(enumerate(ideal)))
    assert split["miss_share"] == expected_share
    assert split["num_missed"] == round(expected_share * len(records))


def test_warmup_requests_are_left_out_but_their_prompts_count_as_seen() -> None:
    prompt = ({"role": "system", "content": "shared " * 200}, {"role": "user", "content": "q"})
    num_tokens = len(get_tokenizer("approx").encode_chat(prompt))
    records = [record(0, 0.5, 1.0, 0, num_tokens, worker="w0"),
               record(3, 0.7, 1.0, 0, num_tokens, worker="w0"),
               record(1, 2.0, 0.02, 0, num_tokens, worker="w1"),
               record(2, 3.0, 0.03, 0, num_tokens, worker="w1")]
    figures: dict[str, Any] = run_figures(
        records, dict.fromkeys(range(4), prompt), {"w0": COUNTERS, "w1": COUNTERS},
        window_s=4.0, worker_names=["w0", "w1"], warmup_s=1.0)
    assert figures["num_warmup"] == 2
    assert figures["num_ok"] == 2
    assert figures["requests_per_worker"] == {"w0": 0, "w1": 2}
    assert figures["ttft_ms"]["p99"] < 100 < figures["ttft_with_warmup_ms"]["p99"]
    # The warm-up's prompt was seen: both counted requests could have hit it (the second
    # warm-up request's hit is not counted).
    ideal = ideal_per_request(records, dict.fromkeys(range(4), prompt))
    assert math.isclose(figures["ideal_cached_fraction"], ideal[1] / num_tokens)
    assert 0.5 < figures["ideal_cached_fraction"] < 1.0
    assert figures["misses"]["miss_share"] == 1.0
    assert math.isclose(figures["throughput_rps"], 2 / 3.0)


def turn(index: int, conversation: int, turn_number: int, worker: str, sent_at_s: float = 2.0,
         status: int = 200) -> Record:
    r = record(index, sent_at_s, 0.01, 0, worker=worker)
    r.conversation, r.turn, r.status = conversation, turn_number, status
    return r


@pytest.mark.parametrize(("records", "expected"), [
    pytest.param([turn(0, 0, 0, "w0"), turn(1, 0, 1, "w0"), turn(2, 0, 2, "w1")],
                 (2, 1), id="one-kept-one-moved"),
    pytest.param([turn(0, 0, 0, "w0"), turn(1, 1, 0, "w1"), turn(2, 1, 1, "w1"),
                  turn(3, 0, 1, "w0")], (2, 2), id="interleaved-conversations"),
    pytest.param([turn(0, 0, 0, "w0", status=503), turn(1, 0, 1, "w1")], (0, 0),
                 id="previous-turn-failed-is-not-judged"),
    pytest.param([turn(0, 0, 0, "w0", sent_at_s=0.5), turn(1, 0, 1, "w0")], (1, 1),
                 id="previous-turn-in-warm-up-counts"),
    pytest.param([record(0, 2.0, 0.01, 0)], (0, 0), id="no-conversations"),
])
def test_turns_kept(records: list[Record], expected: tuple[int, int]) -> None:
    kept = turns_kept([r for r in records if r.sent_at_s >= 1.0], records)
    assert (kept["num_turns"], kept["num_kept"]) == expected
    assert kept["share"] == (expected[1] / expected[0] if expected[0] else None)
