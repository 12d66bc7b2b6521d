"""A rich progress bar for a run, on stderr, redrawn four times a second from the driver's
counters (never per request, so it costs the send loop nothing). Example::

    async with show_progress(driver, limits, enabled=sys.stderr.isatty()):
        await driver.run(schedule)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench.run.driver import DriveLimits, Driver

_STEPS = 1000


def _fraction(driver: Driver, limits: DriveLimits) -> float:
    by_time = driver.elapsed_s() / limits.send_window_s if limits.send_window_s > 0 else 1.0
    by_count = driver.num_sent / limits.max_requests if limits.max_requests else 0.0
    return min(1.0, max(by_time, by_count))


def _stats(driver: Driver) -> str:
    elapsed_s = max(driver.elapsed_s(), 1e-9)
    in_flight = driver.num_sent - driver.num_done
    return (f"sent {driver.num_sent}  done {driver.num_done}  failed {driver.num_failed}  "
            f"in flight {in_flight}  {driver.num_done / elapsed_s:.1f} req/s")


@contextlib.asynccontextmanager
async def show_progress(driver: Driver, limits: DriveLimits,
                        enabled: bool) -> AsyncIterator[None]:
    """Show the bar while the body runs (nothing when not ``enabled``)."""
    if not enabled:
        yield
        return
    progress = Progress(TextColumn("[bold]bench run"), BarColumn(),
                        TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=False)
    task = progress.add_task("run", total=_STEPS, stats="")

    async def refresh() -> None:
        while True:
            progress.update(task, completed=_fraction(driver, limits) * _STEPS,
                            stats=_stats(driver))
            await asyncio.sleep(0.25)

    with progress:
        updater = asyncio.create_task(refresh())
        try:
            yield
        finally:
            updater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await updater
            progress.update(task, completed=_STEPS, stats=_stats(driver))
