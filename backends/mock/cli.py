"""Command line of the mock engine: ``python -m backends.mock --port 19001``."""

from __future__ import annotations

import argparse

from backends.mock.config import MockEngineConfig
from backends.mock.runner import run


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    defaults = MockEngineConfig()
    try:
        config = MockEngineConfig(
            host=args.host,
            port=args.port,
            models=tuple(args.model) if args.model else defaults.models,
            first_token_delay_ms=args.first_token_delay_ms,
            serves_metrics=not args.no_metrics,
            token_delay_ms=args.token_delay_ms,
            default_max_tokens=args.default_max_tokens,
        )
    except ValueError as exc:
        _parser().error(str(exc))
    run(config)
    return 0


def _parser() -> argparse.ArgumentParser:
    defaults = MockEngineConfig()
    parser = argparse.ArgumentParser(
        prog="python -m backends.mock",
        description="A CPU-cheap OpenAI-compatible placeholder engine for tests and benchmarks.",
    )
    parser.add_argument("--host", default=defaults.host, help="address to listen on")
    parser.add_argument("--port", type=int, required=True, help="port to listen on (0: any)")
    parser.add_argument(
        "--model",
        action="append",
        help=f"a model name to serve; repeat for several (default: {defaults.models[0]})",
    )
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--default-max-tokens", type=int, default=defaults.default_max_tokens)
    parser.add_argument("--no-metrics", action="store_true",
                        help="answer /metrics with 404, as an engine without load metrics")
    return parser
