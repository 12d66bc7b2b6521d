"""``switchyard serve --backend URL ...``: the gateway in front of engines already running.

No configuration file: each engine's models come from its ``/v1/models``
(``gateway.engine_discovery``), the rest is the defaults plus any ``SWITCHYARD_*`` variables,
and the flags win over both. Without ``--redis-url`` (or ``$SWITCHYARD_REDIS_URL``) the state is
in memory: a single replica, no Redis anywhere. At start it creates the tenant ``default`` and
prints the listening URL, the backends with their models, the admin token (generated unless
given) and the commands to make a key and call the gateway.

``--backend`` and ``--config`` do not mix: a file lists its backends itself.

Example::

    switchyard serve --backend http://10.0.0.7:8000 --backend http://10.0.0.8:8000
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from backends.redis_url import REDIS_ERRORS
from gateway.context import GATEWAY, Gateway
from gateway.engine_discovery import DiscoveredEngine, DiscoveryError, check_urls, discover_engines
from gateway.settings import ConfigError, Settings, load_settings
from gateway.state import MEMORY_WARNING
from gateway.tenancy import ALL_MODELS, Limits, new_secret

DEFAULT_TENANT = "default"
DEFAULT_WAIT_S = 30.0
_TOKEN_FROM_ENV = '"$SWITCHYARD_ADMIN_TOKEN"'  # noqa: S105 (a shell reference, not a secret)
_FLAGS = (("backend", "--backend"), ("redis_url", "--redis-url"), ("host", "--host"),
          ("port", "--port"), ("admin_token", "--admin-token"), ("wait_s", "--wait-s"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", action="append", metavar="URL",
        help="an engine's base URL (http://host:port), repeatable: serve these engines with no "
        "configuration file; their models come from their /v1/models")
    parser.add_argument(
        "--redis-url", help="with --backend: keep tenants, keys and quotas in this Redis, shared "
        "by replicas (default: in memory, a single replica)")
    parser.add_argument("--host", help="with --backend: listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="with --backend: listen port (default 8080)")
    parser.add_argument(
        "--admin-token", help="with --backend: the admin API token (default: "
        "$SWITCHYARD_ADMIN_TOKEN, else one generated and printed)")
    parser.add_argument(
        "--wait-s", type=float, help=f"with --backend: how long to wait for the engines to "
        f"answer at start (default {DEFAULT_WAIT_S:g})")


def is_requested(args: argparse.Namespace) -> bool:
    """Whether any of this mode's flags was given."""
    return any(getattr(args, attr) is not None for attr, _ in _FLAGS)


