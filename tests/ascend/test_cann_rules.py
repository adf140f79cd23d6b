"""The CANN double refuses what CANN refuses, and the shim keeps to CANN's
rules: stream tear-down, device reference counts, contexts, serialised
communicator creation, rank-table communicators.

Each rule's CANN page is cited where the double implements it
(tests/cann_double/*.c). Calls made straight into the double (ctypes) show
the double's own behaviour; calls through the shim show hixl obeying it.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hixl_service.ascend.comms import RankInfo, rank_table
from tests.ascend._peer import pattern
from tests.ascend._rank1 import Rank1
from tests.ascend.conftest import MIB
from tests.cann_double import DoubleControl

if TYPE_CHECKING:
    from hixl_native import _ascend as ascend
else:
    ascend = pytest.importorskip("hixl_native._ascend")

H2D = 1
WAIT_S = 10.0


@pytest.fixture
def acl(double_dir: Path) -> ctypes.CDLL:
    """The double's libascendcl.so: the instance the shim loaded."""
    lib = ctypes.CDLL(str(double_dir / "libascendcl.so"))
    lib.hixl_double_device_refs.argtypes = [ctypes.c_int]
    lib.aclrtMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]
    lib.aclrtMallocHost.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.aclrtCreateContext.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32]
    lib.aclrtMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    for name in ("aclrtDestroyStream", "aclrtStreamAbort", "aclrtFree", "aclrtFreeHost",
                 "aclrtSetCurrentContext", "aclrtDestroyContext"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    return lib


@pytest.fixture
def hccl(double_dir: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(double_dir / "libhccl.so"))
    lib.HcclCommInitRootInfo.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint32,
                                         ctypes.POINTER(ctypes.c_void_p)]
    lib.HcclCommDestroy.argtypes = [ctypes.c_void_p]
    lib.hixl_double_init_busy.argtypes = [ctypes.c_int]
    return lib


def join_bounded(thread: threading.Thread) -> None:
    thread.join(WAIT_S)
    assert not thread.is_alive(), "a bounded wait ran out"


# ------------------------------------------------------------- streams


def test_double_destroy_stream_waits_for_unfinished_tasks(runtime: ascend.AscendRuntime,
                                                          acl: ctypes.CDLL,
                                                          double: DoubleControl) -> None:
    """aclrtDestroyStream waits for unfinished tasks (aclcppdevg_03_0070): a
    destroy behind a task that never ends blocks until aclrtStreamAbort."""
    assert acl.aclrtSetDevice(0) == 0
    stream, dev, host = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert acl.aclrtCreateStream(ctypes.byref(stream)) == 0
    assert acl.aclrtMalloc(ctypes.byref(dev), 4096, 0) == 0
    assert acl.aclrtMallocHost(ctypes.byref(host), 4096) == 0
    try:
        double.hang("exec:aclrtMemcpyAsync")
        assert acl.aclrtMemcpyAsync(dev, 4096, host, 4096, H2D, stream) == 0
        destroyed: list[int] = []

        def destroy() -> None:
            acl.aclrtSetDevice(0)  # the stream's context (the device's default)
            destroyed.append(acl.aclrtDestroyStream(stream))
            acl.aclrtResetDevice(0)

        t = threading.Thread(target=destroy)
        t.start()
        t.join(0.3)
        assert t.is_alive() and not destroyed  # waiting for the hung copy
        assert acl.aclrtStreamAbort(stream) == 0
        join_bounded(t)
        assert destroyed == [0]
    finally:
        acl.aclrtFree(dev)
        acl.aclrtFreeHost(host)
        acl.aclrtResetDevice(0)


