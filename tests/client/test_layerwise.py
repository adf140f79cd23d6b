"""The client's layer-wise driver (``hixl_client._layerwise``) without a daemon:
CacheTask's results and waits, the synchronizer asked layer by layer (awaited,
or on a thread of its own), and ``drive`` over doubles of the session's
carriers: the TransferCache stream and, with the transfer lane, the
LayerReady calls. Layers go as they become ready, each target's result is
its first failure, failures raise the daemon's status, and every task ends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

import grpc
import grpc.aio
import pytest

from hixl_client._layerwise import CacheTask, _Synchronizer, drive
from hixl_client.status import LLMException, LLMStatusCode
from hixl_client.transfer_config import TransferConfig
from hixl_client.types import LayerSynchronizer
from hixl_wire._proto.hixl.v1 import client_pb2
from hixl_wire.status import status_metadata

S = LLMStatusCode


def _configs(*clusters: int) -> list[TransferConfig]:
    return [TransferConfig(cluster, [0x1000, 0x2000]) for cluster in clusters]


# ---- CacheTask ----------------------------------------------------------------------------------


async def _task(driver: Coroutine[Any, Any, None], *clusters: int) -> CacheTask:
    task = CacheTask(_configs(*clusters))
    task._start(driver)
    return task


@pytest.mark.asyncio
async def test_results_follow_the_configs_and_synchronize_gives_the_first_failure() -> None:
    task = CacheTask(_configs(1, 2, 3))

    async def driver() -> None:
        task._record(1, S.LLM_SUCCESS)
        task._record_failure(2, S.LLM_KV_CACHE_NOT_EXIST)
        task._record_failure(2, S.LLM_TIMEOUT)  # the first failure says why

    task._start(driver())
    assert await task == [S.LLM_SUCCESS, S.LLM_KV_CACHE_NOT_EXIST, None]  # 3: never attempted
    assert await task.synchronize() is S.LLM_KV_CACHE_NOT_EXIST
    assert task.done()


@pytest.mark.asyncio
async def test_a_wait_that_times_out_answers_the_default_and_the_task_runs_on() -> None:
    release = asyncio.Event()

    async def driver() -> None:
        await release.wait()

    task = await _task(driver(), 1)
    assert await task.synchronize(0) is S.LLM_TIMEOUT
    assert await task.get_results(0) == [S.LLM_TIMEOUT]
    assert not task.done()
    release.set()
    assert await task.synchronize() is S.LLM_SUCCESS
    assert await task.get_results(1) == [None]


@pytest.mark.asyncio
async def test_a_driver_that_fails_or_is_cancelled_ends_the_task_with_the_default(
        caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise RuntimeError("lost")

    crashed = await _task(fails(), 1, 2)
    assert await crashed == [S.LLM_TIMEOUT, S.LLM_TIMEOUT]
    assert "transfer task failed" in caplog.text
    hung = await _task(asyncio.Event().wait(), 1)  # type: ignore[arg-type]
    hung.cancel()  # before the runner's first step: it must end all the same
    assert await hung.synchronize() is S.LLM_TIMEOUT and hung.done()


@pytest.mark.asyncio
async def test_cancelling_the_awaiter_cancels_the_task() -> None:
    task = await _task(asyncio.Event().wait(), 1)  # type: ignore[arg-type]
    waiter = asyncio.ensure_future(task._await_results())
    await asyncio.sleep(0)  # the waiter waits for the task
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await task.synchronize() is S.LLM_TIMEOUT and task.done()


@pytest.mark.asyncio
@pytest.mark.parametrize(("timeout", "error"), [(-1, ValueError), (2**32, ValueError),
                                                ("1", TypeError), (1.5, TypeError)])
async def test_wait_timeouts_are_uint32_milliseconds(timeout: Any, error: type) -> None:
    task = CacheTask(_configs(1))
    with pytest.raises(error):
        await task.synchronize(timeout)
    with pytest.raises(error):
        await task.get_results(timeout)


# ---- the synchronizer ---------------------------------------------------------------------------


class AsyncLayers(LayerSynchronizer):
    """An ``async def`` synchronizer: layers below ``ready_below`` are ready."""

    def __init__(self, ready_below: int = 1 << 30) -> None:
        self.asked: list[int] = []
        self.ready_below = ready_below

    async def synchronize_layer(self, layer_index: int,  # type: ignore[override]
                                timeout_in_millis: int | None) -> bool:
        self.asked.append(layer_index)
        return layer_index < self.ready_below


class BlockingLayers(LayerSynchronizer):
    """A blocking synchronizer: ready below ``ready_below``, raises at ``fail_at``."""

    def __init__(self, ready_below: int = 1 << 30, fail_at: int = -1) -> None:
        self.asked: list[tuple[int, str]] = []
        self.ready_below = ready_below
        self.fail_at = fail_at

    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        self.asked.append((layer_index, threading.current_thread().name))
        if layer_index == self.fail_at:
            raise RuntimeError(f"layer {layer_index} broke")
        return layer_index < self.ready_below


@pytest.mark.asyncio
async def test_an_async_synchronizer_is_awaited_layer_by_layer() -> None:
    layers = AsyncLayers(ready_below=5)
    asking = _Synchronizer(layers, [2, 5, 7])
    assert not asking.blocking
    answers = [(await asking.next())[0] for _ in range(3)]
    assert answers == [True, False, False] and layers.asked == [2, 5, 7]
    assert asking.thread_done


@pytest.mark.asyncio
async def test_a_blocking_synchronizer_runs_on_its_own_thread_and_stops_at_not_ready() -> None:
    layers = BlockingLayers(ready_below=2)
    readied: list[int] = []
    asking = _Synchronizer(layers, [0, 1, 2, 3], on_ready=readied.append)
    assert asking.blocking
    try:
        answers = [(await asking.next())[0] for _ in range(3)]
    finally:
        asking.close()
    assert answers == [True, True, False]
    assert [layer for layer, _ in layers.asked] == [0, 1, 2]  # 3 is never asked
    assert {thread for _, thread in layers.asked} == {"hixl-layer-sync"}
    assert readied == [0, 1]  # sent from the thread, ready layers only
    assert asking._thread is not None
    await asyncio.to_thread(asking._thread.join)  # it ends once closed
    assert asking.thread_done


@pytest.mark.asyncio
async def test_a_blocking_synchronizers_error_is_raised_where_the_driver_waits() -> None:
    asking = _Synchronizer(BlockingLayers(fail_at=1), [0, 1, 2])
    try:
        assert (await asking.next())[0]
        with pytest.raises(RuntimeError, match="layer 1 broke"):
            await asking.next()
    finally:
        asking.close()


# ---- drive, over doubles of the carriers --------------------------------------------------------


class StreamDouble:
    """Stands in for the TransferCache stream: records what the client writes and
    plays a daemon that reports each layer to the targets that need it, then,
    once the client is done writing, ``target_done`` for each target all of whose
    layers landed. ``fail_with`` ends the stream with that error at the
    client's first write of a layer."""

    def __init__(self, daemon: ConnectionDouble) -> None:
        self.daemon = daemon
        self.writes: list[client_pb2.TransferMessage] = []
        self.reports: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = False
        self.targets: list[client_pb2.TransferTarget] = []

    async def write(self, message: client_pb2.TransferMessage) -> None:
        self.writes.append(message)
        if message.HasField("start"):
            self.targets = list(message.start.targets)
        elif self.daemon.fail_with is not None:
            await self.reports.put(self.daemon.fail_with)
        else:
            for report in self.daemon.layer_reports(self.targets, message.layer_ready):
                await self.reports.put(report)

    async def done_writing(self) -> None:
        for index, target in enumerate(self.targets):
            if all((index, layer) in self.daemon.landed
                   for layer in range(target.src_layer_start, target.src_layer_stop)):
                await self.reports.put(client_pb2.TransferProgress(target=index,
                                                                   target_done=True))
        await self.reports.put(grpc.aio.EOF)

    async def read(self) -> Any:
        item = await self.reports.get()
        if isinstance(item, Exception):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True


