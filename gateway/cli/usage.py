"""`switchyard usage`: requests, tokens and cost per tenant, key and model (GET /admin/usage).

Example::

    switchyard usage --tenant acme --from 2026-12-01 --to 2026-12-02 --group-by model
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx

from gateway.cli.admin_client import add_admin_arguments

COLUMNS = ("tenant", "key_id", "model", "requests", "prompt_tokens", "cached_tokens",
           "output_tokens", "cost")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    usage = sub.add_parser("usage", help="requests, tokens and cost per tenant, key and model")
    usage.add_argument("--tenant", help="one tenant (default: every tenant)")
    usage.add_argument("--from", dest="from_", metavar="FROM",
                       help="start: Unix seconds or ISO 8601 (default: 24 h before --to)")
    usage.add_argument("--to", help="end: Unix seconds or ISO 8601 (default: now)")
    usage.add_argument("--group-by", choices=("key", "model", "tenant"), default="key")
    usage.add_argument("--model", help="only this model")
    usage.add_argument("--key-id", help="only this key (with --group-by key)")
    usage.add_argument("--json", action="store_true", help="the API's JSON as it came")
    add_admin_arguments(usage)


def run(args: argparse.Namespace) -> int:
    if not args.admin_token:
        print("error: pass --admin-token or set SWITCHYARD_ADMIN_TOKEN", file=sys.stderr)
        return 2
    query = {name: value for name, value in (
        ("tenant", args.tenant), ("from", args.from_), ("to", args.to),
        ("group_by", args.group_by), ("model", args.model), ("key_id", args.key_id))
        if value}
    try:
        response = httpx.get(args.url.rstrip("/") + "/admin/usage", params=query,
                             headers={"Authorization": f"Bearer {args.admin_token}"},
                             timeout=30.0)
    except httpx.HTTPError as exc:
        print(f"error: cannot reach the gateway at {args.url}: {exc}", file=sys.stderr)
        return 1
    try:
        data = response.json()
    except ValueError:
        data = {}
    if response.status_code >= 400:
        message = data.get("error", {}).get("message") if isinstance(data, dict) else None
        print(f"error ({response.status_code}): {message or response.text[:200]}",
              file=sys.stderr)
        return 1
    if args.json:
        import json

        print(json.dumps(data, indent=2))
        return 0
    print(render(data))
    return 0


def render(data: dict[str, Any]) -> str:
    """The usage page as a plain table, a total line last."""
    rows = [[_cell(row, column) for column in COLUMNS] for row in data.get("data", [])]
    total = data.get("total", {})
    rows.append(["total", "", "", *(_cell(total, column) for column in COLUMNS[3:])])
    header = [*COLUMNS[:7], f"cost ({total.get('currency', '')})".replace(" ()", "")]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    lines = [f"usage {data.get('from')} .. {data.get('to')} (group by {data.get('group_by')})",
             "  ".join(h.ljust(w) if i < 3 else h.rjust(w)
                       for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    if not data.get("data"):
        lines.insert(1, "no usage in this range")
    return "\n".join(lines)


def _cell(row: dict[str, Any], column: str) -> str:
    value = row.get(column, "")
    if column == "cost":
        return f"{float(value or 0):.6f}"
    return str(value)