def test_shim_aborts_before_destroying(runtime: ascend.AscendRuntime,
                                       double: DoubleControl) -> None:
    """A stream whose synchronize timed out is aborted, then destroyed: the
    destroy returns, and the memory its work pinned is released."""
    device = runtime.set_device(0)
    with device.malloc(1) as dst, device.malloc_host(64) as src:
        stream = device.create_stream()
        double.hang("exec:aclrtMemcpyAsync")
        stream.memcpy_async(dst, 0, src, 0, 64)
        with pytest.raises(ascend.AclError) as caught:
            stream.synchronize(timeout_ms=100)
        assert caught.value.code == 507046
        assert dst.pins == 1
        done = threading.Thread(target=stream.destroy)
        done.start()
        join_bounded(done)
        assert stream.closed and dst.pins == 0
        assert ascend.live_objects()["abandoned_streams"] == 0


def test_receive_without_a_send_tears_down(runtime: ascend.AscendRuntime,
                                            double_dir: Path) -> None:
    """A receive whose peer never sends: the synchronize times out; destroying
    that stream would wait for ever (aclcppdevg_03_0070), so the shim aborts
    its work first and the destroy returns; the communicator goes after."""
    device = runtime.set_device(0)
    root = device.hccl_root_info()
    with Rank1(double_dir, root_info=root) as peer, device.malloc(1) as buf:
        comm = ascend.HcclComm(device, root, 2, 0)
        peer.wait_ready()
        stream = device.create_stream()
        peer.link_up(comm, stream)
        comm.recv(buf, 0, 4096, 1, stream)
        with pytest.raises(ascend.AclError) as caught:
            stream.synchronize(timeout_ms=200)
        assert caught.value.code == 507046 and buf.pins == 1
        done = threading.Thread(target=stream.destroy)
        done.start()
        join_bounded(done)
        assert stream.closed and buf.pins == 0
        assert ascend.live_objects()["abandoned_streams"] == 0
        comm.destroy()


def test_stream_abort_then_synchronize_reports_it(runtime: ascend.AscendRuntime,
                                                  double: DoubleControl) -> None:
    device = runtime.set_device(0)
    with device.malloc(1) as dst, device.malloc_host(64) as src, \
            device.create_stream() as stream:
        double.hang("exec:aclrtMemcpyAsync")
        stream.memcpy_async(dst, 0, src, 0, 64)
        stream.abort()
        with pytest.raises(ascend.AclError) as caught:
            stream.synchronize(timeout_ms=5000)
        assert caught.value.code == 107023  # ACL_ERROR_RT_STREAM_ABORT
        assert dst.pins == 0
        # the stream takes work again after the abort (the hang is disarmed: an
        # abort before the copy started leaves it armed)
        double.reset()
        stream.memcpy_async(dst, 0, src, 0, 64)
        stream.synchronize(timeout_ms=5000)


# ------------------------------------------------- devices and contexts


def test_double_set_device_is_reference_counted(runtime: ascend.AscendRuntime,
                                                acl: ctypes.CDLL) -> None:
    """aclrtResetDevice releases the device only when every aclrtSetDevice was
    matched (aclcppdevg_03_0040)."""
    base = acl.hixl_double_device_refs(1)
    assert acl.aclrtSetDevice(1) == 0 and acl.aclrtSetDevice(1) == 0
    assert acl.hixl_double_device_refs(1) == base + 2
    assert acl.aclrtResetDevice(1) == 0
    assert acl.hixl_double_device_refs(1) == base + 1
    assert acl.aclrtResetDevice(1) == 0
    assert acl.hixl_double_device_refs(1) == base


def test_shim_sets_each_device_once(runtime: ascend.AscendRuntime, acl: ctypes.CDLL) -> None:
    """Calls from many threads do not add aclrtSetDevice references (the old
    per-thread binding did, and one reset at finalize never released them)."""
    device = runtime.set_device(0)
    base = acl.hixl_double_device_refs(0)
    failures: list[BaseException] = []

    def work() -> None:
        try:
            with device.malloc(1) as buf:
                buf.write(0, b"x")
        except BaseException as exc:  # re-raised below
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        join_bounded(t)
    assert not failures
    assert acl.hixl_double_device_refs(0) == base


