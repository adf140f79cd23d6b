"""Fixtures of the daemon's unit tests (doubles: ``fakes.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from .fakes import InMemoryDaemon, Network, Pair, use_memory_wire


@pytest_asyncio.fixture
async def pair(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pair]:
    """Two in-memory daemons on one in-memory network, linked over MemoryTransport."""
    use_memory_wire(monkeypatch)
    network = Network()
    near, far = InMemoryDaemon(network), InMemoryDaemon(network)
    try:
        yield near, far
    finally:
        await near.close()
        await far.close()
