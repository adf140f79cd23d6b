"""Fixtures for the native-core tests (real memfds, real sockets on 127.0.0.1).

The test modules skip themselves with ``importorskip`` when the extension is
not built, so the imports below happen only inside fixtures they request.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.native._native_support import CLUSTER, TOKEN

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, DataServer, SharedPool


@pytest.fixture(autouse=True)
def no_native_leaks() -> Iterator[None]:
    """Fail a test that leaves native objects (mappings, requests, threads'
    connections, ...) behind once its fixtures are torn down."""
    try:
        import hixl_native
    except ImportError:
        yield
        return
    # Collect first: garbage from earlier tests (of any package) must not
    # be freed during this one and blur the count.
    gc.collect()
    before = hixl_native.live_objects()
    yield
    gc.collect()
    after = hixl_native.live_objects()
    leaked = {kind: after[kind] - before[kind] for kind in after if after[kind] > before[kind]}
    assert not leaked, f"native objects leaked: {leaked}"


@pytest.fixture
def cq() -> Iterator[CompletionQueue]:
    import hixl_native

    queue = hixl_native.CompletionQueue()
    yield queue
    queue.close()


@pytest.fixture
def server() -> Iterator[DataServer]:
    import hixl_native

    srv = hixl_native.DataServer("127.0.0.1", 0)
    srv.authorize(TOKEN, CLUSTER)
    yield srv
    srv.close()


@pytest.fixture
def pools() -> Iterator[tuple[SharedPool, SharedPool]]:
    """A (remote, local) pair of 8 MiB pools."""
    import hixl_native

    remote = hixl_native.SharedPool("remote", 8 << 20, 12)
    local = hixl_native.SharedPool("local", 8 << 20, 12)
    yield remote, local
    local.close()
    remote.close()


@pytest.fixture
def copy_pair() -> Iterator[tuple[SharedPool, SharedPool]]:
    """A (destination, source) pair of 4 MiB pools, the source filled with random bytes."""
    import hixl_native
    import numpy as np

    src = hixl_native.SharedPool("src", 4 << 20, 12)
    dst = hixl_native.SharedPool("dst", 4 << 20, 12)
    np.frombuffer(src, np.uint8)[:] = np.random.default_rng(1).integers(0, 256, src.size, np.uint8)
    yield dst, src
    dst.close()
    src.close()
