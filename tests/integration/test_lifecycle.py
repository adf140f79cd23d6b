"""The daemon's lifecycle with real daemons and signals (issue 21, point 6).

A stop (SIGTERM, SIGINT or Admin/Drain) drains: new sessions, links and
transfers are refused with a clear status, what is in flight (a layer-wise
task included) gets ``server.grace_period_s`` to end, the sessions end with
their links closed and the peers told, systemd hears STOPPING=1, and the
process exits 0 with its sockets removed. A refused start exits 2 before it
creates anything.

A layer-wise task whose synchronizer holds a layer (``HoldAt``) is the work
in flight: it keeps the drain open for as long as the test needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc.aio
import numpy as np
import pytest

from hixl_client import (
    Cache,
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    TransferWithCacheKeyConfig,
)
from hixl_service.testing import DaemonProcess, start_daemon
from hixl_wire._proto.hixl.v1 import admin_pb2, admin_pb2_grpc
from tests.clusters import cluster_info

from .conftest import Pair, daemon_status, make_pair, options
from .test_layerwise import HoldAt, fill, raw

pytestmark = pytest.mark.asyncio

OK = LLMStatusCode.LLM_SUCCESS
DESC = CacheDesc(8, [1, 64 * 1024], DataType.DT_UINT8)  # 4 layers of 2 tensors
GRACE_S = 60  # generous: the tests end the work in flight themselves
WAIT_S = 30   # the bound of every wait for a daemon's exit, a task or a datagram


@contextlib.contextmanager
def _notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """An abstract datagram socket to stand in for systemd's, and its NOTIFY_SOCKET value."""
    name = f"hixl-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.setblocking(False)
        yield sock, "@" + name


async def _until_notified(sock: socket.socket, assignment: str) -> list[str]:
    """The datagrams received up to and including the first that holds ``assignment``."""
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def receive() -> list[str]:
        while True:
            message = (await loop.sock_recv(sock, 4096)).decode()
            seen.append(message)
            if assignment in message.split("\n"):
                return seen

    return await asyncio.wait_for(receive(), WAIT_S)


@contextlib.asynccontextmanager
async def _sender_and_receiver(next_cluster_id: Callable[[], int], **sender_daemon: object
                               ) -> AsyncIterator[tuple[DaemonProcess, DaemonProcess, Pair]]:
    """The sender's daemon (the one the tests stop) and the receiver's; ``pair.decoder``
    sends layer-wise into ``pair.prompt`` (remote-accessible)."""
    async with start_daemon(pool__max_bytes="512MiB", server__grace_period_s=GRACE_S,
                            **sender_daemon) as sender_side, \
            start_daemon(pool__max_bytes="512MiB") as receiver_side:
        pair = await make_pair(receiver_side, sender_side, next_cluster_id,
                               remote_accessible=True)
        yield sender_side, receiver_side, pair
        await pair.prompt.finalize()
        await pair.decoder.finalize()  # its daemon is gone: logs and returns


async def _held_task(pair: Pair, hold_at: int = 2) -> tuple[asyncio.Future[list[object]],
                                                           HoldAt, Cache, Cache]:
    """A layer-wise task from the sender into the receiver, held at layer ``hold_at``."""
    src = await pair.decoder.cache_manager.allocate_cache(DESC)
    fill(src)
    dst = await pair.prompt.cache_manager.allocate_cache(DESC)
    sync = HoldAt(hold_at)
    config = TransferWithCacheKeyConfig(
        CacheKeyByIdAndIndex(pair.prompt.cluster_id, dst.cache_id, 0), range(4), range(4))
    task = pair.decoder.cache_manager.transfer_cache_async(src, sync, [config])
    await sync.wait_reached()
    return asyncio.ensure_future(task.get_results()), sync, src, dst


async def _stop(daemon: DaemonProcess) -> asyncio.Future[int | None]:
    """SIGTERM ``daemon`` and wait for its exit in a thread: the exit code's future."""
    return asyncio.ensure_future(asyncio.to_thread(daemon.stop, WAIT_S))


def _sockets(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_socket())


async def _no_inbound_links(daemon: DaemonProcess) -> bool:
    for _ in range(200):  # bounded: the sender's Unlink reaches it shortly
        status = await daemon_status(daemon.client_target)
        if not [link for link in status.links if link.direction == "inbound"]:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_sigterm_lets_a_layerwise_task_finish_then_exits_0(
        next_cluster_id: Callable[[], int]) -> None:
    with _notify_socket() as (notify, notify_name):
        async with _sender_and_receiver(next_cluster_id, env={"NOTIFY_SOCKET": notify_name}) \
                as (sender_side, receiver_side, pair):
            await _until_notified(notify, "READY=1")
            results, sync, src, dst = await _held_task(pair)
            try:
                exited = await _stop(sender_side)
                await _until_notified(notify, "STOPPING=1")
                assert not exited.done()  # it waits for the task
            finally:
                sync.release.set()
            assert await asyncio.wait_for(results, WAIT_S) == [OK]
            for tensor in range(DESC.num_tensors):
                np.testing.assert_array_equal(raw(dst, tensor), raw(src, tensor))
            assert await exited == 0, sender_side.log_tail()
            assert _sockets(sender_side.tmpdir) == []
            assert not (sender_side.tmpdir / "ready.json").exists()
            log = sender_side.log_tail()
            assert "draining" in log and "stopped" in log
            # The sender's link was closed with the receiver told.
            assert await _no_inbound_links(receiver_side)


