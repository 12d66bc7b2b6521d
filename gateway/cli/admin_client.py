"""`switchyard tenants ...` and `switchyard keys ...`: thin httpx wrappers over the admin API.

`keys import` reads the key from a file or stdin, never from argv, which `ps` shows to everyone.
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import sys
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8080"


def add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=os.environ.get("SWITCHYARD_URL", DEFAULT_URL),
        help="gateway base URL (env SWITCHYARD_URL)",
    )
    parser.add_argument(
        "--admin-token", default=os.environ.get("SWITCHYARD_ADMIN_TOKEN"),
        help="admin token (env SWITCHYARD_ADMIN_TOKEN)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tenants = sub.add_parser("tenants", help="manage tenants through the admin API")
    tsub = tenants.add_subparsers(dest="action", required=True)
    create = tsub.add_parser("create", help="create a tenant")
    create.add_argument("--name", required=True)
    create.add_argument("--id", help="tenant id (lower-case letters, digits, - and _)")
    create.add_argument("--tier", help="SLO class, e.g. interactive, standard, batch")
    create.add_argument("--models", help="comma-separated model allowlist ('*' for all)")
    _weight_arg(create)
    _limit_args(create)
    tsub.add_parser("list", help="list tenants")
    get = tsub.add_parser("get", help="show one tenant")
    get.add_argument("tenant_id")
    update = tsub.add_parser("update", help="change a tenant")
    update.add_argument("tenant_id")
    update.add_argument("--name")
    update.add_argument("--tier")
    update.add_argument("--models")
    update.add_argument("--enable", dest="enabled", action="store_const", const=True)
    _weight_arg(update)
    _limit_args(update)
    disable = tsub.add_parser("disable", help="disable a tenant (its keys stop working)")
    disable.add_argument("tenant_id")

    keys = sub.add_parser("keys", help="manage API keys through the admin API")
    ksub = keys.add_subparsers(dest="action", required=True)
    kcreate = ksub.add_parser("create", help="create a key; it is shown once")
    kcreate.add_argument("--tenant", required=True)
    kcreate.add_argument("--name", default="")
    kcreate.add_argument("--expires-in-s", type=float)
    kcreate.add_argument("--tier", help="narrow the tenant's tier for this key")
    kimport = ksub.add_parser(
        "import", help="store a key from another gateway (read from stdin or --key-file)")
    kimport.add_argument("--tenant", required=True)
    kimport.add_argument("--key-file", help="file holding the key (default: stdin)")
    kimport.add_argument("--key", dest="key_in_argv", help=argparse.SUPPRESS)
    kimport.add_argument("--name", default="")
    kimport.add_argument("--expires-in-s", type=float)
    kimport.add_argument("--tier", help="narrow the tenant's tier for this key")
    klist = ksub.add_parser("list", help="list keys (never their secrets)")
    klist.add_argument("--tenant")
    revoke = ksub.add_parser("revoke", help="revoke a key (every gateway stops accepting it)")
    revoke.add_argument("key_id")
    for parser in (*tsub.choices.values(), *ksub.choices.values()):
        add_admin_arguments(parser)


def _weight_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--weight", type=_finite_float,
        help="share of its tier's queue relative to other tenants (default 1; 2 is twice)",
    )


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _read_key(args: argparse.Namespace) -> str | None:
    """The key to import, from --key-file or stdin (prompted, unechoed, on a terminal)."""
    if args.key_in_argv is not None:
        print("error: the key is never taken from the command line, where ps shows it to "
              "everyone; pipe it on stdin or pass --key-file", file=sys.stderr)
        return None
    try:
        if args.key_file:
            with open(args.key_file, encoding="utf-8") as file:
                key = file.read()
        elif sys.stdin.isatty():
            key = getpass.getpass("Key to import (not shown): ")
        else:
            key = sys.stdin.read()
    except OSError as exc:  # strerror alone: the "file name" may be a mistyped key
        print(f"error: cannot read the key: {exc.strerror}", file=sys.stderr)
        return None
    except UnicodeDecodeError:
        print("error: cannot read the key: it is not UTF-8 text", file=sys.stderr)
        return None
    key = key.strip()
    if not key:
        print("error: no key given: pipe it on stdin or pass --key-file", file=sys.stderr)
        return None
    return key


def _limit_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rpm", type=int, help="requests per minute")
    parser.add_argument("--tpm", type=int, help="tokens per minute")
    parser.add_argument("--max-concurrent", type=int, help="concurrent requests")


def _limits(args: argparse.Namespace) -> dict[str, int] | None:
    limits = {
        "requests_per_minute": args.rpm,
        "tokens_per_minute": args.tpm,
        "max_concurrent": args.max_concurrent,
    }
    return {k: v for k, v in limits.items() if v is not None} or None


def run(command: str, args: argparse.Namespace) -> int:
    if not args.admin_token:
        print("error: pass --admin-token or set SWITCHYARD_ADMIN_TOKEN", file=sys.stderr)
        return 2
    method, path, body = _request_for(command, args)
    if command == "keys" and args.action == "import":
        if (key := _read_key(args)) is None:
            return 2
        body["key"] = key
    headers = {"Authorization": f"Bearer {args.admin_token}"}
    try:
        response = httpx.request(
            method, args.url.rstrip("/") + path, json=body, headers=headers, timeout=10.0
        )
    except httpx.HTTPError as exc:
        print(f"error: cannot reach the gateway at {args.url}: {exc}", file=sys.stderr)
        return 1
    data = response.json() if response.content else {}
    if response.status_code >= 400:
        message = data.get("error", {}).get("message", response.text)
        print(f"error ({response.status_code}): {message}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2))
    if command == "keys" and args.action == "create":
        print("\nStore this key now: it is not shown again.", file=sys.stderr)
    return 0


def _request_for(command: str, args: argparse.Namespace) -> tuple[str, str, Any]:
    action = args.action
    if command == "tenants":
        if action == "create":
            body: dict[str, Any] = {"name": args.name}
            if args.id:
                body["id"] = args.id
            if args.tier:
                body["tier"] = args.tier
            if args.models:
                body["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
            if args.weight is not None:
                body["weight"] = args.weight
            if limits := _limits(args):
                body["limits"] = limits
            return "POST", "/admin/tenants", body
        if action == "list":
            return "GET", "/admin/tenants", None
        if action == "get":
            return "GET", f"/admin/tenants/{args.tenant_id}", None
        if action == "update":
            body = {k: getattr(args, k) for k in ("name", "tier", "enabled") if getattr(args, k)}
            if args.models:
                body["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
            if args.weight is not None:  # 0 is an error to report, not "leave it"
                body["weight"] = args.weight
            if limits := _limits(args):
                body["limits"] = limits
            return "PATCH", f"/admin/tenants/{args.tenant_id}", body
        return "DELETE", f"/admin/tenants/{args.tenant_id}", None
    if action in ("create", "import"):
        body = {"tenant_id": args.tenant, "name": args.name}
        if args.expires_in_s is not None:  # 0 is an error, not "never expires"
            body["expires_in_s"] = args.expires_in_s
        if args.tier:
            body["tier"] = args.tier
        return "POST", "/admin/keys" + ("/import" if action == "import" else ""), body
    if action == "list":
        query = f"?tenant_id={args.tenant}" if args.tenant else ""
        return "GET", f"/admin/keys{query}", None
    return "DELETE", f"/admin/keys/{args.key_id}", None
