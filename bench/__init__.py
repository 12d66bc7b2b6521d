"""switchyard's benchmarks, one folder per experiment (results go to ``bench/results``).

- ``overhead``: what the gateway costs over a bare proxy and the engine alone (CPU, latency,
  throughput), the tracing cost (``tracing``) and the py-spy profile (``profile``);
- ``routing``: routing policies against round-robin on live simulated fleets (``live``), and
  the decision's own cost (``cost``);
- ``admission``: SLO-class admission against FIFO at load levels over capacity;
- ``sim_accuracy``: the simulated engine against its latency model;
- ``vsim``: the virtual-time fleet simulator (fleet-scale routing) and its agreement with live
  runs (``agreement``);
- ``worker``: the bundled PyTorch engine (throughput, quality, the GPU check);
- ``run``: the product's load generator (``switchyard bench run``);
- ``common``: statistics, /proc readers, the own / third-party fleet modes, the load client,
  result paths.

Each experiment runs as ``python -m bench.<experiment>``; docs/benchmarks.md indexes the pages.
"""
