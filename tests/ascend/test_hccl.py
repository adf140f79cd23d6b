"""Two-rank HCCL communicators through the shim against the double: byte-exact
send/recv and batch send/recv, injected failures, bounded waits."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hixl_client.status import LLMStatusCode
from tests.ascend._peer import pattern
from tests.ascend._rank1 import Rank1
from tests.ascend.conftest import MIB, child_env
from tests.cann_double import DoubleControl

if TYPE_CHECKING:
    from hixl_native import _ascend as ascend

    from hixl_service.ascend import errors
else:
    ascend = pytest.importorskip("hixl_native._ascend")
    errors = pytest.importorskip("hixl_service.native_errors")



@contextmanager
def comm_pair(runtime: ascend.AscendRuntime,
              double_dir: Path) -> Iterator[tuple[ascend.HcclComm, Rank1]]:
    """Rank 0 on device 0 (here) and rank 1 on device 1 (a child process: the
    shim creates one communicator at a time per process, as CANN asks)."""
    d0 = runtime.set_device(0)
    root = d0.hccl_root_info()
    assert len(root) == ascend.HCCL_ROOT_INFO_BYTES
    with Rank1(double_dir, root_info=root) as peer:
        c0 = ascend.HcclComm(d0, root, 2, 0)
        try:
            peer.wait_ready()
            with d0.create_stream() as stream:
                peer.link_up(c0, stream)
            yield c0, peer
        finally:
            c0.destroy()


@pytest.fixture
def pair(runtime: ascend.AscendRuntime,
         double_dir: Path) -> Iterator[tuple[ascend.HcclComm, Rank1]]:
    with comm_pair(runtime, double_dir) as comms:
        yield comms


@pytest.fixture
def streams(runtime: ascend.AscendRuntime) -> Iterator[tuple[ascend.Stream, ascend.Stream]]:
    s0, s1 = runtime.set_device(0).create_stream(), runtime.set_device(1).create_stream()
    yield s0, s1
    s0.destroy()
    s1.destroy()


def test_send_recv_byte_exact(runtime: ascend.AscendRuntime,
                              pair: tuple[ascend.HcclComm, Rank1],
                              streams: tuple[ascend.Stream, ...]) -> None:
    c0, peer = pair
    s0, _ = streams
    assert (c0.rank, c0.nranks) == (0, 2)
    n = 3 * MIB + 5
    with runtime.set_device(0).malloc(4 * MIB) as b0:
        b0.write(0, pattern(n, 1))
        c0.send(b0, 0, n, 1, s0)
        assert peer.ask(f"recv 11 {n}") == "ok"
        assert b0.pins == 1
        s0.synchronize(timeout_ms=10_000)
        assert peer.ask("sync 10000") == "ok"
        assert peer.ask(f"check 11 {n} 1") == "ok"
        # and back, queued on the same streams
        assert peer.ask("send 11 1000") == "ok"
        c0.recv(b0, 0, 1000, 1, s0)
        assert peer.ask("send 0 0") == "ok"  # an empty message
        c0.recv(b0, 0, 0, 1, s0)
        s0.synchronize(timeout_ms=10_000)
        assert peer.ask("sync 10000") == "ok"
        assert b0.read(0, 1000) == pattern(1000, 1)


def test_batch_send_recv_byte_exact(runtime: ascend.AscendRuntime,
                                    pair: tuple[ascend.HcclComm, Rank1],
                                    streams: tuple[ascend.Stream, ...]) -> None:
    """Both ranks send 4 MiB at once: only a batch (sends and receives
    progressing together) completes that without deadlock. One send and one
    receive per peer in a call: what CANN allows (test_onesided shows the double
    refusing more)."""
    c0, peer = pair
    s0, _ = streams
    item = ascend.SendRecvItem
    with runtime.set_device(0).malloc(8 * MIB) as b0:
        b0.write(0, pattern(4 * MIB, 2))
        assert peer.ask(f"write {4 * MIB} {4 * MIB} 3") == "ok"
        c0.batch_send_recv([item.send(b0, 0, 4 * MIB, 1), item.recv(b0, 4 * MIB, 4 * MIB, 1)],
                           s0)
        assert peer.ask(f"batch r:0:{4 * MIB} s:{4 * MIB}:{4 * MIB}") == "ok"
        s0.synchronize(timeout_ms=10_000)
        assert peer.ask("sync 10000") == "ok"
        assert peer.ask(f"check 0 {4 * MIB} 2") == "ok"
        assert b0.read(4 * MIB, 4 * MIB) == pattern(4 * MIB, 3)
        assert repr(item.recv(b0, 0, 1, 0)).startswith("SendRecvItem(RECV")


def test_injected_error_mid_transfer(runtime: ascend.AscendRuntime, double: DoubleControl,
                                     pair: tuple[ascend.HcclComm, Rank1],
                                     streams: tuple[ascend.Stream, ...]) -> None:
    c0, peer = pair
    s0, _ = streams
    with runtime.set_device(0).malloc(4 * MIB) as b0:
        double.sever("exec:HcclSend", 507056)  # ACL_ERROR_RT_LINK_ERROR
        c0.send(b0, 0, 4 * MIB, 1, s0)
        assert peer.ask(f"recv 0 {4 * MIB}") == "ok"
        with pytest.raises(ascend.AclError) as sent:
            s0.synchronize(timeout_ms=10_000)
        # the peer vanished mid-message
        assert peer.ask("sync 10000") == "error 507057"
        assert sent.value.code == 507056
        assert errors.to_llm_exception(sent.value).status_code == LLMStatusCode.LLM_LINK_FAILED
        received = ascend.AclError(507057, "aclrtSynchronizeStreamWithTimeout")
        exc = errors.to_llm_exception(received, "pull")
        assert exc.status_code == LLMStatusCode.LLM_SUSPECT_REMOTE_ERROR
        assert "pull: aclrtSynchronizeStreamWithTimeout failed with ACL error 507057 " \
               "(ACL_ERROR_RT_SUSPECT_REMOTE_ERROR)" in str(exc)
        assert b0.pins == 0


def test_injected_hccl_call_error(runtime: ascend.AscendRuntime, double: DoubleControl,
                                  pair: tuple[ascend.HcclComm, Rank1],
                                  streams: tuple[ascend.Stream, ...]) -> None:
    c0, _ = pair
    s0, _ = streams
    with runtime.set_device(0).malloc(1) as b0:
        double.fail("HcclSend", 21)  # HCCL_E_REMOTE
        with pytest.raises(ascend.HcclError) as caught:
            c0.send(b0, 0, 10, 1, s0)
        assert (caught.value.code, caught.value.api) == (21, "HcclSend")
        assert "error cqe" in caught.value.detail  # HcclGetErrorString
        exc = errors.to_llm_exception(caught.value)
        assert exc.status_code == LLMStatusCode.LLM_SUSPECT_REMOTE_ERROR
        assert "HCCL error 21 (HCCL_E_REMOTE): error cqe" in str(exc)
        assert b0.pins == 0 and s0.pending == 0
        double.fail("HcclBatchSendRecv", 9)
        with pytest.raises(ascend.HcclError) as batch:
            c0.batch_send_recv([ascend.SendRecvItem.send(b0, 0, 1, 1)], s0)
        assert errors.to_llm_exception(batch.value).status_code == LLMStatusCode.LLM_TIMEOUT


@pytest.mark.parametrize("side", ["send", "recv"])
def test_peer_that_never_posts_times_out(runtime: ascend.AscendRuntime, side: str,
                                         pair: tuple[ascend.HcclComm, Rank1],
                                         streams: tuple[ascend.Stream, ...]) -> None:
    c0, _ = pair
    s0, _ = streams
    with runtime.set_device(0).malloc(1) as b0:
        if side == "send":
            c0.send(b0, 0, 1000, 1, s0)
        else:
            c0.recv(b0, 0, 1000, 1, s0)
        start = time.monotonic()
        with pytest.raises(ascend.AclError) as caught:
            s0.synchronize(timeout_ms=300)
        elapsed = time.monotonic() - start
        assert 0.25 <= elapsed < 3, elapsed
        assert caught.value.code == 507046
        assert errors.to_llm_exception(caught.value).status_code == LLMStatusCode.LLM_TIMEOUT
        # still queued: the memory stays pinned until the work is gone
        assert b0.pins == 1
        with pytest.raises(BufferError):
            b0.close()
        c0.destroy()  # aborts the queued operation
        with pytest.raises(ascend.AclError) as aborted:
            s0.synchronize(timeout_ms=5000)
        assert aborted.value.code == 107023
        assert b0.pins == 0


def test_comm_init_times_out_without_peer(runtime: ascend.AscendRuntime,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIXL_DOUBLE_CONNECT_TIMEOUT_MS", "300")
    dev = runtime.set_device(0)
    start = time.monotonic()
    with pytest.raises(ascend.HcclError) as caught:
        ascend.HcclComm(dev, dev.hccl_root_info(), 2, 0)
    assert 0.25 <= time.monotonic() - start < 3
    # HcclCommInitRootInfoConfig where CANN has it (it carries the buffer size)
    assert caught.value.code == 9
    assert caught.value.api in ("HcclCommInitRootInfo", "HcclCommInitRootInfoConfig")
    assert errors.to_llm_exception(caught.value).status_code == LLMStatusCode.LLM_TIMEOUT


def test_mismatched_sizes_fail_both_sides(runtime: ascend.AscendRuntime,
                                          pair: tuple[ascend.HcclComm, Rank1],
                                          streams: tuple[ascend.Stream, ...]) -> None:
    c0, peer = pair
    s0, _ = streams
    with runtime.set_device(0).malloc(1) as b0:
        c0.send(b0, 0, 100, 1, s0)
        assert peer.ask("recv 0 200") == "ok"
        assert peer.ask("sync 5000").startswith("error ")
        with pytest.raises(ascend.AclError):
            s0.synchronize(timeout_ms=5000)


def test_argument_checks(runtime: ascend.AscendRuntime, pair: tuple[ascend.HcclComm, Rank1],
                         streams: tuple[ascend.Stream, ...]) -> None:
    c0, _ = pair
    s0, s1 = streams
    dev0 = runtime.set_device(0)
    with dev0.malloc(1) as b0, runtime.set_device(1).malloc(1) as b1:
        with pytest.raises(ValueError, match="this rank"):
            c0.send(b0, 0, 1, 0, s0)
        with pytest.raises(ValueError):
            c0.send(b0, 0, 1, 2, s0)
        with pytest.raises(ValueError, match="device"):
            c0.send(b0, 0, 1, 1, s1)
        with pytest.raises(ValueError, match="device"):
            c0.send(b1, 0, 1, 1, s0)
        with pytest.raises(ValueError):
            c0.recv(b0, b0.size, 1, 1, s0)
        with pytest.raises(TypeError):
            c0.batch_send_recv([object()], s0)  # type: ignore[list-item]
        with pytest.raises(ValueError):
            c0.batch_send_recv([], s0)
        with pytest.raises(ValueError, match="root_info"):
            ascend.HcclComm(dev0, b"short", 2, 0)
        with pytest.raises(ValueError):
            ascend.HcclComm(dev0, bytes(ascend.HCCL_ROOT_INFO_BYTES), 2, 2)
        with pytest.raises(ascend.HcclError) as caught:  # HCCL's own check
            ascend.HcclComm(dev0, bytes(ascend.HCCL_ROOT_INFO_BYTES), 2, 0)
        assert caught.value.code == 1
    assert s0.pending == 0


def test_rank_in_another_process(runtime: ascend.AscendRuntime, double_dir: Path,
                                 streams: tuple[ascend.Stream, ...]) -> None:
    dev = runtime.set_device(0)
    s0, _ = streams
    root = dev.hccl_root_info()
    n = MIB + 3
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.ascend._peer", "hccl", str(double_dir), root.hex(), str(n)],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        with dev.malloc(n) as buf, ascend.HcclComm(dev, root, 2, 0) as comm:
            buf.write(0, pattern(n, 9))
            comm.send(buf, 0, n, 1, s0)
            comm.recv(buf, 0, n, 1, s0)
            s0.synchronize(timeout_ms=20_000)
            assert buf.read(0, n) == bytes((b + 1) & 0xFF for b in pattern(n, 9))
    finally:
        out, err = child.communicate(timeout=20)
    assert out.strip() == "done", err


def test_hung_receive_is_bounded_and_aborted(runtime: ascend.AscendRuntime,
                                             double: DoubleControl,
                                             pair: tuple[ascend.HcclComm, Rank1],
                                             streams: tuple[ascend.Stream, ...]) -> None:
    """An injected hang of the receiving task: neither side completes, both
    synchronize calls return within their bound, destroying the
    communicator ends the stuck work."""
    c0, peer = pair
    s0, _ = streams
    with runtime.set_device(0).malloc(1) as b0:
        double.hang("exec:HcclRecv")
        assert peer.ask("send 0 64") == "ok"
        c0.recv(b0, 0, 64, 1, s0)
        with pytest.raises(ascend.AclError) as caught:
            s0.synchronize(timeout_ms=200)
        assert caught.value.code == 507046
        assert peer.ask("sync 200") == "error 507046"
        c0.destroy()
        with pytest.raises(ascend.AclError) as aborted:
            s0.synchronize(timeout_ms=5000)
        assert aborted.value.code == 107023
        assert peer.ask("sync 5000").startswith("error ")  # its peer went away
