"""Planned transfers through the shim against the double: byte ranges as uint64
arrays, copied by `Stream.memcpy_ranges` (device memory and `HostRegion`s over
a real `hixl_native.Mapping`) and moved between two ranks by
`HcclComm.send_ranges` / `recv_ranges`; every range checked before anything is
queued, failures, pins, the GIL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pytest

from tests.ascend._peer import pattern
from tests.ascend._rank1 import Rank1
from tests.ascend.conftest import MIB
from tests.ascend.test_gil import progress_during
from tests.ascend.test_hccl import comm_pair
from tests.cann_double import DoubleControl

if TYPE_CHECKING:
    from hixl_native import Mapping
    from hixl_native import _ascend as ascend
else:
    ascend = pytest.importorskip("hixl_native._ascend")
    Mapping = pytest.importorskip("hixl_native").Mapping

Ranks = tuple[tuple["ascend.HcclComm", Rank1], tuple["ascend.Stream", "ascend.Stream"]]


def ranges(*rows: tuple[int, ...]) -> npt.NDArray[np.uint64]:
    return np.array(rows, dtype=np.uint64)


def apply(triples: npt.NDArray[np.uint64], dst: bytes, src: bytes) -> bytes:
    """What copying the triples, in order, makes of ``dst``."""
    out = bytearray(dst)
    for d, s, n in triples.tolist():
        out[d:d + n] = src[s:s + n]
    return bytes(out)


@pytest.fixture
def mapping() -> Iterator[Mapping]:
    """4 MiB of a memfd, mapped as the daemon maps its pools."""
    fd = os.memfd_create("hixl-test-ranges")
    try:
        os.ftruncate(fd, 4 * MIB)
        m = Mapping(fd, 4 * MIB)
    finally:
        os.close(fd)
    yield m
    m.close()


@pytest.fixture
def ranks(runtime: ascend.AscendRuntime, double_dir: Path) -> Iterator[Ranks]:
    """Rank 0 on device 0 here and rank 1 on device 1 in a child process; a
    stream on each device here."""
    with comm_pair(runtime, double_dir) as comms, runtime.set_device(0).create_stream() as s0, \
            runtime.set_device(1).create_stream() as s1:
        yield comms, (s0, s1)


def hexed(pairs: npt.NDArray[np.uint64]) -> str:
    return np.ascontiguousarray(pairs, dtype="<u8").tobytes().hex()


# ------------------------------------------------------------ memcpy_ranges

def test_device_ranges_are_byte_exact(device: ascend.Device) -> None:
    data = pattern(MIB, 5)
    # every address 64-byte aligned: CANN's rule for aclrtMemcpyAsync, which the double enforces
    triples = ranges((0, 128, 1000), (70_016, 0, 1), (5056, 64, 0), (MIB - 64, MIB - 64, 10),
                     (2048, 300_032, 65_536), (2048, 0, 16))  # the last overwrites the fifth
    with device.create_stream() as s, device.malloc(MIB) as src, device.malloc(MIB) as dst:
        src.write(0, data)
        dst.write(0, bytes(MIB))
        s.memcpy_ranges(dst, src, triples)
        assert (dst.pins, src.pins, s.pending) == (1, 1, 2)  # pinned once for all ranges
        s.synchronize(timeout_ms=5000)
        assert dst.pins == src.pins == 0
        assert dst.read(0, MIB) == apply(triples, bytes(MIB), data)


def test_many_ranges_in_one_call(device: ascend.Device) -> None:
    """A few thousand ranges: a transfer plan, gathered in reverse order."""
    count, size = 4000, 192
    data = pattern(count * size, 11)
    at = np.arange(count, dtype=np.uint64) * size
    triples = np.ascontiguousarray(np.stack([at[::-1], at, np.full(count, size, np.uint64)], 1))
    with device.create_stream() as s, device.malloc(len(data)) as src, \
            device.malloc(len(data)) as dst:
        src.write(0, data)
        s.memcpy_ranges(dst, src, triples)
        s.synchronize(timeout_ms=10_000)
        out = np.frombuffer(dst.read(0, len(data)), np.uint8).reshape(count, size)
        assert out[::-1].tobytes() == data


def test_host_region_copies_through_a_mapping(device: ascend.Device, mapping: Mapping) -> None:
    data = pattern(MIB, 7)
    before = ascend.live_objects()["host_regions"]
    with memoryview(mapping) as view:
        view[:MIB] = data
    # page-locked, as the daemon locks its host pools: CANN's async copies need it
    with ascend.PinnedHost(device, mapping), device.create_stream() as s, \
            device.malloc(MIB) as dbuf, \
            ascend.HostRegion(device, mapping, mapping.address, MIB) as low, \
            ascend.HostRegion(device, mapping, mapping.address + 2 * MIB, MIB) as high:
        assert (low.size, low.address, low.device) == (MIB, mapping.address, device)
        assert ascend.live_objects()["host_regions"] == before + 2
        assert mapping.exports == 3
        with pytest.raises(BufferError):
            mapping.close()  # the regions keep it mapped
        s.memcpy_ranges(dbuf, low, ranges((0, 0, MIB // 2), (MIB // 2, MIB // 2, MIB // 2)))
        s.memcpy_ranges(high, dbuf, ranges((64, 0, MIB - 64), (0, 192, 4)))
        assert (low.pins, high.pins, dbuf.pins) == (1, 1, 2)
        s.synchronize(timeout_ms=5000)
        assert dbuf.read(0, MIB) == data
        # a HostRegion is a copy operand like a HostBuffer elsewhere too
        ascend.memcpy(low, 0, dbuf, 100, 5)
        s.memcpy_async(dbuf, 0, high, 64, 16)
        s.synchronize(timeout_ms=5000)
        assert dbuf.read(0, 16) == data[:16]
    assert low.closed and high.closed
    assert mapping.exports == 0
    assert ascend.live_objects()["host_regions"] == before
    with memoryview(mapping) as view:
        assert bytes(view[:5]) == data[100:105]
        assert bytes(view[2 * MIB:2 * MIB + 4]) == data[192:196]
        assert bytes(view[2 * MIB + 64:3 * MIB]) == data[:MIB - 64]


def test_host_region_checks_and_lifetime(device: ascend.Device, double: DoubleControl,
                                         mapping: Mapping) -> None:
    end = mapping.address + mapping.size
    with pytest.raises(ValueError, match="not inside"):
        ascend.HostRegion(device, mapping, end - 1, 2)
    with pytest.raises(ValueError, match="not inside"):
        ascend.HostRegion(device, mapping, mapping.address - 1, 1)
    with pytest.raises(ValueError):
        ascend.HostRegion(device, mapping, mapping.address, 0)
    with pytest.raises(TypeError):
        ascend.HostRegion(device, object(), 1, 1)  # type: ignore[arg-type]
    with pytest.raises(BufferError):
        ascend.HostRegion(device, b"read-only", 1, 1)
    assert mapping.exports == 0  # failed constructions keep no export

    region = ascend.HostRegion(device, mapping, end - 4096, 4096)
    with pytest.raises(RuntimeError, match="initialized"):
        region.__init__(device, mapping, end - 4096, 4096)  # type: ignore[misc]
    with ascend.PinnedHost(device, mapping), device.create_stream() as s, \
            device.malloc(1) as dbuf:
        double.delay("exec:aclrtMemcpyAsync", 200)
        s.memcpy_ranges(dbuf, region, ranges((0, 0, 4096)))
        with pytest.raises(BufferError):
            region.close()  # a queued copy uses it
        s.synchronize(timeout_ms=5000)
    region.close()
    region.close()  # idempotent
    assert mapping.exports == 0
    with device.create_stream() as s, device.malloc(1) as dbuf:
        with pytest.raises(ValueError, match="closed"):
            s.memcpy_ranges(dbuf, region, ranges((0, 0, 1)))
    ascend.HostRegion(device, mapping, mapping.address, 1)  # dropped at once
    assert mapping.exports == 0


def test_ranges_are_checked_before_anything_is_queued(device: ascend.Device,
                                                      double: DoubleControl) -> None:
    # Armed for the first copy the double sees: it must still be armed after
    # the refused calls.
    double.fail("aclrtMemcpyAsync", 507000)
    with device.create_stream() as s, device.malloc(1) as a, device.malloc(1) as b:
        size = a.size
        outside = [
            ranges((0, 0, 10), (size - 5, 0, 6)),  # the last range, past dst
            ranges((0, 0, 10), (0, size, 1)),  # past src
            ranges((0, 0, 10), (2**64 - 1, 0, 2)),  # an end that wraps around
            ranges((0, 0, 10), (1, 1, 2**64 - 1)),
            ranges((size + 1, 0, 0)),  # empty, but starting past the end
        ]
        for triples in outside:
            with pytest.raises(ValueError, match="outside"):
                s.memcpy_ranges(a, b, triples)
        with pytest.raises(ValueError, match="whole 3-tuples"):
            s.memcpy_ranges(a, b, np.zeros(4, np.uint64))
        for wrong in (np.zeros(3, np.int64), np.zeros(3, np.float64), bytes(24), [0, 0, 1],
                      np.zeros(3, np.uint32)):
            with pytest.raises(TypeError):
                s.memcpy_ranges(a, b, wrong)
        with pytest.raises(ValueError, match="contiguous"):
            s.memcpy_ranges(a, b, np.zeros((3, 6), np.uint64)[:, ::2])
        s.memcpy_ranges(a, b, np.zeros((0, 3), np.uint64))  # nothing to do
        s.memcpy_ranges(a, b, ranges((0, 0, 0), (5, 5, 0)))
        assert s.pending == 0 and a.pins == b.pins == 0
        with pytest.raises(ascend.AclError) as caught:
            s.memcpy_ranges(a, b, ranges((0, 0, 1)))
        assert (caught.value.code, caught.value.api) == (507000, "aclrtMemcpyAsync")
        assert s.pending == 0 and a.pins == b.pins == 0


def test_devices_must_agree(runtime: ascend.AscendRuntime) -> None:
    d0, d1 = runtime.set_device(0), runtime.set_device(1)
    with d0.create_stream() as s0, d0.malloc(1) as a, d1.malloc(1) as b:
        with pytest.raises(ValueError, match="one device"):
            s0.memcpy_ranges(a, b, ranges((0, 0, 1)))
        with pytest.raises(ValueError, match="stream belongs"):
            s0.memcpy_ranges(b, b, ranges((0, 0, 1)))
        assert s0.pending == 0


def test_host_to_host_is_refused_by_cann(device: ascend.Device, mapping: Mapping) -> None:
    with device.create_stream() as s, \
            ascend.HostRegion(device, mapping, mapping.address, MIB) as a, \
            ascend.HostRegion(device, mapping, mapping.address + MIB, MIB) as b:
        with pytest.raises(ascend.AclError) as caught:
            s.memcpy_ranges(a, b, ranges((0, 0, 1)))
        assert caught.value.code == 207000  # ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        assert s.pending == 0 and a.pins == b.pins == 0


def test_a_refused_copy_leaves_the_earlier_ones_queued(device: ascend.Device,
                                                      double: DoubleControl) -> None:
    data = pattern(512, 3)
    triples = ranges((0, 0, 128), (128, 128, 128), (256, 256, 128), (384, 384, 128))
    with device.create_stream() as s, device.malloc(1) as a, device.malloc(1) as b:
        a.write(0, bytes(512))
        b.write(0, data)
        double.fail("aclrtMemcpyAsync", 207001, skip=2)
        with pytest.raises(ascend.AclError) as caught:
            s.memcpy_ranges(a, b, triples)
        assert caught.value.code == 207001
        assert a.pins == b.pins == 1  # the two queued copies still use them
        s.synchronize(timeout_ms=5000)
        assert a.pins == b.pins == 0
        assert a.read(0, 512) == data[:256] + bytes(256)


def test_a_failed_copy_task_surfaces_at_synchronize(device: ascend.Device,
                                                    double: DoubleControl) -> None:
    with device.create_stream() as s, device.malloc(1) as a, device.malloc(1) as b:
        double.fail("exec:aclrtMemcpyAsync", 507053, skip=1)
        s.memcpy_ranges(a, b, ranges((0, 0, 8), (64, 64, 8), (128, 128, 8)))
        with pytest.raises(ascend.AclError) as caught:
            s.synchronize(timeout_ms=5000)
        assert caught.value.code == 507053
        assert a.pins == b.pins == 0


def test_gil_released_while_queueing(device: ascend.Device, double: DoubleControl) -> None:
    with device.create_stream() as s, device.malloc(1) as a, device.malloc(1) as b:
        double.delay("aclrtMemcpyAsync", 300)
        calibration, during, elapsed = progress_during(
            lambda: s.memcpy_ranges(a, b, ranges((0, 0, 8), (64, 64, 8))))
        s.synchronize(timeout_ms=5000)
    assert elapsed >= 0.25
    assert during > calibration, (calibration, during)


# ------------------------------------------------------ send/recv_ranges

def test_send_and_recv_ranges_are_byte_exact(runtime: ascend.AscendRuntime,
                                             ranks: Ranks) -> None:
    """300 ranges each way, laid out differently on the two sides."""
    (c0, peer), (s0, _) = ranks
    count = 300
    lengths = (np.arange(count, dtype=np.uint64) % 17 + 1) * 61
    sent_at = np.cumsum(lengths + 3) - (lengths + 3)  # packed with 3-byte gaps
    received_at = (np.cumsum(lengths[::-1]) - lengths[::-1])[::-1]  # packed, last first
    sends = np.ascontiguousarray(np.stack([sent_at, lengths], 1))
    recvs = np.ascontiguousarray(np.stack([received_at, lengths], 1))
    # a pair of length 0 is skipped, so the two lists need not agree on it
    sends = np.concatenate([ranges((5, 0)), sends])
    data = pattern(2 * MIB, 4)
    with runtime.set_device(0).malloc(2 * MIB) as b0:
        b0.write(0, data)
        c0.send_ranges(b0, sends, 1, s0)
        assert peer.ask(f"ranges recv {hexed(recvs)}") == "ok"
        # and back, queued behind on the same streams, packed from 1 MiB
        assert peer.ask(f"ranges send {hexed(recvs)}") == "ok"
        packed = np.cumsum(lengths) - lengths + np.uint64(MIB)
        c0.recv_ranges(b0, np.ascontiguousarray(np.stack([packed, lengths], 1)), 1, s0)
        assert (b0.pins, s0.pending) == (2, 2)
        s0.synchronize(timeout_ms=10_000)
        assert peer.ask("sync 10000") == "ok"
        assert b0.pins == 0
        got = bytes.fromhex(peer.ask(f"read 0 {2 * MIB}"))
        for at, src, n in zip(received_at.tolist(), sent_at.tolist(), lengths.tolist(),
                               strict=True):
            assert got[at:at + n] == data[src:src + n]
        back = b"".join(got[at:at + n]
                        for at, n in zip(received_at.tolist(), lengths.tolist(), strict=True))
        assert b0.read(MIB, len(back)) == back


def test_ranges_argument_checks(runtime: ascend.AscendRuntime, double: DoubleControl,
                                ranks: Ranks, mapping: Mapping) -> None:
    (c0, _), (s0, s1) = ranks
    dev0 = runtime.set_device(0)
    # Armed for the first batch HCCL sees: it must still be armed after the refused calls.
    double.fail("HcclBatchSendRecv", 4)
    with dev0.malloc(1) as b0, dev0.malloc_host(64) as host, \
            ascend.HostRegion(dev0, mapping, mapping.address, 64) as region:
        one = ranges((0, 1))
        for not_device in (host, region):
            with pytest.raises(TypeError):
                c0.send_ranges(not_device, one, 1, s0)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                c0.recv_ranges(not_device, one, 1, s0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="empty"):
            c0.send_ranges(b0, np.zeros((0, 2), np.uint64), 1, s0)
        with pytest.raises(ValueError, match="whole 2-tuples"):
            c0.send_ranges(b0, np.zeros(3, np.uint64), 1, s0)
        with pytest.raises(TypeError):
            c0.send_ranges(b0, np.zeros(2, np.int64), 1, s0)
        with pytest.raises(ValueError, match="outside"):
            c0.recv_ranges(b0, ranges((0, 1), (b0.size, 1)), 1, s0)
        with pytest.raises(ValueError, match="outside"):
            c0.send_ranges(b0, ranges((1, 2**64 - 1)), 1, s0)
        with pytest.raises(ValueError, match="this rank"):
            c0.send_ranges(b0, one, 0, s0)
        with pytest.raises(ValueError):
            c0.send_ranges(b0, one, 2, s0)
        with pytest.raises(ValueError, match="device"):
            c0.send_ranges(b0, one, 1, s1)
        c0.send_ranges(b0, ranges((0, 0), (7, 0)), 1, s0)  # all empty: nothing queued
        assert s0.pending == 0 and b0.pins == 0
        with pytest.raises(ascend.HcclError) as caught:
            c0.send_ranges(b0, one, 1, s0)
        assert (caught.value.code, caught.value.api) == (4, "HcclBatchSendRecv")
        assert isinstance(caught.value, ascend.AscendError)
        assert s0.pending == 0 and b0.pins == 0


def test_a_batch_failing_mid_transfer(runtime: ascend.AscendRuntime, double: DoubleControl,
                                      ranks: Ranks) -> None:
    """The link drops while the batch runs: both sides' synchronize fail (the
    peer receives with a plain recv, so that only the batch meets the fault)."""
    (c0, peer), (s0, _) = ranks
    with runtime.set_device(0).malloc(MIB) as b0:
        double.sever("exec:HcclBatchSendRecv", 507056)  # ACL_ERROR_RT_LINK_ERROR
        c0.send_ranges(b0, ranges((0, MIB)), 1, s0)
        assert peer.ask(f"recv 0 {MIB}") == "ok"
        with pytest.raises(ascend.AclError) as sent:
            s0.synchronize(timeout_ms=10_000)
        assert sent.value.code == 507056
        assert peer.ask("sync 10000") == "error 507057"  # the peer vanished mid-message
        assert b0.pins == 0


def test_gil_released_while_batching(runtime: ascend.AscendRuntime, double: DoubleControl,
                                     ranks: Ranks) -> None:
    (c0, peer), (s0, _) = ranks
    with runtime.set_device(0).malloc(1) as b0:
        double.delay("HcclBatchSendRecv", 300)
        calibration, during, elapsed = progress_during(
            lambda: c0.send_ranges(b0, ranges((0, 8), (8, 8)), 1, s0))
        assert peer.ask(f"ranges recv {hexed(ranges((0, 8), (8, 8)))}") == "ok"
        s0.synchronize(timeout_ms=10_000)
        assert peer.ask("sync 10000") == "ok"
    assert elapsed >= 0.25
    assert during > calibration, (calibration, during)
