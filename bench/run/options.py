"""Parsing and checking of the run's options: pure functions, errors that say what to change.

Example::

    check_loopback("http://127.0.0.1:8080/v1")            # fine
    parse_tenants("interactive:4,standard:16,batch:4")    # 24 TenantSpec values
    parse_slos(["interactive=0.3"])["interactive"]         # Slo(ttft_s=0.3)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from bench.run.spec import TenantSpec


class OptionError(ValueError):
    """An option the run cannot use; the message says what to pass instead."""


@dataclass(frozen=True, slots=True)
class Slo:
    """A tier's service-level objective: TTFT, and optionally TPOT, in seconds."""

    ttft_s: float
    tpot_s: float | None = None


DEFAULT_SLOS = {"interactive": Slo(0.5), "standard": Slo(2.0), "batch": Slo(60.0)}


def check_loopback(url: str) -> str:
    """``url`` unchanged if its host is loopback (127.0.0.0/8, ::1, localhost); else an error.

    The load generator drives hundreds of requests a second: pointed at a shared or remote
    service by mistake, that is an attack, so only this machine is a valid target.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OptionError(f"{url!r} is not an http(s) URL such as http://127.0.0.1:8080/v1")
    host = parts.hostname
    if host == "localhost":
        return url
    try:
        is_loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        is_loopback = False
    if not is_loopback:
        raise OptionError(f"refusing to send load to {host!r}: the load generator only targets "
                          "loopback hosts (127.0.0.0/8, ::1, localhost) on this machine")
    return url


def parse_tenants(text: str, prefix: str = "bench") -> list[TenantSpec]:
    """``"interactive:4,standard:16"`` -> tenants ``bench-interactive-0`` ... with their tiers."""
    tenants: list[TenantSpec] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        tier, _, count = item.partition(":")
        if not tier or not (count or "1").isdigit() or int(count or "1") < 1:
            raise OptionError(f"--tenants takes TIER:COUNT[,TIER:COUNT...], not {item!r}")
        tenants += [TenantSpec(f"{prefix}-{tier}-{i}", tier) for i in range(int(count or "1"))]
    if not tenants:
        raise OptionError("--tenants names no tenants; e.g. interactive:4,standard:16,batch:4")
    return tenants


def parse_slos(items: list[str]) -> dict[str, Slo]:
    """``TIER=TTFT_S[:TPOT_S]`` overrides on top of the defaults."""
    slos = dict(DEFAULT_SLOS)
    for item in items:
        tier, sep, value = item.partition("=")
        ttft, _, tpot = value.partition(":")
        try:
            slo = Slo(float(ttft), float(tpot) if tpot else None)
        except ValueError:
            slo = Slo(-1.0)
        if not sep or not tier or slo.ttft_s <= 0 or (slo.tpot_s is not None and slo.tpot_s <= 0):
            raise OptionError(f"--slo takes TIER=TTFT_S[:TPOT_S] such as interactive=0.5:0.05, "
                              f"not {item!r}")
        slos[tier] = slo
    return slos


def parse_rates(text: str) -> list[float]:
    """``"10"`` or a sweep ``"5,10,20"`` (requests/s, one phase each)."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        rates = []
    if not rates or any(rate <= 0 for rate in rates):
        raise OptionError(f"--rate takes requests/s, or a sweep such as 5,10,20; not {text!r}")
    return rates


def parse_fleet(text: str) -> tuple[str, int]:
    """``"sim:4"`` -> ("sim", 4)."""
    kind, _, count = text.partition(":")
    if kind not in ("sim", "mock") or not count.isdigit() or int(count) < 1:
        raise OptionError(f"--fleet takes sim:N or mock:N (N >= 1), not {text!r}")
    return kind, int(count)
