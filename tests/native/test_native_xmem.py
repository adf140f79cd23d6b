"""Client-process memory in the native core: ``ProcessSpan`` (process_vm_readv /
writev behind a pidfd), ``BouncePool``, ``copy_process``, and data-server regions
and data-link requests of such memory, chunked through small bounce buffers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

from tests.native._native_support import CLUSTER, TOKEN, wait_one  # noqa: E402

KIB = 1 << 10
BOUNCE = 64 * KIB  # small, so that every transfer below takes several chunks


@pytest.fixture
def bounce() -> tuple[Any, Any]:
    return hn.BouncePool(2, BOUNCE), hn.BouncePool(2, BOUNCE)


@pytest.fixture
def pidfd() -> Iterator[int]:
    fd = os.pidfd_open(os.getpid())
    yield fd
    os.close(fd)


def span(array: Any, pidfd: int, bounce: tuple[Any, Any]) -> Any:
    """This process's array as client-process memory."""
    return hn.ProcessSpan(pidfd, os.getpid(), array.ctypes.data, array.nbytes, *bounce)


def triples(rows: Any) -> Any:
    return np.array(rows, dtype=np.uint64).reshape(-1, 3)


def test_copies_with_process_memory_on_either_side(pidfd: int, bounce: Any) -> None:
    rng = np.random.default_rng(3)
    engine = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    other = np.zeros(1 << 20, dtype=np.uint8)
    pool = hn.SharedPool("xmem", 2 << 20, 12)
    view = np.frombuffer(pool, np.uint8)
    src, dst = span(engine, pidfd, bounce), span(other, pidfd, bounce)
    # pool <- engine, 2000 scattered ranges in one call (batched by IOV_MAX)
    rows = [(i * 512, (i * 7919 % 2048) * 512, 300) for i in range(2000)]
    assert hn.copy_process(pool, src, triples(rows)) == hn.OK
    for d, s, n in rows[::97]:
        assert (view[d:d + n] == engine[s:s + n]).all()
    # engine <- engine through the (64 KiB) bounce buffer, ranges larger than it
    assert hn.copy_process(dst, src, triples([(0, 4096, 300 * KIB)])) == hn.OK
    assert (other[:300 * KIB] == engine[4096:4096 + 300 * KIB]).all()
    # engine <- pool
    view[:] = 5
    assert hn.copy_process(src, pool, triples([(10, 0, 1000)])) == hn.OK
    assert (engine[10:1010] == 5).all()
    # overlapping ranges inside one span copy as memmove would
    expect = engine.copy()
    expect[100 * KIB:400 * KIB] = expect[0:300 * KIB].copy()
    assert hn.copy_process(src, src, triples([(100 * KIB, 0, 300 * KIB)])) == hn.OK
    assert (engine == expect).all()
    with pytest.raises(ValueError):
        hn.copy_process(pool, src, triples([(0, engine.nbytes - 10, 11)]))
    del view
    pool.close()
    assert bounce[1].free == 2


def test_revoked_and_exited_memory_is_never_touched(pidfd: int, bounce: Any) -> None:
    engine = np.zeros(4096, dtype=np.uint8)
    pool = hn.SharedPool("xmem", 1 << 20, 12)
    memory = span(engine, pidfd, bounce)
    memory.revoke()
    with pytest.raises(hn.NativeError) as info:
        hn.copy_process(memory, pool, triples([(0, 0, 10)]))
    assert info.value.code == hn.E_GONE
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child_fd = os.pidfd_open(child.pid)
    try:
        # Any address: the call must not even be made once the process exited.
        gone = hn.ProcessSpan(child_fd, child.pid, 1 << 30, 4096, *bounce)
        assert gone.alive
        child.kill()
        child.wait(30)
        assert not gone.alive
        assert hn.copy_process(gone, pool, triples([(0, 0, 10)])) == hn.E_GONE
        assert hn.copy_process(pool, gone, triples([(0, 0, 10)])) == hn.E_GONE
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        os.close(child_fd)
    pool.close()


def test_probe_refuses_unmapped_addresses(pidfd: int, bounce: Any) -> None:
    memory = hn.ProcessSpan(pidfd, os.getpid(), 4096, 8192, *bounce)
    with pytest.raises(hn.NativeError) as info:
        memory.probe([4096])
    assert info.value.code == hn.E_REFUSED
    with pytest.raises(ValueError):
        memory.probe([1 << 40])


@pytest.mark.parametrize("streams", [1, 3])
def test_data_plane_with_process_memory_on_both_ends(
        pidfd: int, bounce: Any, server: Any, cq: Any, streams: int) -> None:
    """The server's region and the link's local memory are both client-process
    memory: reads and writes are byte-exact through 64 KiB bounce buffers."""
    rng = np.random.default_rng(streams)
    far = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    near = np.zeros(1 << 20, dtype=np.uint8)
    server.register_process_region(7, span(far, pidfd, bounce), 0, far.nbytes, CLUSTER,
                                   writable=True)
    local = span(near, pidfd, bounce)
    rows = [(i * 4096 * 3 % (1 << 20), i * 4096, 4096) for i in range(200)]
    rows.append((0, 900 * KIB, 100 * KIB))
    with hn.DataLink("127.0.0.1", server.port, TOKEN, streams, cq, 2000) as link:
        assert link.read_from(1, local, 7, triples(rows), 5000, 100) is None  # never inline
        assert wait_one(cq) == (1, hn.OK)
        for r, loc, n in rows:
            assert (near[loc:loc + n] == far[r:r + n]).all()
        near[:] = rng.integers(0, 256, near.size, dtype=np.uint8)
        back = [(loc, r, n) for r, loc, n in rows[:150]]
        assert link.write_to(2, local, 7, triples(back), 5000) is None
        assert wait_one(cq) == (2, hn.OK)
        for loc, r, n in back:
            assert (far[r:r + n] == near[loc:loc + n]).all()
        local.revoke()
        with pytest.raises(hn.NativeError):
            link.read_from(3, local, 7, triples(rows), 5000)
    server.unregister_region(7)
    assert bounce[0].free == 2 and bounce[1].free == 2


def test_server_refuses_a_read_of_an_exited_process(bounce: Any, server: Any, cq: Any) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child_fd = os.pidfd_open(child.pid)
    pool = hn.SharedPool("xmem", 1 << 20, 12)
    try:
        server.register_process_region(
            8, hn.ProcessSpan(child_fd, child.pid, 1 << 30, 1 << 20, *bounce), 0, 1 << 20,
            CLUSTER)
        child.kill()
        child.wait(30)
        with hn.DataLink("127.0.0.1", server.port, TOKEN, 1, cq, 2000) as link:
            link.read_from(1, pool, 8, triples([(0, 0, 4096)]), 5000)
            assert wait_one(cq) == (1, hn.E_REFUSED)
            link.read_from(2, pool, 8, triples([(0, 0, 4096)]), 5000)  # the stream kept step
            assert wait_one(cq) == (2, hn.E_REFUSED)
        server.unregister_region(8)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        os.close(child_fd)
        pool.close()
