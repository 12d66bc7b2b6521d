"""The `switchyard` command: serve, config check, up, tenants, keys, usage, waits, mock-engine,
sim, worker, bench."""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from pathlib import Path

from gateway.cli import admin_client, quickstart, up
from gateway.cli import usage as usage_cli
from gateway.observe import waits
from gateway.settings import ConfigError, load_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchyard", description="OpenAI-compatible gateway for self-hosted LLM fleets"
    )
    parser.add_argument("--version", action="version", version=f"switchyard {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", help="run the gateway (--config FILE, or --backend URL ... with no file)")
    serve.add_argument("--config", help="YAML configuration file (SWITCHYARD_* env overrides)")
    serve.add_argument("--workers", type=int, metavar="N",
                       help="run N gateway processes on the port (listen.workers)")
    quickstart.add_arguments(serve)

    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="action", required=True)
    check = config_sub.add_parser("check", help="validate a configuration file")
    check.add_argument("file")
    check.add_argument("--dev", action="store_true",
                       help="a development file: accept placeholder and short secrets")

    up.add_arguments(sub.add_parser("up", help="run a local fleet: Redis, engines, gateway"))
    admin_client.register(sub)
    usage_cli.register(sub)
    waits.register(sub)
    sub.add_parser("mock-engine", help="run the placeholder OpenAI-compatible engine",
                   add_help=False)
    sub.add_parser("sim", help="run simulated GPU engine workers", add_help=False)
    sub.add_parser("worker", help="serve a model with the bundled PyTorch engine",
                   add_help=False)
    sub.add_parser("bench", help="benchmarks: 'bench run' drives load and reports",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is caught below
        return code
    except BrokenPipeError:
        # The reader left (``switchyard waits --json | head``): no traceback. Python's own
        # flush at exit would fail again; point stdout at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # as a shell reports a process killed by SIGPIPE


def _version() -> str:
    try:
        return version("switchyard")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "mock-engine":
        from backends.mock.cli import main as mock_main

        return mock_main(argv[1:])
    if argv and argv[0] == "sim":
        from backends.sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "worker":
        # Imported only here: the PyTorch worker needs torch, which the gateway never loads.
        from backends.worker.cli import main as worker_main

        return worker_main(argv[1:])
    if argv and argv[0] in _plugin_commands():
        return int(_plugin_commands()[argv[0]].load()(argv[1:]))
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        if quickstart.is_requested(args):
            if args.workers is not None:
                print("switchyard serve: --workers needs --config (its workers share state "
                      "through the Redis the file names)", file=sys.stderr)
                return 2
            return quickstart.run(args)
        overrides = {} if args.workers is None else {"listen": {"workers": args.workers}}
        try:
            settings = load_settings(args.config, overrides=overrides)
        except ConfigError as exc:
            _print_config_errors(args.config or "<environment>", exc)
            return 2
        config_path = Path(args.config) if args.config else None
        if settings.listen.workers > 1:
            from gateway.workers import supervise

            return supervise(settings, config_path)
        from gateway.server import serve

        serve(settings, config_path=config_path)
        return 0
    if args.command == "config":
        try:
            settings = load_settings(args.file, strict_secrets=not args.dev)
        except ConfigError as exc:
            _print_config_errors(args.file, exc)
            return 1
        print(f"{args.file}: OK ({len(settings.backends)} backends, "
              f"{len(settings.tiers)} tiers, listening on "
              f"{settings.listen.host}:{settings.listen.port})")
        return 0
    if args.command == "up":
        return up.run(args)
    if args.command == "waits":
        return waits.run(args)
    if args.command == "usage":
        return usage_cli.run(args)
    return admin_client.run(args.command, args)


def _plugin_commands() -> dict[str, EntryPoint]:
    """Programs outside the gateway package that join ``switchyard`` as sub-commands (entry
    points of group ``switchyard.commands``; ``bench`` is one), so the gateway imports none."""
    return {ep.name: ep for ep in entry_points(group="switchyard.commands")}


def _print_config_errors(source: str, exc: ConfigError) -> None:
    count = len(exc.errors)
    print(f"{source}: {count} error{'s' if count != 1 else ''}", file=sys.stderr)
    for location, message in exc.errors:
        print(f"  {location}: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
