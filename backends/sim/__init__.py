"""switchyard: the simulated engine (pure engine model of a vLLM-like GPU worker)."""
