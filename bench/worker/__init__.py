"""The PyTorch worker benchmark, run as ``python -m bench.worker``.

One module per measurement: `sweep` (batch sweep, with `steps` timing each engine step),
`prefix` (prefix-cache TTFT), `capacity` (KV bytes and sequences per budget), `quality` (int8
KV perplexity and greedy agreement, through `teacher`), `calibration` (the simulator's
step-time fit). `models` loads the model, `settings` sizes the CPU, CUDA and quick runs, `run`
sequences the sections, `report` prints them and checks the targets, `plot` draws the sweep.
`engine_check` is the engine's correctness check on a device (``bench/worker/gpu_check.sh``).
"""
