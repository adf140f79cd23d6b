"""One-sided HCCL (HcclBatchGet / HcclBatchPut of registered memory), the
rule-obeying two-sided batches and page-locked host memory, through the shim
against the CANN double: byte-exact transfers, and the double refusing what
CANN's documentation forbids, so that hixl relying on it fails here."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import hixl_native
import numpy as np
import pytest

from tests.ascend._peer import pattern
from tests.ascend._rank1 import Rank1
from tests.ascend.conftest import MIB, child_env
from tests.ascend.test_hccl import comm_pair

if TYPE_CHECKING:
    from hixl_native import _ascend as ascend
else:
    ascend = pytest.importorskip("hixl_native._ascend")

HCCL_E_PARA = 1
ACL_ERROR_RT_PARAM_INVALID = 107000



Pair = tuple["ascend.HcclComm", Rank1]


@pytest.fixture
def pair(runtime: ascend.AscendRuntime, double_dir: Path) -> Iterator[Pair]:
    """Rank 0 here, rank 1 in a child process (one communicator creation at a
    time per process, as CANN asks)."""
    with comm_pair(runtime, double_dir) as comms:
        yield comms


@pytest.fixture
def stream(runtime: ascend.AscendRuntime) -> Iterator[ascend.Stream]:
    with runtime.set_device(0).create_stream() as s0:
        yield s0


def prepare_both(c0: ascend.HcclComm, peer: Rank1, timeout_s: int = 10) -> None:
    """HcclCommPrepare on both ranks at once (it returns once both called it)."""
    peer.tell(f"prepare {timeout_s}")
    try:
        ascend.hccl_prepare(c0, timeout_s)
    finally:
        answer = peer.answer()
    assert answer == "ok", answer


class Prepared:
    """Two ranks with one registered, bound and prepared buffer each (rank 1's
    is the child's 8 MiB buffer, reached by its address there)."""

    def __init__(self, runtime: ascend.AscendRuntime, pair: Pair, size: int) -> None:
        self.c0, self.peer = pair
        self.b0 = runtime.set_device(0).malloc(size)
        address, far_size = self.peer.ask("address").split()
        self.far_address, self.far_size = int(address), int(far_size)
        self.g0 = ascend.GlobalMemory(self.b0)
        ascend.hccl_bind(self.c0, self.g0)
        assert self.peer.ask("register") == "ok"
        assert self.peer.ask("bind") == "ok"
        prepare_both(self.c0, self.peer)

    def close(self) -> None:
        ascend.hccl_unbind(self.c0, self.g0)
        assert self.peer.ask("unbind") == "ok"
        self.g0.release()
        assert self.peer.ask("deregister") == "ok"
        self.b0.close()


@pytest.fixture
def prepared(runtime: ascend.AscendRuntime, pair: Pair) -> Iterator[Prepared]:
    p = Prepared(runtime, pair, 8 * MIB)
    yield p
    p.close()


def test_the_double_has_the_one_sided_api(runtime: ascend.AscendRuntime) -> None:
    assert {"one_sided", "host_register"} <= runtime.features
    assert ascend.one_sided_supported() and ascend.host_register_supported()
    assert ascend.MAX_DESC_NUM == 256


def test_without_the_symbols_the_shim_reports_no_one_sided_api(two_sided_dir: Path) -> None:
    """A libhccl.so lacking the seven entry points (another process: one CANN per process)."""
    code = ("from hixl_native import _ascend; import sys; "
            "print(sorted(_ascend.load(sys.argv[1]).features))")
    done = subprocess.run([sys.executable, "-c", code, str(two_sided_dir)], env=child_env(),
                          capture_output=True, text=True, timeout=60, check=True)
    features = done.stdout.strip()
    assert "one_sided" not in features and "batch_send_recv" in features, done


def test_the_daemon_goes_two_sided_when_hccl_refuses_the_api(
        device: ascend.Device, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A product whose HCCL exports the API without supporting it: the first
    registration answered HCCL_E_NOT_SUPPORT turns the path off."""
    from hixl_service.ascend.onesided import OneSidedMemory

    registry = OneSidedMemory(enabled=True)
    monkeypatch.setenv("HIXL_DOUBLE_ONE_SIDED", "0")
    with device.malloc(MIB) as buffer:
        registry.register(buffer, 1)
        assert not registry.enabled
        assert "links go two-sided" in caplog.text
        buffer.close()  # nothing was registered, nothing pins it


def test_get_and_put_are_byte_exact_and_one_sided(prepared: Prepared,
                                                  stream: ascend.Stream) -> None:
    """Rank 0 reads and writes rank 1's memory; rank 1 queues nothing."""
    p, s0 = prepared, stream
    assert p.peer.ask(f"write 0 {2 * MIB} 5") == "ok"
    # (remote offset, local offset, length)
    got = ascend.hccl_batch_get(p.c0, p.b0, np.array([[0, 64, 2 * MIB]], dtype=np.uint64),
                                p.far_address, p.far_size, 1, s0)
    assert got == 1
    s0.synchronize(timeout_ms=10_000)
    assert p.b0.read(64, 2 * MIB) == pattern(2 * MIB, 5)
    p.b0.write(4 * MIB, pattern(MIB, 6))
    # (local offset, remote offset, length)
    ascend.hccl_batch_put(p.c0, p.b0, np.array([[4 * MIB, 3 * MIB, MIB]], dtype=np.uint64),
                          p.far_address, p.far_size, 1, s0)
    s0.synchronize(timeout_ms=10_000)
    assert p.peer.ask(f"check {3 * MIB} {MIB} 6") == "ok"


def test_many_ranges_go_in_calls_of_at_most_256(prepared: Prepared,
                                                stream: ascend.Stream) -> None:
    """1000 scattered 4 KiB blocks: four HcclBatchGet calls, all landing in place."""
    p, s0 = prepared, stream
    assert p.peer.ask(f"write 0 {8 * MIB} 7") == "ok"
    blocks = np.arange(1000, dtype=np.uint64)
    # remote block i -> local block 999 - i, every other 4 KiB left out (no merging)
    triples = np.stack([blocks * 8192, (999 - blocks) * 8192,
                        np.full(1000, 4096, dtype=np.uint64)], axis=1)
    assert ascend.hccl_batch_get(p.c0, p.b0, triples, p.far_address, p.far_size, 1, s0) == 1000
    s0.synchronize(timeout_ms=10_000)
    source = pattern(8 * MIB, 7)
    for i in (0, 1, 255, 256, 511, 999):
        local = (999 - i) * 8192
        assert p.b0.read(local, 4096) == source[i * 8192:i * 8192 + 4096]


def test_contiguous_neighbours_become_one_descriptor(prepared: Prepared,
                                                     stream: ascend.Stream) -> None:
    p, s0 = prepared, stream
    assert p.peer.ask(f"write 0 {MIB} 8") == "ok"
    triples = np.array([[0, 0, 4096], [4096, 4096, 4096], [8192, 8192, 0],
                        [8192, 8192, MIB - 8192]], dtype=np.uint64)
    assert ascend.hccl_batch_get(p.c0, p.b0, triples, p.far_address, p.far_size, 1, s0) == 1
    s0.synchronize(timeout_ms=10_000)
    assert p.b0.read(0, MIB) == pattern(MIB, 8)


def test_ranges_outside_either_memory_are_refused_before_queueing(
        prepared: Prepared, stream: ascend.Stream) -> None:
    p, s0 = prepared, stream
    assert p.b0.pins == 1  # the registration holds it
    for bad in ([[p.far_size - 8, 0, 16]], [[0, p.b0.size - 8, 16]]):
        with pytest.raises(ValueError, match="lies outside"):
            ascend.hccl_batch_get(p.c0, p.b0, np.array(bad, dtype=np.uint64), p.far_address,
                                  p.far_size, 1, s0)
    assert p.b0.pins == 1 and s0.pending == 0


# ---- what the double refuses, as CANN does ----------------------------------------


def test_more_than_256_descriptors_in_one_call_are_refused(double_dir: Path,
                                                          device: ascend.Device) -> None:
    """hccl_one_sided_services.cc: "the count of HcclOneSideOpDesc exceeds
    specification" (256). The shim never passes more, so the double is called
    directly; the count is checked before the communicator is looked at."""

    class Desc(ctypes.Structure):  # HcclOneSideOpDesc
        _fields_ = [("localAddr", ctypes.c_void_p), ("remoteAddr", ctypes.c_void_p),
                    ("count", ctypes.c_uint64), ("dataType", ctypes.c_int)]

    lib = ctypes.CDLL(str(double_dir / "libhccl.so"))
    lib.HcclBatchGet.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(Desc),
                                 ctypes.c_uint32, ctypes.c_void_p]
    lib.HcclBatchGet.restype = ctypes.c_int
    descs = (Desc * 257)(*[Desc(64, 64, 64, 0) for _ in range(257)])
    with device.malloc(4096):  # makes device 0 current on this thread, as HCCL needs
        pass
    not_a_comm = not_a_stream = ctypes.c_void_p(1)
    assert lib.HcclBatchGet(not_a_comm, 1, descs, 257, not_a_stream) == HCCL_E_PARA
    assert lib.HcclBatchGet(not_a_comm, 1, descs, 0, not_a_stream) == 0  # nothing to do


def test_one_sided_lifecycle_follows_hccl(runtime: ascend.AscendRuntime, pair: Pair,
                                          stream: ascend.Stream) -> None:
    """The double's one-sided rules, each from hcomm's source (hccl_double_onesided.c):
    ranges are met when the task runs, not when queued; binding after preparing and a
    second prepare succeed; one registration per range; bound memory can neither be
    deregistered nor have its communicator destroyed."""
    c0, peer = pair
    s0 = stream
    d0 = runtime.set_device(0)
    address, size = map(int, peer.ask("address").split())
    with d0.malloc(MIB) as b0, d0.malloc(MIB) as stray:
        g0 = ascend.GlobalMemory(b0)
        one = np.array([[0, 0, 4096]], dtype=np.uint64)
        try:
            ascend.hccl_bind(c0, g0)
            assert peer.ask("register") == "ok"
            assert peer.ask("bind") == "ok"
            ascend.hccl_batch_get(c0, b0, one, address, size, 1, s0)  # queued: not prepared
            with pytest.raises(ascend.AclError, match="507000"):  # the device task failed
                s0.synchronize(timeout_ms=10_000)
            with pytest.raises(ascend.HcclError):  # bound twice
                ascend.hccl_bind(c0, g0)
            prepare_both(c0, peer)
            ascend.hccl_prepare(c0, 10)  # again: a prepared communicator succeeds at once
            late = ascend.GlobalMemory(stray)
            ascend.hccl_bind(c0, late)  # succeeds; the peer never learns of it
            ascend.hccl_unbind(c0, late)
            late.release()
            with pytest.raises(ascend.HcclError) as deregistered_bound:
                g0.release()  # still bound to c0
            assert deregistered_bound.value.code == HCCL_E_PARA
            assert peer.ask("deregister") == f"error {HCCL_E_PARA}"  # still bound there too
            outside = np.array([[size, 0, 64]], dtype=np.uint64)
            ascend.hccl_batch_get(c0, b0, outside, address, size + 64, 1, s0)
            with pytest.raises(ascend.AclError, match="507000"):  # outside what the peer bound
                s0.synchronize(timeout_ms=10_000)
            ascend.hccl_batch_get(c0, b0, one, address, size, 1, s0)
            s0.synchronize(timeout_ms=10_000)
        finally:
            try:
                ascend.hccl_unbind(c0, g0)
            except ascend.HcclError:
                pass
            g0.release()
            peer.ask("unbind")
            peer.ask("deregister")


def test_registering_a_range_again_answers_its_handle(device: ascend.Device,
                                                      double_dir: Path) -> None:
    """GlobalMemRegMgr::CheckOverlapAndInsert: the very range again gets the record it
    has (no count: one deregistration ends it); an overlapping one is refused."""
    class HcclMem(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("addr", ctypes.c_void_p), ("size", ctypes.c_uint64)]

    acl = ctypes.CDLL(str(double_dir / "libascendcl.so"))
    hccl = ctypes.CDLL(str(double_dir / "libhccl.so"))
    hccl.HcclRegisterGlobalMem.argtypes = [ctypes.POINTER(HcclMem),
                                           ctypes.POINTER(ctypes.c_void_p)]
    hccl.HcclDeregisterGlobalMem.argtypes = [ctypes.c_void_p]
    with device.malloc(MIB) as buf:
        assert acl.aclrtSetDevice(0) == 0
        try:
            first, again, part = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
            whole = HcclMem(0, buf.address, MIB)
            assert hccl.HcclRegisterGlobalMem(ctypes.byref(whole), ctypes.byref(first)) == 0
            assert hccl.HcclRegisterGlobalMem(ctypes.byref(whole), ctypes.byref(again)) == 0
            assert first.value == again.value
            half = HcclMem(0, buf.address + 4096, 4096)
            assert hccl.HcclRegisterGlobalMem(ctypes.byref(half),
                                              ctypes.byref(part)) == HCCL_E_PARA
            assert hccl.HcclDeregisterGlobalMem(first) == 0
            assert hccl.HcclDeregisterGlobalMem(again) == HCCL_E_PARA  # gone already
        finally:
            assert acl.aclrtResetDevice(0) == 0


def test_a_communicator_with_memory_bound_is_not_destroyed(
        runtime: ascend.AscendRuntime, double_dir: Path) -> None:
    """HcclOneSidedService::DeInit refuses while memory is bound: unbind first."""
    d0 = runtime.set_device(0)
    with comm_pair(runtime, double_dir) as (c0, _peer), d0.malloc(MIB) as b0:
        g0 = ascend.GlobalMemory(b0)
        ascend.hccl_bind(c0, g0)
        with pytest.raises(ascend.HcclError) as refused:
            c0.destroy()
        assert refused.value.code == HCCL_E_PARA and "still bound" in str(refused.value)
        assert not c0.closed  # HCCL kept it: unbind, then destroy
        ascend.hccl_unbind(c0, g0)
        g0.release()


def test_two_items_to_one_rank_in_one_batch_are_refused(
        runtime: ascend.AscendRuntime, pair: Pair, stream: ascend.Stream) -> None:
    """CANN 8.0's HcclBatchSendRecv page: no duplicate send (or receive) tasks to one rank."""
    c0, _peer = pair
    s0 = stream
    item = ascend.SendRecvItem
    with runtime.set_device(0).malloc(MIB) as b0:
        for items in ([item.send(b0, 0, 64, 1), item.send(b0, 64, 64, 1)],
                      [item.recv(b0, 0, 64, 1), item.send(b0, 64, 64, 1),
                       item.recv(b0, 128, 64, 1)]):
            with pytest.raises(ascend.HcclError) as refused:
                c0.batch_send_recv(items, s0)
            assert refused.value.code == HCCL_E_PARA
            assert "one per rank and direction" in str(refused.value)
        assert b0.pins == 0


def test_send_ranges_put_one_range_per_call(runtime: ascend.AscendRuntime, pair: Pair,
                                            stream: ascend.Stream) -> None:
    """The two-sided fallback: 300 ranges each way, every call within CANN's rule."""
    c0, peer = pair
    s0 = stream
    with runtime.set_device(0).malloc(4 * MIB) as b0:
        b0.write(0, pattern(4 * MIB, 9))
        pairs = np.array([[i * 8192, 4096] for i in range(300)], dtype=np.uint64)
        c0.send_ranges(b0, pairs, 1, s0)
        # same lengths, other places, in rank 1's buffer
        assert peer.ask(f"ranges recv {pairs[::-1].astype('<u8').tobytes().hex()}") == "ok"
        assert peer.ask("sync 10000") == "ok"
        s0.synchronize(timeout_ms=10_000)
        source = pattern(4 * MIB, 9)
        for i in (0, 1, 299):
            dst = (299 - i) * 8192
            assert bytes.fromhex(peer.ask(f"read {dst} 4096")) == source[i * 8192:i * 8192 + 4096]


# ---- page-locked host memory -------------------------------------------------------


def test_async_copies_of_unpinned_host_memory_are_synchronous(
        device: ascend.Device, double_dir: Path) -> None:
    """CANN copies host memory that is not page-locked synchronously rather than
    refusing it; only aclrtHostRegisterV2 PINNED (what PinnedHost uses) locks it."""
    from tests.cann_double import DoubleControl

    ctl = DoubleControl(double_dir)
    mapping = hixl_native.SharedPool("pin-test", MIB, 12, False)
    with device.malloc(MIB) as buf, device.create_stream() as stream:
        region = ascend.HostRegion(device, mapping, mapping.address, MIB)
        try:
            triples = np.array([[0, 0, 4096]], dtype=np.uint64)
            before = ctl.sync_copies()
            memoryview(mapping)[:4096] = pattern(4096, 2)
            stream.memcpy_ranges(buf, region, triples)
            stream.synchronize(timeout_ms=10_000)
            assert ctl.sync_copies() == before + 1 and buf.read(0, 4096) == pattern(4096, 2)
            with ascend.PinnedHost(device, mapping) as pinned:
                assert pinned.size == mapping.size
                with pytest.raises(ascend.AclError, match="64-byte aligned"):
                    stream.memcpy_ranges(buf, region, np.array([[0, 1, 64]], dtype=np.uint64))
                memoryview(mapping)[:4096] = pattern(4096, 3)
                stream.memcpy_ranges(buf, region, triples)
                stream.synchronize(timeout_ms=10_000)
                assert buf.read(0, 4096) == pattern(4096, 3)
                assert ctl.sync_copies() == before + 1  # pinned: queued, not waited for
        finally:
            region.close()


def test_host_register_v1_maps_without_pinning(device: ascend.Device,
                                               double_dir: Path) -> None:
    """aclrtHostRegister(ACL_HOST_REGISTER_MAPPED) does not page-lock: a copy of such
    memory is still synchronous (the double's rule; what hixl used before issue 30)."""
    from tests.cann_double import DoubleControl

    acl = ctypes.CDLL(str(double_dir / "libascendcl.so"))
    acl.aclrtHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_void_p)]
    acl.aclrtHostUnregister.argtypes = [ctypes.c_void_p]
    acl.aclrtSetDevice.argtypes = [ctypes.c_int32]
    ctl = DoubleControl(double_dir)
    mapping = hixl_native.SharedPool("pin-test-v1", MIB, 12, False)
    with device.malloc(MIB) as buf, device.create_stream() as stream:
        region = ascend.HostRegion(device, mapping, mapping.address, MIB)
        dev_ptr = ctypes.c_void_p()
        assert acl.aclrtSetDevice(0) == 0
        assert acl.aclrtHostRegister(mapping.address, MIB, 0, ctypes.byref(dev_ptr)) == 0
        try:
            before = ctl.sync_copies()
            stream.memcpy_ranges(buf, region, np.array([[0, 0, 4096]], dtype=np.uint64))
            stream.synchronize(timeout_ms=10_000)
            assert ctl.sync_copies() == before + 1
        finally:
            assert acl.aclrtHostUnregister(mapping.address) == 0
            assert acl.aclrtResetDevice(0) == 0
            region.close()