def test_a_foreign_thread_keeps_its_context(runtime: ascend.AscendRuntime,
                                            acl: ctypes.CDLL) -> None:
    """What torch_npu does: its thread sets a device (that device's default
    context). hixl's call on that thread runs in hixl's context of its own
    device and puts the thread's context back afterwards."""
    device = runtime.set_device(0)
    seen: list[object] = []

    def torch_like() -> None:
        assert acl.aclrtSetDevice(1) == 0
        before, after = ctypes.c_void_p(), ctypes.c_void_p()
        acl.aclrtGetCurrentContext(ctypes.byref(before))
        with device.malloc(1) as buf:  # hixl, on device 0
            buf.write(0, pattern(1, 3))
            seen.append(buf.read(0, 1))
        acl.aclrtGetCurrentContext(ctypes.byref(after))
        seen.append(before.value == after.value)
        assert acl.aclrtResetDevice(1) == 0

    t = threading.Thread(target=torch_like)
    t.start()
    join_bounded(t)
    assert seen == [pattern(1, 3), True]


def test_double_refuses_a_context_of_a_reset_device(runtime: ascend.AscendRuntime,
                                                    acl: ctypes.CDLL) -> None:
    """A context whose device was reset cannot be made current
    (aclcppdevg_03_0061); a default context cannot be destroyed."""
    result: list[int] = []

    def run() -> None:
        # device 1 is open in the shim, so take the count to zero by hand
        refs = acl.hixl_double_device_refs(1)
        ctx, default = ctypes.c_void_p(), ctypes.c_void_p()
        acl.aclrtSetDevice(1)
        acl.aclrtGetCurrentContext(ctypes.byref(default))
        result.append(acl.aclrtDestroyContext(default))
        acl.aclrtCreateContext(ctypes.byref(ctx), 1)
        for _ in range(refs + 1):
            acl.aclrtResetDevice(1)
        result.append(acl.aclrtSetCurrentContext(ctx))
        for _ in range(refs):
            acl.aclrtSetDevice(1)  # give the shim its references back
        result.append(acl.aclrtSetCurrentContext(ctx))
        result.append(acl.aclrtDestroyContext(ctx))

    runtime.set_device(1)
    t = threading.Thread(target=run)
    t.start()
    join_bounded(t)
    assert result == [107000, 107002, 0, 0]


# ------------------------------------------------ communicator creation


