"""What the quota store needs of a Redis transport: ``ScriptPipe``, which both transports
implement (``redis_pipe.RespScriptPipe``, RESP written by hand on the store's own connection,
and ``redis_batch.ScriptBatcher``, pipelines of the redis-py client). Each sends Lua script
calls in batches, one round trip per batch, with a bounded wait per call."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from admission.quota.lua import LuaScript


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