def test_host_registration_needs_whole_pages(device: ascend.Device) -> None:
    pool = hixl_native.SharedPool("pin-test-2", MIB, 12, False)
    view = memoryview(pool)[64:4160]
    with pytest.raises(ValueError, match="4096-byte aligned"):
        ascend.PinnedHost(device, view)
    view.release()
    with ascend.PinnedHost(device, pool), pytest.raises(ascend.AclError):
        ascend.PinnedHost(device, pool)  # registered twice


# ---- the daemon's registry of one-sided memory ------------------------------------


def test_the_registry_binds_a_clusters_memory_and_unbinds_it_when_freed(
        runtime: ascend.AscendRuntime, pair: Pair) -> None:
    from hixl_service.ascend.onesided import OneSidedMemory

    c0, _peer = pair
    d0 = runtime.set_device(0)
    registry = OneSidedMemory(enabled=True)
    with d0.malloc(MIB) as mine, d0.malloc(MIB) as theirs:
        registry.register(mine, 7)
        registry.register(theirs, 8)
        binding = registry.bind(c0, 7)
        assert binding.covers(mine) and not binding.covers(theirs)
        with pytest.raises(BufferError):
            mine.close()  # registered memory cannot be freed
        torn_down: list[bool] = []

        def teardown() -> None:  # what a channel's destroy does: unbind, destroy
            torn_down.append(True)
            registry.unbind(binding)

        binding.teardown = teardown
        registry.release(mine)  # its communicator torn down first, then deregistered
        assert torn_down and not binding.covers(mine)
        registry.release(theirs)
    disabled = OneSidedMemory(enabled=False)
    with d0.malloc(MIB) as plain:
        disabled.register(plain, 7)
        assert not disabled.bind(c0, 7).bound


def test_daemon_copies_refuse_unaligned_ranges_before_queueing(device: ascend.Device) -> None:
    """Blocks of a size that is not a multiple of 64 bytes cannot be copied by ACL
    asynchronously: the daemon says so instead of failing in CANN."""
    from hixl_client.status import LLMException, LLMStatusCode
    from hixl_client.types import Placement
    from hixl_service.ascend.backend import AscendBackend, _check_aligned
    from hixl_service.memory.device import AscendMemory

    runtime = AscendBackend.__new__(AscendBackend)  # only the memories' kind is checked
    with device.malloc(MIB) as a, device.malloc(MIB) as b:
        dst = AscendMemory(1, Placement.DEVICE, a, runtime)
        src = AscendMemory(1, Placement.DEVICE, b, runtime)
        _check_aligned(dst, src, np.array([0, 64, 100, 128, 0, 7], dtype=np.uint64))
        for bad in ([100, 0, 64], [0, 96 + 1, 64]):
            with pytest.raises(LLMException, match="64-byte aligned") as info:
                _check_aligned(dst, src, np.array(bad, dtype=np.uint64))
            assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
