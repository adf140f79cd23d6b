"""Shared fixtures: real daemons, unique cluster ids, loop-error guard."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

_cluster_ids = itertools.count(1000)


@pytest.fixture
def next_cluster_id() -> Iterator[Any]:
    """Cluster ids unique across the session, so tests can share daemons."""
    yield lambda: next(_cluster_ids)


@pytest_asyncio.fixture(autouse=True)
async def fail_on_loop_errors() -> AsyncIterator[None]:
    """Fail a test whose event loop reported an unhandled error (asyncpg, uvloop)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield
    loop.set_exception_handler(previous)
    assert not errors, f"the event loop reported errors: {errors}"