class StubDouble:
    def __init__(self, daemon: ConnectionDouble) -> None:
        self.daemon = daemon

    def TransferCache(self, metadata: Any) -> StreamDouble:
        self.daemon.metadata = metadata
        self.daemon.stream = StreamDouble(self.daemon)
        return self.daemon.stream


class ConnectionDouble:
    """Stands in for ``DaemonConnection``: its stub, and with ``has_lane`` the
    lane's LayerReady calls (``begin_transfer``), failing at ``lane_fails``."""

    def __init__(self, has_lane: bool = False) -> None:
        self.session_id = "session-1"
        self.target = "unix:/test"
        self.has_lane = has_lane
        self.stub = StubDouble(self)
        self.stream: StreamDouble | None = None
        self.metadata: Any = None
        self.fail_with: Exception | None = None
        self.lane_fails: dict[int, LLMException] = {}
        self.lane_calls: list[client_pb2.LayerReadyRequest] = []
        self.landed: set[tuple[int, int]] = set()  # (target index, layer)

    def layer_reports(self, targets: list[client_pb2.TransferTarget],
                      layer: int) -> list[client_pb2.TransferProgress]:
        """A layer lands in the targets that need it: their reports."""
        needing = [index for index, target in enumerate(targets)
                   if target.src_layer_start <= layer < target.src_layer_stop]
        self.landed.update((index, layer) for index in needing)
        return [client_pb2.TransferProgress(target=index, layer=layer) for index in needing]

    def begin_transfer(self, name: str, request: client_pb2.LayerReadyRequest,
                       timeout: float | None = None) -> Coroutine[Any, Any, Any]:
        assert name == "LayerReady"
        self.lane_calls.append(request)
        assert self.stream is not None
        targets = self.stream.targets

        async def reply() -> client_pb2.LayerReadyReply:
            if request.layer in self.lane_fails:
                raise self.lane_fails[request.layer]
            return client_pb2.LayerReadyReply(reports=self.layer_reports(targets,
                                                                         request.layer))

        return reply()

    async def take_thread_lane(self) -> None:
        return None


