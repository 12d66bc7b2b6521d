"""Tests of the benchmarks in bench/."""
