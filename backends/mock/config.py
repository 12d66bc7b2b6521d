"""Settings of the mock engine, fixed for the life of one server."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MockEngineConfig:
    """How the mock engine listens and how fast it "generates".

    Example::

        config = MockEngineConfig(port=19001, models=("llama-mock",), token_delay_ms=5)

    ``port=0`` asks the OS for a free port; the one chosen is reported by
    ``MockEngine.port`` (and printed by the CLI). The delays can be overridden
    per request through the ``"mock"`` request field.
    """

    host: str = "127.0.0.1"
    port: int = 0
    models: tuple[str, ...] = ("switchyard-mock",)
    first_token_delay_ms: float = 0
    token_delay_ms: float = 0
    default_max_tokens: int = 16
    # False: /metrics answers 404, as an OpenAI-compatible server that exposes no load figures
    serves_metrics: bool = True

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("MockEngineConfig.models must name at least one model")
        if self.first_token_delay_ms < 0 or self.token_delay_ms < 0:
            raise ValueError("MockEngineConfig delays must be >= 0 ms")
        if self.default_max_tokens < 1:
            raise ValueError("MockEngineConfig.default_max_tokens must be >= 1")