def run(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    given = [flag for attr, flag in _FLAGS if getattr(args, attr) is not None]
    if args.config is not None:
        return _usage_error(
            f"{', '.join(given)} cannot be combined with --config: the file lists the backends "
            "and every other setting (SWITCHYARD_* variables override it). Use either "
            "--config FILE or --backend URL ...")
    if not args.backend:
        return _usage_error(f"{', '.join(given)} needs at least one --backend URL")
    if args.admin_token is not None and not args.admin_token.strip():
        return _usage_error("--admin-token may not be empty; leave it out to get a generated one")
    wait_s = DEFAULT_WAIT_S if args.wait_s is None else args.wait_s
    if not wait_s >= 0:
        return _usage_error(f"--wait-s must be a number of seconds >= 0, not {args.wait_s}")
    try:
        check_urls(args.backend)
    except DiscoveryError as exc:
        return _usage_error(str(exc))
    try:
        engines = discover_engines(args.backend, wait_s=wait_s)
    except DiscoveryError as exc:
        print(f"switchyard serve: {exc}", file=sys.stderr, flush=True)
        return 1
    admin_token = args.admin_token
    if admin_token is None and not environ.get("SWITCHYARD_ADMIN_TOKEN"):
        admin_token = new_secret(24)
    try:
        settings = build_settings(engines, environ, redis_url=args.redis_url, host=args.host,
                                  port=args.port, admin_token=admin_token)
    except ConfigError as exc:
        print("switchyard serve: invalid settings", file=sys.stderr)
        for location, message in exc.errors:
            print(f"  {location}: {message}", file=sys.stderr)
        return 2
    shown_token = admin_token  # None: it came from the environment and is not echoed

    async def on_started(app: web.Application, url: str) -> None:
        gw = app[GATEWAY]
        tenant_note = await _ensure_default_tenant(gw)
        print(banner(gw, _reachable(url), admin_token=shown_token, tenant_note=tenant_note),
              flush=True)

    from gateway.server import serve

    serve(settings, on_started=on_started)
    return 0


def build_settings(engines: Sequence[DiscoveredEngine], environ: Mapping[str, str], *,
                   redis_url: str | None, host: str | None, port: int | None,
                   admin_token: str | None) -> Settings:
    """Settings for these engines: defaults, then ``SWITCHYARD_*`` variables, then the flags.
    The state is in Redis when a Redis URL is given (flag or environment), else in memory."""
    redis_url = redis_url or environ.get("SWITCHYARD_REDIS_URL") or None
    overrides: dict[str, Any] = {
        "state": "redis" if redis_url else "memory",
        "backends": [{"name": e.name, "url": e.url, "models": list(e.models)} for e in engines],
        "routing": {"discover_workers": redis_url is not None},
    }
    if redis_url:
        overrides["redis_url"] = redis_url
    listen = {key: value for key, value in (("host", host), ("port", port)) if value is not None}
    if listen:
        overrides["listen"] = listen
    if admin_token is not None:
        overrides["admin_token"] = admin_token
    return load_settings(None, environ, overrides=overrides)


async def _ensure_default_tenant(gw: Gateway) -> str:
    settings = gw.settings
    try:
        await gw.store.create_tenant(
            name=DEFAULT_TENANT, tenant_id=DEFAULT_TENANT, tier=settings.default_tier,
            models=[ALL_MODELS], limits=Limits(**settings.default_limits.model_dump()))
    except KeyError:
        return "already stored: kept as it is"
    except REDIS_ERRORS as exc:
        return f"not created: Redis did not answer ({type(exc).__name__}); create it later"
    return f"created: every model, tier {settings.default_tier}"


def banner(gw: Gateway, url: str, *, admin_token: str | None, tenant_note: str) -> str:
    """What ``serve --backend`` prints once it listens."""
    settings = gw.settings
    backends = gw.registry.backends
    width = max(len(b.name) for b in backends)
    lines = ["", f"switchyard is serving {len(backends)} engine"
             f"{'s' if len(backends) != 1 else ''} at {url}", "", "  backends:"]
    lines += [f"    {b.name:<{width}}  {b.url}  models: {', '.join(sorted(b.models))}"
              for b in backends]
    if settings.state == "memory":
        lines.append(f"  WARNING: {MEMORY_WARNING}")
    else:
        lines.append("  state: in Redis, shared by every replica started with the same Redis")
        if settings.key_secret is None:
            lines.append("  WARNING: no SWITCHYARD_KEY_SECRET: API keys are hashed with plain "
                         "SHA-256; set the same secret on every replica")
    if admin_token is not None:
        lines.append(f"  admin token: {admin_token}   (shown only here)")
    else:
        lines.append("  admin token: the one in $SWITCHYARD_ADMIN_TOKEN")
    token_arg = shlex.quote(admin_token) if admin_token else _TOKEN_FROM_ENV
    lines.append(f"  tenant: {DEFAULT_TENANT} ({tenant_note})")
    model = sorted(backends[0].models)[0]
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "hello"}}]}}'
    # The Python lines stay flush left: they are one `python -c` program.
    lines += [
        "", "  Make a key (the \"key\" it prints is shown once):",
        f"    SWITCHYARD_URL={url} SWITCHYARD_ADMIN_TOKEN={token_arg} "
        f"{_switchyard_command()} keys create --tenant {DEFAULT_TENANT}",
        "", "  Call the gateway with it (export KEY=sy-...):",
        f"    curl {url}/v1/chat/completions -H \"Authorization: Bearer $KEY\" \\",
        f"      -H \"Content-Type: application/json\" -d '{body}'",
        "",
        f"    {shlex.quote(sys.executable)} -c 'import os; from openai import OpenAI",
        f"client = OpenAI(base_url=\"{url}/v1\", api_key=os.environ[\"KEY\"])",
        f"print(client.chat.completions.create(model=\"{model}\", messages=[{{\"role\": "
        "\"user\", \"content\": \"hello\"}]).choices[0].message.content)'",
        "",
    ]
    return "\n".join(lines)


def _switchyard_command() -> str:
    """``switchyard`` as a command that works with the virtual environment off PATH: the script
    beside this interpreter, else ``<this interpreter> -m gateway``. ``sys.executable`` is kept
    as it is, not resolved: a venv's ``bin/python`` links to a base Python without the packages."""
    script = Path(sys.executable).parent / "switchyard"
    if script.is_file():
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m gateway"


def _reachable(url: str) -> str:
    """``url`` with a wildcard listen address replaced by loopback, for commands to use."""
    for wildcard in ("//0.0.0.0:", "//[::]:"):
        if wildcard in url:
            return url.replace(wildcard, "//127.0.0.1:")
    return url


def _usage_error(message: str) -> int:
    print(f"switchyard serve: {message}", file=sys.stderr, flush=True)
    return 2
