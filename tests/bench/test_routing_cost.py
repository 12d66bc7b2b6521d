"""bench.routing.cost: the decision-cost microbenchmark runs and reports every case."""

from __future__ import annotations

import pytest

from bench.routing.cost import NUM_BACKENDS, Setup, main, measure, measure_gateway


def test_measures_one_sample_per_call_pure_and_through_the_gateway() -> None:
    setup = Setup.build()
    assert len(setup.backends) == NUM_BACKENDS
    pure = measure(setup, "prefix_affinity", 200, max_ranked=2)
    gateway = measure_gateway(setup, "prefix_affinity", 200)
    for result in (pure, gateway):
        assert len(result.samples_us) == 200
        assert 0.0 < result.p50_us <= result.p99_us
        assert result.cpu_us_per_call > 0.0


def test_prints_a_verdict_for_the_default_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--calls", "300", "--rounds", "1", "--profile", "prefix_affinity"]) == 0
    out = capsys.readouterr().out
    assert "index.match only" in out
    assert out.count("target p99 <= 100 us") == 2
    assert "gateway Router.rank, prefix_affinity, top 2" in out
