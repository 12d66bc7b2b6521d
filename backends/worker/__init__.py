"""The bundled PyTorch engine worker (needs ``torch``; the gateway process never imports it).

Modules: `config` (ModelConfig, torch-free), `model` (the Llama decoder), `attention` (the
KV-cache seam and a contiguous cache), `load_gguf` and `load_hf` (the two loaders), `greedy`
(the reference decode loop).
"""
