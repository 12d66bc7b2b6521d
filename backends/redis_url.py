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

A Redis Cluster is named by some of its nodes (port 6379 unless given); the client learns the
rest, and each slot's primary, from them, and follows failovers and resharding by itself::

    redis+cluster://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]...][/0]
    rediss+cluster://...             # TLS to every node

Example::

    redis = redis_from_url("redis+sentinel://10.0.0.1,10.0.0.2,10.0.0.3/switchyard/0",
                           socket_timeout=2.0)
    cluster = redis_from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000")
    is_cluster(cluster)   # True: multi-key commands must stay within one hash slot
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisClusterException, RedisError

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_PORT = 26379
REDIS_PORT = 6379

# What a Redis that is away raises: redis-py's errors, a socket's, and a cluster client's when
# it reaches no node at all (``RedisClusterUnreachableError`` is not a ``RedisError``). A
# timeout is an ``OSError``.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)


def raise_if_cancelled() -> None:
    """In a loop that outlives Redis errors: end it when its task was cancelled. redis-py may
    turn a cancellation that lands inside a command into a connection error, or swallow it and
    retry the command, and such a loop would otherwise go on for ever (a shutdown waiting on it
    would never end): call it where the loop catches Redis errors and at the top of each
    round."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def pipelined(redis: aioredis.Redis, fill: Callable[[Any], None], *,
                    transaction: bool = False) -> list[Any]:
    """Run the commands ``fill`` queues on a fresh pipeline of ``redis`` (a transaction with
    ``transaction``, which a cluster client never takes) and return their replies; the
    pipeline's connection goes back to the pool whatever happens. For the modules compiled with
    mypyc, which must not write ``async with`` around a pipeline: its exit awaits inside an
    exception handler when the body fails (tests/routing/test_native.py). This module runs
    interpreted."""
    async with redis.pipeline(transaction=transaction and not is_cluster(redis)) as pipe:
        fill(pipe)
        replies: list[Any] = await pipe.execute()
        return replies


class RedisUrlError(ValueError):
    """A Redis URL that cannot name a deployment; the message says what to change."""


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def is_cluster(redis: object) -> bool:
    """Whether ``redis`` is a Redis Cluster client."""
    return isinstance(redis, RedisCluster)


def sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int, dict[str, Any],
                                      dict[str, Any]]:
    """(sentinels, service, db, the primary's connection options, the sentinels' options)."""
    parts = urlsplit(url)
    sentinels = _hosts(url, SENTINEL_PORT, "sentinel")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise RedisUrlError(f"{_redacted(url)}: name the monitored service after the hosts: "
                            "redis+sentinel://HOST[:PORT],.../SERVICE[/DB]")
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise RedisUrlError(f"{_redacted(url)}: the database {path[1]!r} is not a "
                            "number") from None
    options = _options(url, {"sentinel_password", "sentinel_username"})
    own = {key.removeprefix("sentinel_"): value for key, value in options.items()}
    return sentinels, path[0], db, _credentials(url), own


def cluster_parts(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """(the nodes to start from, the connection options of every node)."""
    parts = urlsplit(url)
    nodes = _hosts(url, REDIS_PORT, "node")
    if parts.path.strip("/") not in ("", "0"):
        raise RedisUrlError(f"{_redacted(url)}: a Redis Cluster has only database 0; end the "
                            "URL after the nodes (or with /0)")
    _options(url, set())
    return nodes, _credentials(url)


def _hosts(url: str, default_port: int, what: str) -> list[tuple[str, int]]:
    """The comma-separated ``HOST[:PORT]`` list of ``url`` (``[IPv6]:PORT`` too)."""
    hosts = urlsplit(url).netloc.rpartition("@")[2]
    found = []
    for item in (h.strip() for h in hosts.split(",")):
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if not host:
            raise RedisUrlError(f"{_redacted(url)}: a {what} has no host; list them as "
                                "HOST[:PORT],HOST[:PORT]")
        try:
            found.append((host, int(port) if port else default_port))
        except ValueError:
            raise RedisUrlError(f"{_redacted(url)}: {what} port {port!r} is not a "
                                "number") from None
    return found


def _credentials(url: str) -> dict[str, Any]:
    """The data nodes' connection options: user, password, TLS."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    found: dict[str, Any] = {}
    if credentials:
        user, has_password, password = credentials.partition(":")
        if user:
            found["username"] = unquote(user)
        if has_password:
            found["password"] = unquote(password)
    if parts.scheme.lower().startswith("rediss"):
        found["ssl"] = True
    return found


def _options(url: str, known: set[str]) -> dict[str, str]:
    options = {key: values[-1] for key, values in parse_qs(urlsplit(url).query).items()}
    unknown = set(options) - known
    if unknown:
        understood = (", ".join(sorted(known)) + " are understood") if known else \
            "this form takes none"
        raise RedisUrlError(f"{_redacted(url)}: unknown option(s) {sorted(unknown)}; "
                            f"{understood}")
    return options


def redis_from_url(url: str, **kwargs: Any) -> aioredis.Redis:
    """A client for ``url``; ``kwargs`` (timeouts, ...) apply to every connection.

    For a ``redis+cluster://`` URL the client is a `RedisCluster`, which takes the same
    commands (typed as ``Redis`` here so that callers need no cast; `is_cluster` tells it)."""
    if is_cluster_url(url):
        nodes, options = cluster_parts(url)
        cluster = RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in nodes],
                               **options, **kwargs)
        return cast(aioredis.Redis, cluster)
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