async def test_a_drain_refuses_new_work_with_a_clear_status(
        next_cluster_id: Callable[[], int]) -> None:
    async with _sender_and_receiver(next_cluster_id) as (sender_side, receiver_side, pair):
        # A second cluster of the sender's daemon, attached before the drain.
        other = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                            daemon=sender_side.client_target)
        await other.init(options())
        other_cache = await other.cache_manager.allocate_cache(DESC)
        # A cluster on the receiver's daemon that will try to link to the sender's.
        linker = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                             daemon=receiver_side.client_target)
        await linker.init(options())
        results, sync, _src, _dst = await _held_task(pair)
        try:
            async with grpc.aio.insecure_channel(sender_side.client_target) as channel:
                admin = admin_pb2_grpc.AdminStub(channel)
                first = await admin.Drain(admin_pb2.DrainRequest(), timeout=10)
                again = await admin.Drain(admin_pb2.DrainRequest(), timeout=10)
            assert not first.already_draining and first.grace_period_s == GRACE_S
            assert again.already_draining

            def assert_refused(error: LLMException, what: str) -> None:
                assert error.status_code == LLMStatusCode.LLM_FAILED, error
                assert f"stopping (draining): it takes no new {what}" in str(error), error

            late = LLMDataDist(LLMRole.PROMPT, next_cluster_id(),
                               daemon=sender_side.client_target)
            with pytest.raises(LLMException) as info:
                await late.init(options())
            assert_refused(info.value, "sessions")
            with pytest.raises(LLMException) as info:
                await other.cache_manager.pull_cache(
                    CacheKeyByIdAndIndex(pair.prompt.cluster_id, 0, 0), other_cache)
            assert_refused(info.value, "transfers")
            with pytest.raises(LLMException) as info:
                await other.cache_manager.copy_cache(other_cache, other_cache)
            assert_refused(info.value, "transfers")
            with pytest.raises(LLMException) as info:
                await other.link_clusters(
                    [cluster_info(pair.prompt.cluster_id, receiver_side.peer_address)])
            assert_refused(info.value, "links")
            # A peer's link to a cluster of the draining daemon is refused too.
            status, per_cluster = await linker.link_clusters(
                [cluster_info(other.cluster_id, sender_side.peer_address)])
            assert status == LLMStatusCode.LLM_FAILED and per_cluster == [status]
            # Ending work still runs.
            await other.cache_manager.deallocate_cache(other_cache)
            await other.finalize()
        finally:
            sync.release.set()
        assert await asyncio.wait_for(results, WAIT_S) == [OK]
        code = await asyncio.to_thread(sender_side.stop, WAIT_S)  # the drain's own exit
        assert code == 0, sender_side.log_tail()
        assert _sockets(sender_side.tmpdir) == []
        await linker.finalize()


async def test_a_task_past_the_grace_period_is_ended_and_the_daemon_exits_0(
        next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(pool__max_bytes="512MiB", server__grace_period_s=0.5) as sender, \
            start_daemon(pool__max_bytes="512MiB") as receiver:
        pair = await make_pair(receiver, sender, next_cluster_id, remote_accessible=True)
        results, sync, _src, _dst = await _held_task(pair)
        try:
            assert await asyncio.to_thread(sender.stop, WAIT_S) == 0, sender.log_tail()
        finally:
            sync.release.set()
        statuses = await asyncio.wait_for(results, WAIT_S)
        assert statuses and statuses[0] != OK, statuses  # ended with a status, never hung
        assert "grace_period_s (0.5 s) is over" in sender.log_tail()
        assert _sockets(sender.tmpdir) == []
        await pair.prompt.finalize()
        await pair.decoder.finalize()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signalled_daemon_exits_0_and_removes_its_sockets(
        signum: signal.Signals) -> None:
    async with start_daemon(pool__max_bytes="64MiB") as daemon:
        assert len(_sockets(daemon.tmpdir)) == 3  # client, fd and lane sockets
        os.kill(daemon.pid, signum)
        assert await asyncio.to_thread(daemon.stop, WAIT_S) == 0, daemon.log_tail()
        assert _sockets(daemon.tmpdir) == []


async def test_a_refused_start_exits_2_and_leaves_nothing() -> None:
    async with start_daemon(pool__max_bytes="64MiB") as first:
        before = sorted(p.name for p in first.tmpdir.iterdir())
        # A second daemon with the same configuration: its client socket is served.
        second = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "hixl_service", "--config",
                             str(first.config_path)],
            capture_output=True, text=True, timeout=WAIT_S, cwd=first.tmpdir,
            env=first._env)
        assert second.returncode == 2, second.stderr
        assert "another daemon already listens on" in second.stderr
        assert "starting" not in second.stderr  # refused before anything was set up
        assert sorted(p.name for p in first.tmpdir.iterdir()) == before
        status = await daemon_status(first.client_target)  # the first serves on
        assert status.daemon_id == first.daemon_id
