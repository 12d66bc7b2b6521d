"""The mock engine served on loopback, and an aiohttp session to drive it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest_asyncio

from backends.mock import MockEngine, start
from tests.backends.mock.support import CONFIG


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[MockEngine]:
    async with await start(CONFIG) as running:
        yield running


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client
