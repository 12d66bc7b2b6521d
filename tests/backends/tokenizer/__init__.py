"""Tests of backends.tokenizer: the SmolLM2 GGUF tokenizer, its other sources, the approximation."""
