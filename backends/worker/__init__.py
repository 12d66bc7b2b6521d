"""The bundled PyTorch engine worker (needs ``torch``; the gateway process never imports it).

Modules: `config` (ModelConfig, torch-free), `model` (the Llama decoder), `attention` (the
KV-cache seam and a contiguous cache), `load_gguf` and `load_hf` (the two loaders), `loading`
(a model and its tokenizer from a path), `greedy` (the reference decode loop).

The engine, split as nano-vllm splits it, on the torch-free sequence / block manager /
scheduler of ``backends.sim``: `kv_cache` (paged K/V blocks, float or int8, and their sizing),
`paged_attention` (a step's flat batch and attention over the blocks), `runner` (plan in,
logits out), `sampling` (SamplingParams, Sampler), `detokenizer` (incremental text, stop
strings), `engine` (LLMEngine, the synchronous loop) and `async_engine` (AsyncEngine, steps
in a background thread for an aiohttp server).
"""
