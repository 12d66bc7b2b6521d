"""What the quota store needs of a Redis transport: ``ScriptPipe``, which both transports
implement (``redis_pipe.RespScriptPipe``, RESP written by hand on the store's own connection,
and ``redis_batch.ScriptBatcher``, pipelines of the redis-py client). Each sends Lua script
calls in batches, one round trip per batch, with a bounded wait per call.

Within a batch, the calls of an ops script (``LuaScript.num_header_args``) with the same keys
and header are merged into one command (``merge_calls``): one tenant's acquires, settles and
renews of one loop iteration cost Redis one script run, which reads and writes each of its
keys once, instead of one run each."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from redis.exceptions import ResponseError

from admission.quota.lua import LuaScript

MAX_MERGED_OPS = 128  # ops per merged command: bounds one script run (Redis runs one at a time)


class QueuedCall(Protocol):
    script: LuaScript
    keys: Sequence[str]
    args: Sequence[str | int]
    future: asyncio.Future[Any]


Call = TypeVar("Call", bound=QueuedCall)


def merge_calls(calls: Sequence[Call]) -> list[list[Call]]:
    """The commands to send for ``calls``, in order of their first call: one call each, or an
    ops script's calls with the same keys and header arguments, in their order (at most
    ``MAX_MERGED_OPS``). Calls with different keys are independent, so merging reorders only
    calls that touch different keys."""
    units: list[list[Call]] = []
    open_units: dict[tuple[object, ...], list[Call]] = {}
    for queued in calls:
        num_header = queued.script.num_header_args
        if num_header is None:
            units.append([queued])
            continue
        group = (queued.script.sha, *queued.keys, None, *queued.args[:num_header])
        unit = open_units.get(group)
        if unit is None or len(unit) >= MAX_MERGED_OPS:
            unit = open_units[group] = []
            units.append(unit)
        unit.append(queued)
    return units


def unit_args(unit: Sequence[QueuedCall]) -> list[str | int]:
    """The merged command's arguments: the header once, then every call's ops."""
    first = unit[0]
    args = list(first.args)
    num_header = first.script.num_header_args
    if num_header is not None:
        for queued in unit[1:]:
            args.extend(queued.args[num_header:])
    return args


def split_reply(unit: Sequence[QueuedCall], reply: Any) -> list[Any]:
    """Each call's reply from the merged command's (ResponseError when they do not match)."""
    if unit[0].script.num_header_args is None:
        return [reply]
    if isinstance(reply, bytes):
        parts: list[Any] = reply.split(b"\n")
    elif isinstance(reply, str):
        parts = reply.split("\n")
    else:
        raise ResponseError(f"the quota script answered {type(reply).__name__}, not a string")
    if len(parts) != len(unit):
        raise ResponseError(f"the quota script answered {len(parts)} replies for {len(unit)} ops")
    return parts


class ScriptPipe(Protocol):
    # True: every call is answered (or failed) within the pipe's timeout, so callers need no
    # timer of their own; False: a queued call can wait longer, callers bound it.
    bounds_calls: bool
    num_calls: int
    num_round_trips: int
    num_script_loads: int

    def counters(self) -> dict[str, int]:
        """``num_calls``, ``num_round_trips`` and ``num_script_loads`` so far."""
        ...

    async def run(self, script: LuaScript, keys: Sequence[str],
                  args: Sequence[str | int]) -> Any:
        """One script call's reply (or its error raised); calls made while a batch is out go
        together in the next."""
        ...

    def call(self, script: LuaScript, keys: Sequence[str],
             args: Sequence[str | int]) -> asyncio.Future[Any]:
        """Queue one script call; the future holds its reply or its error. Never blocks."""
        ...

    async def run_deferred(self, script: LuaScript, keys: Sequence[str],
                           args: Sequence[str | int], max_delay_s: float) -> Any:
        """Like ``run``, for a call that may wait up to ``max_delay_s``: it goes with the next
        call that is sent, or on its own when the delay is up."""
        ...

    def defer(self, script: LuaScript, keys: Sequence[str], args: Sequence[str | int],
              max_delay_s: float) -> asyncio.Future[Any]:
        """``run_deferred`` without waiting."""
        ...

    async def aclose(self, flush_timeout_s: float = 1.0) -> None:
        """Send what is queued, wait up to ``flush_timeout_s`` for the answers, fail the rest."""
        ...
