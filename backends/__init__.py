"""switchyard: the fleet and its engines.

- ``backends.fleet``: the gateway's view of the fleet (registry, membership and metrics sync,
  health, the upstream HTTP client). Imports no engine.
- ``backends.engine_core``: the torch-free engine model (sequence, block manager, scheduler,
  request parsing, load and phase types) that the simulator and the PyTorch worker share.
- ``backends.engine_http``: the engines' common OpenAI-compatible HTTP surface.
- ``backends.publisher``: what engines write to Redis (heartbeats, KV events) and the fleet reads.
- ``backends.sim``, ``backends.worker``, ``backends.mock``: the engines.
- ``backends.tokenizer``: tokenizers and chat templates.
"""
