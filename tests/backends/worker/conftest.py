"""Shared fixtures of the worker's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for a module: steady timings, no oversubscription on a small CI box
    (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
