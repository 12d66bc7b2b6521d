"""A Redis client from a URL, Sentinel-managed deployments included, for the gateway and the
workers alike.

Besides redis-py's own forms (``redis://``, ``rediss://``, ``unix://``), a URL may name a
primary that Redis Sentinel watches::

    redis+sentinel://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB][?OPTIONS]
    rediss+sentinel://...            # TLS to the primary

``HOST:PORT`` are the sentinels (port 26379 unless given), ``SERVICE`` the name they monitor
(``sentinel monitor SERVICE ...``), ``USER``/``PASSWORD`` the primary's credentials, and the
option ``sentinel_password`` (and ``sentinel_username``) the sentinels' own. The client asks
the sentinels for the current primary when it connects, and again after a connection fails,
so a failover is followed without a restart. Every command goes to the primary.

Example::

    redis = redis_from_url("redis+sentinel://10.0.0.1,10.0.0.2,10.0.0.3/switchyard/0",
                           socket_timeout=2.0)
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT = 26379


class RedisUrlError(ValueError):
    """A Redis URL that cannot name a deployment; the message says what to change."""


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int, dict[str, Any],
                                      dict[str, Any]]:
    """(sentinels, service, db, the primary's connection options, the sentinels' options)."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for item in (h.strip() for h in hosts.split(",")):
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if not host:
            raise RedisUrlError(f"{_redacted(url)}: a sentinel has no host; list them as "
                                "HOST[:PORT],HOST[:PORT]")
        try:
            sentinels.append((host, int(port) if port else SENTINEL_PORT))
        except ValueError:
            raise RedisUrlError(f"{_redacted(url)}: sentinel port {port!r} is not a "
                                "number") from None
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise RedisUrlError(f"{_redacted(url)}: name the monitored service after the hosts: "
                            "redis+sentinel://HOST[:PORT],.../SERVICE[/DB]")
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise RedisUrlError(f"{_redacted(url)}: the database {path[1]!r} is not a "
                            "number") from None
    primary: dict[str, Any] = {}
    if credentials:
        user, has_password, password = credentials.partition(":")
        if user:
            primary["username"] = unquote(user)
        if has_password:
            primary["password"] = unquote(password)
    if parts.scheme.lower().startswith("rediss"):
        primary["ssl"] = True
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = set(options) - {"sentinel_password", "sentinel_username"}
    if unknown:
        raise RedisUrlError(f"{_redacted(url)}: unknown option(s) {sorted(unknown)}; "
                            "sentinel_password and sentinel_username are understood")
    own = {key.removeprefix("sentinel_"): value for key, value in options.items()}
    return sentinels, path[0], db, primary, own


def redis_from_url(url: str, **kwargs: Any) -> aioredis.Redis:
    """A client for ``url``; ``kwargs`` (timeouts, ...) apply to every connection."""
    if not is_sentinel_url(url):
        return aioredis.Redis.from_url(url, **kwargs)
    sentinels, service, db, primary, own = sentinel_parts(url)
    timeouts = {k: v for k, v in kwargs.items()
                if k in ("socket_timeout", "socket_connect_timeout")}
    sentinel = Sentinel(sentinels, sentinel_kwargs={**timeouts, **own}, **kwargs)
    client: aioredis.Redis = sentinel.master_for(service, db=db, **primary)
    return client


def _redacted(url: str) -> str:
    """``url`` without its password, for error messages."""
    parts = urlsplit(url)
    credentials, at, hosts = parts.netloc.rpartition("@")
    if not at:
        return url
    user = credentials.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hosts}" if user else f"***@{hosts}").geturl()
