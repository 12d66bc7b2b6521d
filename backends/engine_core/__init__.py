"""The torch-free engine model: sequences, the paged block manager with prefix caching, the
continuous-batching scheduler, OpenAI request parsing, and the load and phase types an engine
reports. Pure (no asyncio, aiohttp or torch): the simulator and the PyTorch worker build on it."""
