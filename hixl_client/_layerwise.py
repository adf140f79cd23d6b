"""transfer_cache_async on the client side: the CacheTask and the layer driver.

The driver asks the synchronizer for each layer some config needs, in
increasing order, and tells the daemon over the task's stream as soon as a
layer may go, so sending layer L overlaps computing layer L+1. A blocking
``synchronize_layer`` runs on a thread of the task's own; an ``async def``
one is awaited.
Progress comes back on the same stream; nothing polls.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, cast

import grpc
import grpc.aio

from hixl_wire._proto.hixl.v1 import client_pb2
from hixl_wire.defaults import SESSION_METADATA_KEY
from hixl_wire.status import error_from_rpc

from . import _tracing, timing
from ._transport import CALL_MARGIN_S, LANE_GRACE_S
from .status import LLMException, LLMStatusCode
from .timing import LayerLag
from .transfer_config import TransferConfig, TransferWithCacheKeyConfig
from .types import LayerSynchronizer

if TYPE_CHECKING:
    from ._thread_lane import ThreadLane
    from ._transport import DaemonConnection

logger = logging.getLogger(__name__)

Config = TransferConfig | TransferWithCacheKeyConfig
# How long a synchronizer's thread outlives its last layer at most, waiting
# for its task to end (see _Synchronizer._serve): longer than a layer takes
# to land.
LINGER_S = 2.0


class CacheTask:
    """A running layer-wise transfer; ``await task`` gives the per-config results.

    ``synchronize`` and ``get_results`` keep LLM-DataDist's contract: with a
    timeout that passes before the task ends they answer the task's default
    error code (``LLM_TIMEOUT``) and the task keeps running.
    """

    def __init__(self, configs: Sequence[Config],
                 default_error_code: LLMStatusCode = LLMStatusCode.LLM_TIMEOUT) -> None:
        self._configs = list(configs)
        self._default = default_error_code
        self._results: dict[int, LLMStatusCode] = {}
        self._crashed = False
        self._done = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    def _start(self, driver: Any) -> None:
        self._runner = asyncio.get_running_loop().create_task(self._run(driver))
        self._runner.add_done_callback(functools.partial(self._ended, driver))

    def _ended(self, driver: Any, runner: asyncio.Task[None]) -> None:
        # A runner cancelled before its first step never ran _run (nor its
        # finally): the task must end all the same, and its driver be closed.
        if runner.cancelled():
            self._crashed = True
        driver.close()
        self._done.set()

    async def _run(self, driver: Any) -> None:
        try:
            await driver
        except asyncio.CancelledError:
            self._crashed = True
            raise
        except Exception:  # NEWER: any failure inside is the task's default code
            logger.exception("transfer task failed")
            self._crashed = True
        finally:
            self._done.set()

    def _record(self, dst_cluster_id: int, status: LLMStatusCode) -> None:
        self._results[dst_cluster_id] = status

    def _record_failure(self, dst_cluster_id: int, status: LLMStatusCode) -> None:
        """Record a failure unless the target already has one (the first says why)."""
        if self._results.get(dst_cluster_id, LLMStatusCode.LLM_SUCCESS) == \
                LLMStatusCode.LLM_SUCCESS:
            self._results[dst_cluster_id] = status

    def _failed(self) -> bool:
        return any(r != LLMStatusCode.LLM_SUCCESS for r in self._results.values())

    def _final_results(self) -> list[LLMStatusCode | None]:
        if self._crashed:
            return [self._default] * len(self._configs)
        return [self._results.get(c.dst_cluster_id) for c in self._configs]

    async def _wait(self, timeout_in_millis: int | None) -> bool:
        if self._done.is_set():
            return True
        if timeout_in_millis is None:
            await self._done.wait()
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._done.wait()), timeout_in_millis / 1000)
        except asyncio.TimeoutError:
            return False
        return True

    async def synchronize(self, timeout_in_millis: int | None = None) -> LLMStatusCode:
        """Wait for the task; return the first failure, or success.

        Args:
            timeout_in_millis: None waits for the end; else uint32 milliseconds.
        """
        _check_timeout(timeout_in_millis)
        if not await self._wait(timeout_in_millis):
            return self._default
        failures = [r for r in self._final_results()
                    if r is not None and r != LLMStatusCode.LLM_SUCCESS]
        return failures[0] if failures else LLMStatusCode.LLM_SUCCESS

    async def get_results(self, timeout_in_millis: int | None = None
                          ) -> list[LLMStatusCode | None]:
        """Per-config results aligned with the configs (None: never attempted)."""
        _check_timeout(timeout_in_millis)
        if not await self._wait(timeout_in_millis):
            return [self._default] * len(self._configs)
        return self._final_results()

    def __await__(self) -> Any:
        return self._await_results().__await__()

    async def _await_results(self) -> list[LLMStatusCode | None]:
        # Cancelling the coroutine that awaits the task cancels the task itself
        # (the daemon's half ends with the stream); waiting with synchronize()
        # or get_results() and a timeout never does.
        try:
            return await self.get_results()
        except asyncio.CancelledError:
            self.cancel()
            raise

    def cancel(self) -> None:
        """Stop sending; the daemon ends its half when the stream closes."""
        if self._runner is not None:
            self._runner.cancel()

    def done(self) -> bool:
        return self._done.is_set()


def _check_timeout(timeout_in_millis: int | None) -> None:
    from ._validation import check_uint32

    if timeout_in_millis is not None:
        check_uint32("timeout_in_millis", timeout_in_millis)


class _Synchronizer:
    """Asks the synchronizer about a task's layers, in order: an ``async def``
    method is awaited layer by layer; a blocking one runs on one thread of the
    task's own, which goes through the layers by itself.

    The thread calls ``on_ready(index)`` the moment a layer is ready (on a
    ThreadLane that sends the layer's LayerReady frame: ``_thread_lane``), then
    hands the answer to the event loop with ``call_soon_threadsafe``. Sending
    from the loop instead put that hop (a wake-up of the loop) on every
    layer's path. The time is taken in the thread, when the method returned.
    """

    def __init__(self, synchronizer: LayerSynchronizer, layers: list[int],
                 on_ready: Callable[[int], None] | None = None) -> None:
        self._method = synchronizer.synchronize_layer
        self.blocking = not inspect.iscoroutinefunction(self._method)
        self._layers = layers
        self._on_ready = on_ready
        self._loop = asyncio.get_running_loop()
        self._answers: list[asyncio.Future[tuple[bool, float]]] = []
        self._next = 0
        self._closed = threading.Event()
        self._sending_over = False
        self._thread: threading.Thread | None = None

    async def next(self) -> tuple[bool, float]:
        """Whether the next layer is ready, and ``time.perf_counter()`` when the
        synchronizer returned."""
        index = self._next
        self._next += 1
        if not self.blocking:
            answer = cast(Awaitable[bool], self._method(self._layers[index], None))
            return bool(await answer), time.perf_counter()
        if self._thread is None:
            self._answers = [self._loop.create_future() for _ in self._layers]
            self._thread = threading.Thread(target=self._serve, name="hixl-layer-sync",
                                            daemon=True)
            self._thread.start()
        return await self._answers[index]

    @property
    def thread_done(self) -> bool:
        """No thread, or it is past its last synchronizer call and sends nothing more."""
        return self._thread is None or self._sending_over

    def close(self) -> None:
        """Let the thread end, after the layer it may still be waiting for."""
        self._closed.set()

    def _serve(self) -> None:
        try:
            self._ask_in_turn()
        finally:
            self._sending_over = True
        # The thread ends with the task, not right after its last layer: ending
        # a thread takes CPU that the last layer's bytes want on a small host,
        # and the last layer landed later than the layers before it.
        self._closed.wait(LINGER_S)

    def _ask_in_turn(self) -> None:
        for index, layer in enumerate(self._layers):
            if self._closed.is_set():
                return
            outcome: tuple[bool, float] | BaseException
            try:
                outcome = (bool(self._method(layer, None)), time.perf_counter())
                if outcome[0] and self._on_ready is not None and not self._closed.is_set():
                    self._on_ready(index)
            except BaseException as exc:  # raised where the driver awaits, as to_thread does
                outcome = exc
            try:
                self._loop.call_soon_threadsafe(_settle, self._answers[index], outcome)
            except RuntimeError:  # the loop is closed: nobody waits for the answer
                return
            if isinstance(outcome, BaseException) or not outcome[0]:
                return  # the task ends here


def _settle(answer: asyncio.Future[tuple[bool, float]],
            outcome: tuple[bool, float] | BaseException) -> None:
    if answer.done():  # the driver was cancelled meanwhile
        return
    if isinstance(outcome, BaseException):
        answer.set_exception(outcome)
    else:
        answer.set_result(outcome)


class _ThreadFrames:
    """A task's LayerReady calls on a ThreadLane: opened on the event loop up front,
    each sent by the synchronizer's thread as its layer becomes ready."""

    def __init__(self, lane: ThreadLane, task_id: str, layers: list[int],
                 timeout_s: float) -> None:
        self.lane = lane
        self._calls = [lane.open_call("LayerReady",
                                      client_pb2.LayerReadyRequest(task_id=task_id, layer=layer),
                                      timeout_s)
                       for layer in layers]

    def send(self, index: int) -> None:
        """The synchronizer's thread: layer ``index`` (of the task's layers) is ready."""
        self.lane.send(self._calls[index])

    def reply(self, index: int) -> Coroutine[Any, Any, Any]:
        return self.lane.reply(self._calls[index])

    def close(self) -> None:
        """Stop waiting for any reply still out (the task is over)."""
        for call in self._calls:
            self.lane.drop(call)


async def _thread_frames(connection: DaemonConnection, task_id: str, layers: list[int],
                         timeout_s: float) -> _ThreadFrames | None:
    """LayerReady calls for a blocking synchronizer's thread to send itself;
    None where no thread lane opens (the event loop sends them then)."""
    lane = await connection.take_thread_lane()
    if lane is None:
        return None
    try:
        return _ThreadFrames(lane, task_id, layers, timeout_s)
    except LLMException:  # the lane failed meanwhile
        connection.give_back_thread_lane(lane)
        return None


async def drive(task: CacheTask, connection: DaemonConnection, start: client_pb2.TransferStart,
                synchronizer: LayerSynchronizer, num_layers: int, timeout_s: float) -> None:
    """Run one task (:func:`_drive`), in a client span when tracing is on: the
    task's stream carries its traceparent to the daemon."""
    metadata: tuple[tuple[str, str], ...] = ((SESSION_METADATA_KEY, connection.session_id),)
    if not _tracing.ENABLED:
        await _drive(task, connection, start, synchronizer, num_layers, timeout_s, metadata)
        return
    span, traceparent = _tracing.start("hixl.TransferCache")
    metadata += ((_tracing.TRACEPARENT, traceparent.decode()),)
    await _tracing.finish(span, _drive(task, connection, start, synchronizer, num_layers,
                                       timeout_s, metadata))


async def _drive(task: CacheTask, connection: DaemonConnection, start: client_pb2.TransferStart,
                 synchronizer: LayerSynchronizer, num_layers: int, timeout_s: float,
                 metadata: tuple[tuple[str, str], ...]) -> None:
    """Run one task: send the layers as they become ready, record progress.

    With the transfer lane open, each "layer ready" is a LayerReady call on
    the lane whose reply is that layer's progress (one lane round trip instead
    of two stream messages); the stream carries the task's start and end. A
    blocking synchronizer's thread sends those calls itself (``_ThreadFrames``).
    ``timeout_s`` bounds each layer (sync_kv_timeout); every wait here ends
    CALL_MARGIN_S after it at the latest, even when the daemon stopped answering.
    """
    bound_s = timeout_s + CALL_MARGIN_S
    call = connection.stub.TransferCache(metadata=metadata)
    on_lane = connection.has_lane
    if on_lane:
        start.lane_task_id = secrets.token_hex(8)
    progress = _Progress(task, list(start.targets))
    captured = timing.layer_lag_capture()
    if captured is not None:
        progress.lags = {}
        captured.append([])
    # The layers some target needs, each with those targets; the synchronizer
    # is asked about these only.
    plan = [(layer, needing) for layer in range(num_layers)
            if (needing := [t for t in progress.targets
                            if t.src_layer_start <= layer < t.src_layer_stop])]
    layers = [layer for layer, _ in plan]
    layer_calls: list[asyncio.Task[None]] = []
    frames = None
    if on_lane and layers and not inspect.iscoroutinefunction(synchronizer.synchronize_layer):
        frames = await _thread_frames(connection, start.lane_task_id, layers, bound_s)
    asking = _Synchronizer(synchronizer, layers, None if frames is None else frames.send)
    try:
        await call.write(client_pb2.TransferMessage(start=start))
        reader = asyncio.get_running_loop().create_task(_read_progress(progress, call))
        try:
            for index, (layer, needing) in enumerate(plan):
                if reader.done() or task._failed():
                    break  # the daemon ended the task; the reader has the reason
                ready, ready_s = await asking.next()
                if not ready:
                    for target in needing:
                        task._record(target.dst_cluster_id, LLMStatusCode.LLM_PARAM_INVALID)
                    break
                if progress.lags is not None and captured is not None:
                    progress.lags[layer] = LayerLag(layer, ready_s)
                    captured[-1].append(progress.lags[layer])
                reply: Coroutine[Any, Any, Any] | None
                if frames is not None:
                    reply = frames.reply(index)
                elif on_lane:
                    reply = _layer_on_lane(progress, connection, start.lane_task_id, layer,
                                           needing, timeout_s)
                elif not await _send(call, client_pb2.TransferMessage(layer_ready=layer)):
                    break
                else:
                    reply = None
                if reply is not None:
                    layer_call = asyncio.get_running_loop().create_task(reply)
                    layer_call.add_done_callback(
                        functools.partial(_layer_answered, progress, layer, needing))
                    layer_calls.append(layer_call)
            # Until every layer is answered, or the stream ended the task early.
            # Only the calls still out: gathering the answered ones too schedules a
            # callback for each, which took CPU from the last layer's bytes.
            if out := [layer_call for layer_call in layer_calls if not layer_call.done()]:
                await asyncio.wait((asyncio.gather(*out, return_exceptions=True), reader),
                                   timeout=bound_s, return_when=asyncio.FIRST_COMPLETED)
            await _send(call, None)
            # The stream's last reports; after a failed layer (its status is
            # recorded) only briefly, so a hung daemon adds no second bound.
            failed = task._failed()
            try:
                await asyncio.wait_for(reader, LANE_GRACE_S if failed else bound_s)
            except asyncio.TimeoutError:
                if not failed:
                    raise
        finally:
            reader.cancel()
    except grpc.aio.AioRpcError as err:
        raise error_from_rpc(err, f"hixl daemon at {connection.target}") from None
    finally:
        asking.close()
        for layer_call in layer_calls:
            layer_call.cancel()
        if frames is not None:
            frames.close()
            if asking.thread_done:
                connection.give_back_thread_lane(frames.lane)
            else:  # it may still send a layer of this task: not for the next task's lane
                frames.lane.close()
        call.cancel()


def _layer_on_lane(progress: _Progress, connection: DaemonConnection, task_id: str,
                   layer: int, needing: list[client_pb2.TransferTarget],
                   timeout_s: float) -> Coroutine[Any, Any, Any] | None:
    """Send one LayerReady call now, so a layer's lag does not include waiting
    for a new task's first step; return the coroutine of its reply (None when
    the call could not be sent: the failure is recorded)."""
    try:
        return connection.begin_transfer(
            "LayerReady", client_pb2.LayerReadyRequest(task_id=task_id, layer=layer), timeout_s)
    except LLMException as exc:
        _layer_failed(progress, layer, needing, exc)
        return None


def _layer_answered(progress: _Progress, layer: int, needing: list[client_pb2.TransferTarget],
                    call: asyncio.Task[Any]) -> None:
    """Apply a LayerReady reply, or its failure, to the task (the call's done callback:
    the reply's coroutine is the call's own, so a call cancelled before its first
    step leaves no coroutine unawaited)."""
    if call.cancelled():
        return
    failure = call.exception()
    if failure is None:
        for report in call.result().reports:
            progress.apply(report)
        return
    if not isinstance(failure, LLMException):
        logger.error("layer %d of a layer-wise transfer: unexpected failure", layer,
                     exc_info=failure)
        failure = LLMException(f"layer {layer}: {failure!r}", status_code=LLMStatusCode.LLM_FAILED)
    _layer_failed(progress, layer, needing, failure)


def _layer_failed(progress: _Progress, layer: int, needing: list[client_pb2.TransferTarget],
                  exc: LLMException) -> None:
    logger.warning("layer %d of a layer-wise transfer failed: %s", layer, exc)
    for target in needing:
        progress.task._record_failure(target.dst_cluster_id, exc.status_code)


async def _send(call: Any, message: client_pb2.TransferMessage | None) -> bool:
    """Write (or half-close, for None); False when the daemon already ended the stream.

    The daemon ends a task's stream as soon as a target fails, which can race
    with our next write; the failure itself arrives through the progress reader.
    """
    try:
        if message is None:
            await call.done_writing()
        else:
            await call.write(message)
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
        return False
    return True


class _Progress:
    """Applies a task's progress reports, from the stream or from LayerReady replies."""

    def __init__(self, task: CacheTask, targets: list[client_pb2.TransferTarget]) -> None:
        self.task = task
        self.targets = targets
        self.lags: dict[int, LayerLag] | None = None

    def apply(self, report: client_pb2.TransferProgress) -> None:
        target = self.targets[report.target]
        status = LLMStatusCode(report.status)
        if self.lags is not None and status == LLMStatusCode.LLM_SUCCESS and \
                report.layer in self.lags:
            # Targets report in turn: the layer has landed once the last one did.
            self.lags[report.layer].landed_s = time.perf_counter()
        if status != LLMStatusCode.LLM_SUCCESS:
            logger.warning("transfer to cluster %d failed: %s", target.dst_cluster_id,
                           report.message)
            self.task._record(target.dst_cluster_id, status)
        elif report.target_done:
            self.task._record(target.dst_cluster_id, status)


async def _read_progress(progress: _Progress, call: Any) -> None:
    try:
        while (report := await call.read()) is not grpc.aio.EOF:
            progress.apply(report)
    except grpc.aio.AioRpcError:
        if not progress.task._failed():
            raise  # a failure already reported explains the end of the stream


def build_start(src_cache_id: int, configs: Sequence[Config],
                src_block_indices: Sequence[int] | None, dst_block_indices: Sequence[int] | None,
                dst_block_memory_size: int | None) -> client_pb2.TransferStart:
    """The task message: one target per config (their ranges are already checked)."""
    from ._manager_base import ref_to_proto

    targets = []
    for config in configs:
        src_range = config.src_layer_range
        assert src_range is not None
        target = client_pb2.TransferTarget(
            dst_cluster_id=config.dst_cluster_id, src_layer_start=src_range.start,
            src_layer_stop=src_range.stop, src_batch_index=config.src_batch_index,
            dst_layer_start=src_range.start)
        if isinstance(config, TransferWithCacheKeyConfig):
            assert config.cache_key is not None  # required by its constructor
            target.dst.CopyFrom(ref_to_proto(config.cache_key))
            if config.dst_layer_range is not None:
                target.dst_layer_start = config.dst_layer_range.start
        else:
            target.dst_addrs.extend(config.dst_addrs)
        targets.append(target)
    return client_pb2.TransferStart(
        src_cache_id=src_cache_id, targets=targets, src_blocks=list(src_block_indices or ()),
        dst_blocks=list(dst_block_indices or ()),
        dst_block_memory_size=dst_block_memory_size or 0)


__all__ = ["CacheTask", "build_start", "drive"]
