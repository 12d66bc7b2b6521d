"""Soak benchmark: does the gateway's memory stay bounded under a stream of unique prompts?

`python -m bench.soak` (`bench.soak.bench`) drives prompts no two alike, at a bounded rate, to a
gateway in front of simulated engines, in either fleet mode, and samples the gateway's RSS.
"""