def _start(*ranges: tuple[int, int, int]) -> client_pb2.TransferStart:
    """(dst cluster, first layer, stop layer) per target."""
    return client_pb2.TransferStart(src_cache_id=1, targets=[
        client_pb2.TransferTarget(dst_cluster_id=cluster, src_layer_start=first,
                                  src_layer_stop=stop, dst_addrs=[0x1000])
        for cluster, first, stop in ranges])


async def _drive(connection: ConnectionDouble, synchronizer: LayerSynchronizer,
                 start: client_pb2.TransferStart, num_layers: int) -> CacheTask:
    task = CacheTask(_configs(*(target.dst_cluster_id for target in start.targets)))
    task._start(drive(task, connection, start, synchronizer, num_layers, 5.0))  # type: ignore[arg-type]
    await task
    return task


@pytest.mark.asyncio
@pytest.mark.parametrize("synchronizer", [AsyncLayers, BlockingLayers])
async def test_layers_go_on_the_stream_as_they_are_ready(synchronizer: type) -> None:
    connection = ConnectionDouble()
    layers = synchronizer()
    task = await _drive(connection, layers, _start((1, 0, 2), (2, 1, 3)), num_layers=4)
    assert await task.get_results() == [S.LLM_SUCCESS, S.LLM_SUCCESS]
    stream = connection.stream
    assert stream is not None and stream.cancelled  # the call ends with the task
    assert [m.layer_ready for m in stream.writes[1:]] == [0, 1, 2]  # layer 3: nobody needs it
    assert not stream.writes[0].start.lane_task_id
    assert dict(connection.metadata)["hixl-session"] == "session-1"


@pytest.mark.asyncio
async def test_a_layer_not_ready_fails_the_targets_needing_it() -> None:
    connection = ConnectionDouble()
    task = await _drive(connection, AsyncLayers(ready_below=1), _start((1, 0, 1), (2, 0, 2)),
                        num_layers=2)
    assert await task.get_results() == [S.LLM_SUCCESS, S.LLM_PARAM_INVALID]
    assert await task.synchronize() is S.LLM_PARAM_INVALID


@pytest.mark.asyncio
async def test_on_the_lane_each_layer_is_a_call_and_its_failure_is_its_targets() -> None:
    connection = ConnectionDouble(has_lane=True)
    connection.lane_fails[1] = LLMException("late", status_code=S.LLM_TIMEOUT)
    task = await _drive(connection, AsyncLayers(), _start((1, 0, 1), (2, 0, 3)), num_layers=3)
    assert await task.get_results() == [S.LLM_SUCCESS, S.LLM_TIMEOUT]
    stream = connection.stream
    assert stream is not None
    task_id = stream.writes[0].start.lane_task_id
    assert task_id and len(stream.writes) == 1  # the stream carries only the start
    assert [call.layer for call in connection.lane_calls][:2] == [0, 1]
    assert {call.task_id for call in connection.lane_calls} == {task_id}


@pytest.mark.asyncio
async def test_a_stream_the_daemon_fails_raises_its_status_and_the_task_ends() -> None:
    def failing() -> ConnectionDouble:
        connection = ConnectionDouble()
        connection.fail_with = grpc.aio.AioRpcError(
            grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(),
            grpc.aio.Metadata(*status_metadata(S.LLM_KV_CACHE_NOT_EXIST)), "no such cache")
        return connection

    connection = failing()
    with pytest.raises(LLMException, match="^no such cache$") as info:
        await drive(CacheTask(_configs(1)), connection, _start((1, 0, 2)),  # type: ignore[arg-type]
                    AsyncLayers(), 2, 5.0)
    assert info.value.status_code is S.LLM_KV_CACHE_NOT_EXIST
    assert connection.stream is not None and connection.stream.cancelled
    # Run as a task, the failure ends it with the task's default code.
    task = await _drive(failing(), AsyncLayers(), _start((1, 0, 2)), 2)
    assert task.done() and await task.get_results() == [S.LLM_TIMEOUT]