def test_double_refuses_concurrent_creation_on_one_device(runtime: ascend.AscendRuntime,
                                                          hccl: ctypes.CDLL,
                                                          acl: ctypes.CDLL,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """One thread at a time creates a device's communicators (HcclCommInitRootInfo;
    8.0.RC2: serial calls only): a second creation meanwhile is refused."""
    monkeypatch.setenv("HIXL_DOUBLE_CONNECT_TIMEOUT_MS", "2000")
    device = runtime.set_device(0)
    roots = [device.hccl_root_info(), device.hccl_root_info()]
    codes: list[int] = []

    def create(root: bytes) -> None:
        acl.aclrtSetDevice(0)
        comm = ctypes.c_void_p()
        codes.append(hccl.HcclCommInitRootInfo(2, root, 0, ctypes.byref(comm)))
        acl.aclrtResetDevice(0)

    first = threading.Thread(target=create, args=(roots[0],))
    first.start()
    for _ in range(1000):  # bounded: until the first creation is under way
        if hccl.hixl_double_init_busy(0):
            break
        threading.Event().wait(0.005)
    assert hccl.hixl_double_init_busy(0)
    create(roots[1])
    assert codes == [7]  # HCCL_E_UNAVAIL, at once
    join_bounded(first)
    assert codes == [7, 9]  # the first timed out without a peer


def test_shim_serialises_creation(runtime: ascend.AscendRuntime,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the shim, two creations at once on one device wait for each
    other: both end by HCCL's timeout (9), neither is refused as concurrent (7)."""
    monkeypatch.setenv("HIXL_DOUBLE_CONNECT_TIMEOUT_MS", "300")
    device = runtime.set_device(0)
    before = ascend.comm_inits()
    codes: list[int] = []

    def create() -> None:
        try:
            ascend.HcclComm(device, device.hccl_root_info(), 2, 0)
        except ascend.HcclError as exc:
            codes.append(exc.code)

    threads = [threading.Thread(target=create) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        join_bounded(t)
    assert codes == [9, 9, 9]
    assert ascend.comm_inits() == before + 3


def two_rank_table() -> str:
    return rank_table(RankInfo("127.0.0.1", 0, ""), RankInfo("127.0.0.1", 1, ""))


def test_rank_table_communicator_byte_exact(runtime: ascend.AscendRuntime,
                                            double_dir: Path) -> None:
    table = two_rank_table()
    assert json.loads(table)["server_count"] == "1"
    device = runtime.set_device(0)
    n = MIB + 7
    with Rank1(double_dir, rank_table=table) as peer, device.malloc(2 * MIB) as buf, \
            device.create_stream() as stream:
        comm = ascend.comm_from_rank_table(device, table, 0, buffer_mb=1, name="rank1-test")
        with comm:
            peer.wait_ready()
            peer.link_up(comm, stream)
            assert (comm.rank, comm.nranks) == (0, 2)
            buf.write(0, pattern(n, 4))
            comm.send(buf, 0, n, 1, stream)
            assert peer.ask(f"recv 0 {n}") == "ok"
            stream.synchronize(timeout_ms=10_000)
            assert peer.ask("sync 10000") == "ok"
            assert peer.ask(f"check 0 {n} 4") == "ok"


def test_rank_table_argument_rules(runtime: ascend.AscendRuntime) -> None:
    device = runtime.set_device(0)
    table = json.loads(two_rank_table())
    del table["status"]
    with pytest.raises(ascend.HcclError) as caught:  # the double checks CANN's format
        ascend.comm_from_rank_table(device, json.dumps(table), 0, buffer_mb=1, name="t")
    assert caught.value.code == 1 and caught.value.api == "HcclCommInitClusterInfoMemConfig"
    three = rank_table(RankInfo("127.0.0.1", 0, ""), RankInfo("10.0.0.2", 1, ""))
    crowd = json.loads(three)
    crowd["server_list"][1]["device"].append({"device_id": "2", "device_ip": "",
                                              "rank_id": "2"})
    with pytest.raises(ascend.HcclError) as caught:
        ascend.comm_from_rank_table(device, json.dumps(crowd), 0, buffer_mb=1, name="crowd")
    assert caught.value.code == 5  # the double builds two ranks only
    with pytest.raises(ascend.HcclError, match="hcclCommName") as caught:
        ascend.comm_from_rank_table(device, three, 0, buffer_mb=1)  # no name: op_base.cc
    assert caught.value.code == 1
    with pytest.raises(ValueError):  # rank_id 2 is not in a two-rank table
        ascend.comm_from_rank_table(device, three, 2)
    with pytest.raises(ValueError):
        ascend.comm_from_rank_table(device, "{}", 0)
    with pytest.raises(ValueError):
        ascend.comm_from_rank_table(device, three, 0, name="x" * 200)


@pytest.fixture(autouse=True)
def _device_counts_restored(runtime: ascend.AscendRuntime, acl: ctypes.CDLL) -> Iterator[None]:
    """Each test leaves aclrtSetDevice's counts as it found them."""
    runtime.set_device(0)
    runtime.set_device(1)
    before = [acl.hixl_double_device_refs(d) for d in (0, 1)]
    yield
    assert [acl.hixl_double_device_refs(d) for d in (0, 1)] == before
