"""bench.overhead.profile's summary of py-spy's collapsed stacks: top functions and stages."""

from __future__ import annotations

from bench.overhead.bench import STAGE_PROFILES, stages_table
from bench.overhead.profile import STAGES, stage_shares, summarise

ROOT = "/work/main"
RAW = "\n".join([
    # a request in auth, called from aiohttp's server: auth, not aiohttp's own frames
    f"_handle_request (/venv/site-packages/aiohttp/web_protocol.py:10);"
    f"_handle ({ROOT}/gateway/proxy.py:60);authenticate ({ROOT}/gateway/auth.py:90) 3",
    # admission calling into the registry: both stages count it
    f"_handle ({ROOT}/gateway/proxy.py:60);admit ({ROOT}/admission/waiting_room.py:156);"
    f"state ({ROOT}/backends/fleet/registry.py:170) 2",
    # admission asking routing for its decision: routing's, not admission's
    f"_handle ({ROOT}/gateway/proxy.py:60);admit ({ROOT}/admission/waiting_room.py:156);"
    f"route ({ROOT}/gateway/router.py:290);schedule ({ROOT}/routing/scheduler.py:50) 10",
    # aiohttp's own frame at the top of the stack
    "data_received (/venv/site-packages/aiohttp/web_protocol.py:300) 5",
    "not a stack line",
])


def shares(text: str) -> dict[str, float]:
    lines = text.split("-- stages")[1].splitlines()[1:]
    return {line[8:].strip(): float(line[:6]) for line in lines}


def test_stages_count_frames_on_the_stack_or_the_innermost_one() -> None:
    text = summarise(RAW, top=5)
    assert text.startswith("20 samples")
    found = shares(text)
    assert list(found) == [name for name, _, _ in STAGES]
    assert found["auth"] == 15.0
    assert found["SLO admission"] == 10.0 and found["upstream client"] == 10.0
    assert found["routing"] == 50.0  # called by admission, counted once: routing's
    assert found["aiohttp, own frames"] == 25.0  # not the 3 samples that only pass through it
    assert found["quota"] == 0.0


def test_top_functions_by_self_and_inclusive() -> None:
    text = summarise(RAW, top=2)
    self_part = text.split("-- top 2 by self --")[1].split("-- top 2 by inclusive --")[0]
    assert "25.0%  data_received (aiohttp/web_protocol.py)" in self_part
    assert "50.0%  schedule (routing/scheduler.py)" in self_part


def test_stage_shares_and_the_stage_table() -> None:
    """Shares are of all samples; the bench's table is each share times the profile's
    median CPU per request, a column per profile taken."""
    found = stage_shares(RAW)
    assert found["auth"] == 0.15 and found["aiohttp, own frames"] == 0.25
    assert stage_shares("") == {name: 0.0 for name, _, _ in STAGES}
    figures = {f"stages.nonstream.gateway.{name}": 200 * share for name, share in found.items()}
    figures["stages.nonstream.gateway.total"] = 200.0
    table = stages_table(figures).splitlines()
    assert table[0] == "| stage (µs per request) | gateway, 4 backends, non-streaming |"
    assert "| auth | 30 |" in table and "| total | 200 |" in table
    assert len(table) == 2 + len(STAGES) + 1
    assert ("gateway", "nonstream") in STAGE_PROFILES
