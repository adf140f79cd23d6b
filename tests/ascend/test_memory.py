"""Device and host memory through the shim: allocation, OOM, copies of every
kind (byte-exact), bounds, pinning and thread binding."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.ascend._peer import pattern
from tests.ascend.conftest import DEVICE_MEM, MIB, child_env
from tests.cann_double import DoubleControl

if TYPE_CHECKING:
    from hixl_native import _ascend as ascend
else:
    ascend = pytest.importorskip("hixl_native._ascend")



def test_malloc_rounds_to_huge_pages(device: ascend.Device) -> None:
    with device.malloc(1) as buf:
        assert buf.size == ascend.DEVICE_ALIGNMENT == 2 * MIB
        assert buf.address % ascend.DEVICE_ALIGNMENT == 0
        assert buf.device is device and not buf.closed
    assert buf.closed
    buf.close()  # idempotent
    with pytest.raises(ValueError):
        device.malloc(0)
    with pytest.raises(TypeError):
        device.malloc(True)


def test_out_of_device_memory(device: ascend.Device, double: DoubleControl) -> None:
    first = device.malloc(DEVICE_MEM // 2)
    try:
        with pytest.raises(ascend.AclError) as caught:
            device.malloc(DEVICE_MEM // 2 + 1)
        assert caught.value.code == 207001
        assert caught.value.api == "aclrtMalloc"
        assert "out of memory" in caught.value.detail
        second = device.malloc(DEVICE_MEM // 2)  # exactly what is left
        second.close()
    finally:
        first.close()
    double.configure(mem_limit=4 * MIB)
    with pytest.raises(ascend.AclError, match="207001"):
        device.malloc(5 * MIB)


def test_injected_malloc_failure(device: ascend.Device, double: DoubleControl) -> None:
    double.fail("aclrtMalloc", 507053, count=1, skip=1)
    ok = device.malloc(1)
    with pytest.raises(ascend.AclError) as caught:
        device.malloc(1)
    assert caught.value.code == 507053
    device.malloc(1).close()
    ok.close()


def test_copies_are_byte_exact(runtime: ascend.AscendRuntime) -> None:
    dev = runtime.set_device(1)
    data = pattern(3 * MIB + 123)
    with dev.malloc(len(data)) as a, dev.malloc(len(data)) as b:
        a.write(0, data)
        assert a.read(0, len(data)) == data
        ascend.memcpy(b, 7, a, 0, len(data) - 7)  # device to device
        assert b.read(7, len(data) - 7) == data[:-7]
        out = bytearray(100)
        b.read_into(1000, out)
        assert bytes(out) == data[993:1093]
        with dev.malloc_host(len(data)) as host:
            view = memoryview(host)
            view[:10] = b"0123456789"
            ascend.memcpy(a, 0, host, 0, 10)  # host to device
            ascend.memcpy(host, 20, a, 5, 5)  # device to host
            assert bytes(view[20:25]) == b"56789"
            view.release()


def test_bounds_are_checked(device: ascend.Device) -> None:
    with device.malloc(1) as buf:
        size = buf.size
        with pytest.raises(ValueError):
            buf.write(size - 1, b"xy")
        with pytest.raises(ValueError):
            buf.read(size + 1, 0)
        with pytest.raises(ValueError):
            buf.read(-1, 1)
        buf.write(size - 2, b"xy")
        assert buf.read(size - 2, 2) == b"xy"
        with pytest.raises(ValueError, match="nbytes"):
            ascend.memcpy(buf, 0, buf, 0, size + 1)
    with pytest.raises(ValueError, match="closed"):
        buf.read(0, 1)


def test_cross_device_copy_refused(runtime: ascend.AscendRuntime) -> None:
    with runtime.set_device(0).malloc(1) as a, runtime.set_device(1).malloc(1) as b:
        with pytest.raises(ValueError, match="one device"):
            ascend.memcpy(a, 0, b, 0, 1)


def test_async_copies_pin_memory(device: ascend.Device, double: DoubleControl) -> None:
    data = pattern(MIB, 3)
    with device.create_stream() as stream, device.malloc(MIB) as dbuf, \
            device.malloc_host(MIB) as hbuf:
        memoryview(hbuf)[:] = data
        double.delay("exec:aclrtMemcpyAsync", 200)
        stream.memcpy_async(dbuf, 0, hbuf, 0, MIB)
        stream.memcpy_async(hbuf, 0, dbuf, 0, 0)  # empty: nothing queued, nothing pinned
        assert dbuf.pins == 1 and stream.pending == 2
        with pytest.raises(BufferError):
            dbuf.close()
        stream.synchronize(timeout_ms=5000)
        assert dbuf.pins == 0 and stream.pending == 0
        assert dbuf.read(0, MIB) == data


def test_failed_async_task_surfaces_at_synchronize(device: ascend.Device,
                                                   double: DoubleControl) -> None:
    with device.create_stream() as stream, device.malloc(1) as a, device.malloc(1) as b:
        double.fail("exec:aclrtMemcpyAsync", 507053)
        stream.memcpy_async(a, 0, b, 0, 16)
        with pytest.raises(ascend.AclError) as caught:
            stream.synchronize()
        assert caught.value.code == 507053
        assert a.pins == 0  # a failed stream is idle: pins are dropped
        stream.synchronize()  # the error is reported once


def test_device_reset_waits_for_children(runtime: ascend.AscendRuntime) -> None:
    dev = runtime.set_device(1)
    buf = dev.malloc(1)
    with pytest.raises(RuntimeError, match="open objects"):
        dev.reset()
    buf.close()
    dev.reset()
    assert dev.closed
    with pytest.raises(RuntimeError, match="reset"):
        dev.malloc(1)
    again = runtime.set_device(1)
    assert again is not dev
    again.malloc(1).close()


def test_other_threads_bind_the_device(device: ascend.Device) -> None:
    """ACL contexts are per thread (the double enforces it): the shim sets the
    device on whichever thread calls."""
    results: list[object] = []

    def work() -> None:
        try:
            with device.malloc(1) as buf:
                buf.write(0, b"thread")
                results.append(buf.read(0, 6))
        except Exception as exc:  # reported below
            results.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [b"thread"] * 4


def test_unsafe_memcpy(device: ascend.Device) -> None:
    with device.malloc(1) as a, device.malloc_host(128) as host, device.create_stream() as s:
        memoryview(host)[:4] = b"abcd"
        ascend.unsafe_memcpy(device, a.address + 8, host.address, 4,
                             ascend.MemcpyKind.HOST_TO_DEVICE)
        assert a.read(8, 4) == b"abcd"
        ascend.unsafe_memcpy(device, a.address + 64, a.address + 8, 4,
                             ascend.MemcpyKind.DEVICE_TO_DEVICE)
        # queued copies need 64-byte aligned addresses (CANN's aclrtMemcpyAsync rule)
        ascend.unsafe_memcpy(device, host.address + 64, a.address + 64, 4,
                             ascend.MemcpyKind.DEVICE_TO_HOST, s)
        s.synchronize()
        assert bytes(memoryview(host)[64:68]) == b"abcd"
        with pytest.raises(ascend.AclError, match="64-byte aligned"):
            ascend.unsafe_memcpy(device, host.address + 4, a.address + 8, 4,
                                 ascend.MemcpyKind.DEVICE_TO_HOST, s)
        with pytest.raises(ascend.AclError) as caught:  # CANN's own check of the kind
            ascend.unsafe_memcpy(device, host.address, host.address + 8, 4,
                                 ascend.MemcpyKind.DEVICE_TO_DEVICE)
        assert caught.value.code == 107000


def test_host_buffer_views_block_close(device: ascend.Device) -> None:
    host = device.malloc_host(10)
    view = memoryview(host)
    with pytest.raises(BufferError):
        host.close()
    view.release()
    host.close()


def test_bare_tgid(runtime: ascend.AscendRuntime) -> None:
    # the double's bare tgid is never getpid(), as in a container (see
    # tests/cann_double/acl_double_context.c)
    assert runtime.bare_tgid() == os.getpid() + 1_000_000


def test_faults_from_the_environment(double_dir: Path) -> None:
    """HIXL_DOUBLE_FAULTS arms the double of a child process."""
    code = (
        "from hixl_native import _ascend as a\n"
        f"d = a.load({str(double_dir)!r}).set_device(0)\n"
        "for _ in range(3):\n"
        "    try:\n        d.malloc(1).close(); print('ok')\n"
        "    except a.AclError as e:\n        print(e.code)\n"
    )
    env = child_env(HIXL_DOUBLE_FAULTS="aclrtMalloc=fail:207018:1:1;aclInit=delay:1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["ok", "207018", "ok"]
