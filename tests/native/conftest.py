"""Fixtures for the native-core tests (real memfds, real sockets on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

try:
    import hixl_native
except ImportError:  # the test modules skip themselves via importorskip
    hixl_native = None

from tests.native._native_support import CLUSTER, TOKEN


@pytest.fixture
def cq() -> Iterator[Any]:
    queue = hixl_native.CompletionQueue()
    yield queue
    queue.close()


@pytest.fixture
def server() -> Iterator[Any]:
    srv = hixl_native.DataServer("127.0.0.1", 0)
    srv.authorize(TOKEN, CLUSTER)
    yield srv
    srv.close()


def _pool(name: str, size: int) -> Any:
    return hixl_native.SharedPool(name, size, 12)


@pytest.fixture
def pools() -> Iterator[tuple[Any, Any]]:
    """A (remote, local) pair of 8 MiB pools."""
    remote, local = _pool("remote", 8 << 20), _pool("local", 8 << 20)
    yield remote, local
    local.close()
    remote.close()
