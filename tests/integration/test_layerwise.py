"""transfer_cache_async: layer-wise pushes with a synchronizer, and CacheTask's contract."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
import pytest_asyncio

from hixl_client import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LayerSynchronizer,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    Placement,
    TransferConfig,
    TransferWithCacheKeyConfig,
)
from hixl_service.testing import DaemonProcess, start_daemon

from .conftest import Pair, cluster_info, daemon_status, make_pair, options

pytestmark = pytest.mark.asyncio

OK = LLMStatusCode.LLM_SUCCESS
RNG = np.random.default_rng(11)


class Ready(LayerSynchronizer):
    """Every layer is ready at once; records the calls."""

    def __init__(self, answer: bool = True, delay_s: float = 0.0) -> None:
        self.calls: list[int] = []
        self.answer = answer
        self.delay_s = delay_s

    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        self.calls.append(layer_index)
        time.sleep(self.delay_s)  # blocking on purpose: it runs in a worker thread
        return self.answer


class HoldAt(LayerSynchronizer):
    """Layers before ``layer`` are ready at once; at ``layer`` it sets ``reached``
    and blocks (its worker thread) until ``release`` is set, 10 s at most: a
    test acts on a task known to be computing that layer."""

    def __init__(self, layer: int) -> None:
        self.layer = layer
        self.calls: list[int] = []
        self.reached, self.release = threading.Event(), threading.Event()
        self.thread: threading.Thread | None = None

    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        self.thread = threading.current_thread()
        self.calls.append(layer_index)
        if layer_index == self.layer:
            self.reached.set()
            self.release.wait(10)
        return True

    async def wait_reached(self, within_s: float = 10.0) -> None:
        reached = await asyncio.to_thread(self.reached.wait, within_s)
        assert reached, f"the synchronizer was never asked for layer {self.layer}: {self.calls}"

    async def wait_thread_ended(self, within_s: float = 10.0) -> None:
        thread = self.thread
        assert thread is not None
        await asyncio.to_thread(thread.join, within_s)
        assert not thread.is_alive(), "the synchronizer's thread outlived its task"


def fill(cache: Cache) -> None:
    for i in range(cache.cache_desc.num_tensors):
        view = np.frombuffer(cache.tensor_view(i), dtype=np.uint8)
        view[:] = RNG.integers(0, 256, view.size, dtype=np.uint8)


def raw(cache: Cache, tensor: int) -> np.ndarray:
    return np.frombuffer(cache.tensor_view(tensor), dtype=np.uint8).reshape(
        cache.cache_desc.shape[0], -1)


async def until_landed(dst: Cache, src: Cache, tensors: range, message: str,
                       within_s: float = 10.0) -> None:
    """Wait until ``tensors`` of ``src`` are at the receiver (``dst``'s memory)."""
    deadline = time.monotonic() + within_s
    while not all(np.array_equal(raw(dst, t), raw(src, t)) for t in tensors):
        assert time.monotonic() < deadline, message
        await asyncio.sleep(0.002)


@pytest_asyncio.fixture
async def accessible(prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
                     next_cluster_id: Callable[[], int]) -> AsyncIterator[Pair]:
    """decoder (the sender, on the prefill daemon) linked to prompt (the receiver, on the
    decode daemon)."""
    made = await make_pair(decode_daemon, prefill_daemon, next_cluster_id,
                           remote_accessible=True)
    yield made
    await made.decoder.finalize()
    await made.prompt.finalize()


async def test_layers_land_with_relative_destination_layers(accessible: Pair) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(8, [2, 8192], DataType.DT_FLOAT16)  # 4 layers, 2 slots
    src = await sender.cache_manager.allocate_cache(desc)
    fill(src)
    dst = await receiver.cache_manager.allocate_cache(desc)
    before = [raw(dst, i).copy() for i in range(8)]
    sync = Ready()
    config = TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id, 1),
                                        range(1, 3), range(2), src_batch_index=0)
    task = sender.cache_manager.transfer_cache_async(src, sync, [config])
    assert await task == [OK]
    assert sync.calls == [1, 2]  # only layers some config needs, in order
    for layer in (1, 2):
        for kv in range(2):
            np.testing.assert_array_equal(raw(dst, (layer - 1) * 2 + kv)[1],
                                          raw(src, layer * 2 + kv)[0])
    for tensor in (4, 5, 6, 7):
        np.testing.assert_array_equal(raw(dst, tensor), before[tensor])
    assert await task.synchronize() == OK and await task.synchronize(0) == OK


async def test_blocks_to_blocks_and_cache_to_blocks(accessible: Pair) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    blocks_desc = CacheDesc(4, [16, 1024], DataType.DT_UINT8)
    dst = await receiver.cache_manager.allocate_blocks_cache(
        blocks_desc, BlocksCacheKey(receiver.cluster_id, 4))
    src = await sender.cache_manager.allocate_blocks_cache(blocks_desc)
    fill(src)
    key = BlocksCacheKey(receiver.cluster_id, 4)
    config = TransferWithCacheKeyConfig(key, range(2), range(2))
    task = sender.cache_manager.transfer_cache_async(src, Ready(), [config], [0, 1, 5], [9, 10, 2])
    assert await task.synchronize(5000) == OK
    for i in range(4):
        np.testing.assert_array_equal(raw(dst, i)[[9, 10, 2]], raw(src, i)[[0, 1, 5]])
    slot = await sender.cache_manager.allocate_cache(CacheDesc(4, [1, 4 * 1024], DataType.DT_UINT8))
    fill(slot)
    task = sender.cache_manager.transfer_cache_async(
        slot, Ready(), [TransferWithCacheKeyConfig(key, range(2), range(2))],
        dst_block_indices=[12, 13, 3, 4], dst_block_memory_size=1024)
    assert await task == [OK]
    for i in range(4):
        np.testing.assert_array_equal(raw(dst, i)[[12, 13, 3, 4]].reshape(-1), raw(slot, i)[0])


async def test_each_layer_leaves_before_the_next_is_computed(accessible: Pair) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(4, [1, 1 << 20], DataType.DT_UINT8)
    src = await sender.cache_manager.allocate_cache(desc)
    fill(src)
    dst = await receiver.cache_manager.allocate_cache(desc)
    landed = threading.Event()

    class WaitForLayer0(LayerSynchronizer):
        def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
            if layer_index == 1:  # "computing" layer 1 until layer 0 is at the receiver
                deadline = time.monotonic() + 10
                while not np.array_equal(raw(dst, 1), raw(src, 1)):
                    assert time.monotonic() < deadline, "layer 0 never arrived"
                    time.sleep(0.002)
                landed.set()
            return True

    key = CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id)
    task = sender.cache_manager.transfer_cache_async(
        src, WaitForLayer0(), [TransferWithCacheKeyConfig(key, range(2), range(2))])
    assert await task == [OK] and landed.is_set()


async def test_a_blocking_synchronizer_sends_its_layers_while_the_event_loop_is_busy(
        accessible: Pair) -> None:
    """The synchronizer's thread sends each layer's LayerReady itself: a layer
    leaves and lands while the event loop that started the task is blocked."""
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(4, [1, 1 << 20], DataType.DT_UINT8)  # 2 layers of 2 MiB
    src = await sender.cache_manager.allocate_cache(desc)
    fill(src)
    dst = await receiver.cache_manager.allocate_cache(desc)
    asked, loop_blocked = threading.Event(), threading.Event()

    class ReadyOnceTheLoopIsBlocked(LayerSynchronizer):
        def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
            asked.set()
            return loop_blocked.wait(10)

    key = CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id)
    task = sender.cache_manager.transfer_cache_async(
        src, ReadyOnceTheLoopIsBlocked(), [TransferWithCacheKeyConfig(key, range(2), range(2))])
    deadline = time.monotonic() + 10
    while not asked.is_set():
        assert time.monotonic() < deadline, "the synchronizer was never asked"
        await asyncio.sleep(0.001)
    # Block the loop (no await) until both layers are at the receiver.
    loop_blocked.set()
    while not all(np.array_equal(raw(dst, t), raw(src, t)) for t in range(4)):
        assert time.monotonic() < deadline, "layers did not leave while the loop was busy"
        time.sleep(0.002)
    assert await task == [OK]


async def test_a_task_whose_daemon_dies_ends_promptly(next_cluster_id: Callable[[], int]) -> None:
    """The local daemon dies while a blocking synchronizer computes layer 2: its
    thread's frame finds the lane gone, and the task ends failed, not hung."""
    async with start_daemon(pool__max_bytes="512MiB") as prefill, \
            start_daemon(pool__max_bytes="512MiB") as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, remote_accessible=True)
        sender, receiver = pair.decoder, pair.prompt
        desc = CacheDesc(8, [1, 4096], DataType.DT_UINT8)  # 4 layers
        src = await sender.cache_manager.allocate_cache(desc)
        dst = await receiver.cache_manager.allocate_cache(desc)
        reached, killed = threading.Event(), threading.Event()

        class ComputingWhileTheDaemonDies(LayerSynchronizer):
            def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
                if layer_index == 2:
                    reached.set()
                    killed.wait(10)
                return True

        key = CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id)
        task = sender.cache_manager.transfer_cache_async(
            src, ComputingWhileTheDaemonDies(), [TransferWithCacheKeyConfig(key, range(4),
                                                                              range(4))])
        assert await asyncio.to_thread(reached.wait, 10), "layer 2 was never asked for"
        decode.kill()
        killed.set()
        started = time.monotonic()
        (result,) = await asyncio.wait_for(task, 10)
        assert result not in (None, OK)
        assert time.monotonic() - started < 5
        await receiver.finalize()


async def test_layer_lags_are_captured_for_benchmarks(accessible: Pair) -> None:
    from hixl_client.timing import capture_layer_lags

    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(8, [1, 64 * 1024], DataType.DT_UINT8)  # 4 layers
    src = await sender.cache_manager.allocate_cache(desc)
    dst = await receiver.cache_manager.allocate_cache(desc)
    key = CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id)
    config = TransferWithCacheKeyConfig(key, range(1, 4), range(3))
    with capture_layer_lags() as tasks:
        task = sender.cache_manager.transfer_cache_async(src, Ready(delay_s=0.01), [config])
        assert await task == [OK]
    untouched = sender.cache_manager.transfer_cache_async(src, Ready(), [config])
    assert await untouched == [OK]
    (lags,) = tasks  # one task inside the block; the one after it is not recorded
    assert [lag.layer for lag in lags] == [1, 2, 3]
    for lag in lags:
        assert lag.landed_s is not None and lag.lag_s is not None
        assert 0 < lag.lag_s < 5
    # each layer left when it was ready, before the next one's synchronizer returned
    assert all(a.ready_s < b.ready_s for a, b in itertools.pairwise(lags))


async def test_blocking_synchronizer_runs_on_one_thread_that_ends_with_the_task(
        accessible: Pair) -> None:
    """A blocking synchronizer is asked on one thread of the task's own, layer
    after layer; the thread ends with the task, also when the synchronizer
    raises (the task then fails, as any crash of its driver does)."""
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(8, [1, 4096], DataType.DT_UINT8)  # 4 layers
    src = await sender.cache_manager.allocate_cache(desc)
    dst = await receiver.cache_manager.allocate_cache(desc)
    key = CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id)
    config = TransferWithCacheKeyConfig(key, range(4), range(4))

    class Recording(LayerSynchronizer):
        def __init__(self, fail_at: int | None = None) -> None:
            self.threads: list[str] = []
            self.fail_at = fail_at

        def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
            self.threads.append(threading.current_thread().name)
            if layer_index == self.fail_at:
                raise RuntimeError("the model crashed computing this layer")
            return True

    def sync_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "hixl-layer-sync"]

    before = len(sync_threads())
    fine = Recording()
    assert await sender.cache_manager.transfer_cache_async(src, fine, [config]) == [OK]
    assert fine.threads == ["hixl-layer-sync"] * 4
    crashing = Recording(fail_at=2)
    task = sender.cache_manager.transfer_cache_async(src, crashing, [config])
    (result,) = await task
    assert result not in (None, OK)
    assert len(crashing.threads) == 3  # layers 0, 1 and the one that raised
    deadline = time.monotonic() + 5
    while len(sync_threads()) > before:
        assert time.monotonic() < deadline, "a synchronizer thread outlived its task"
        await asyncio.sleep(0.01)


async def test_async_synchronizer_and_timing_contract(accessible: Pair) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(10, [1, 4096], DataType.DT_UINT8)
    src = await sender.cache_manager.allocate_cache(desc)
    dst = await receiver.cache_manager.allocate_cache(desc)

    class Slow(LayerSynchronizer):
        async def synchronize_layer(self, layer_index: int,  # type: ignore[override]
                                    timeout_in_millis: int | None) -> bool:
            if layer_index == 0:
                await asyncio.sleep(0.3)
            return True

    key = CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id)
    configs = [TransferWithCacheKeyConfig(key, range(3), range(3)),
               TransferWithCacheKeyConfig(key, range(3, 5), range(3, 5))]
    task = sender.cache_manager.transfer_cache_async(src, Slow(), configs)
    assert await task.synchronize(0) == LLMStatusCode.LLM_TIMEOUT
    assert await task.get_results(0) == [LLMStatusCode.LLM_TIMEOUT] * 2
    assert await task.synchronize(5000) == OK
    assert await task.get_results() == [OK, OK]


async def test_synchronizer_false_stops_the_task(
        accessible: Pair, prefill_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    other = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    await other.init(options(remote_accessible=True))
    try:
        await sender.link_clusters([cluster_info(other.cluster_id, prefill_daemon.peer_address)])
        desc = CacheDesc(10, [1, 64], DataType.DT_UINT8)
        src = await sender.cache_manager.allocate_cache(desc)
        first = await receiver.cache_manager.allocate_cache(desc)
        second = await other.cache_manager.allocate_cache(desc)
        configs = [
            TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(receiver.cluster_id, first.cache_id),
                                       range(3), range(3)),
            TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(other.cluster_id, second.cache_id),
                                       range(2, 4), range(2, 4)),
        ]
        sync = Ready(answer=False)
        task = sender.cache_manager.transfer_cache_async(src, sync, configs)
        assert await task.synchronize() != OK
        assert await task.get_results() == [LLMStatusCode.LLM_PARAM_INVALID, None]
        assert sync.calls == [0]
    finally:
        await sender.unlink_clusters([cluster_info(other.cluster_id,
                                                   prefill_daemon.peer_address)])
        await other.finalize()


async def test_failures_are_reported_per_config(accessible: Pair) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(4, [1, 64], DataType.DT_UINT8)
    src = await sender.cache_manager.allocate_cache(desc)
    missing = TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(receiver.cluster_id, 12345),
                                         range(2), range(2))
    task = sender.cache_manager.transfer_cache_async(src, Ready(), [missing])
    assert await task == [LLMStatusCode.LLM_KV_CACHE_NOT_EXIST]
    small = await receiver.cache_manager.allocate_cache(CacheDesc(2, [1, 64], DataType.DT_UINT8))
    too_far = TransferWithCacheKeyConfig(
        CacheKeyByIdAndIndex(receiver.cluster_id, small.cache_id), range(2), range(2))
    task = sender.cache_manager.transfer_cache_async(src, Ready(), [too_far])
    assert await task == [LLMStatusCode.LLM_PARAM_INVALID]  # layer 1 has no destination


async def test_cancel_leaves_both_sides_usable(accessible: Pair) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(16, [1, 1 << 16], DataType.DT_UINT8)
    src = await sender.cache_manager.allocate_cache(desc)
    fill(src)
    dst = await receiver.cache_manager.allocate_cache(desc)
    key = CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id)
    config = TransferWithCacheKeyConfig(key, range(8), range(8))
    # Cancelled mid-transfer: layers 0 and 1 have landed and layer 2 is being computed.
    sync = HoldAt(2)
    task = sender.cache_manager.transfer_cache_async(src, sync, [config])
    try:
        await sync.wait_reached()
        await until_landed(dst, src, range(4), "layers 0 and 1 never arrived")
        task.cancel()
        assert await task.synchronize(5000) == LLMStatusCode.LLM_TIMEOUT  # the default code
        assert task.done()
    finally:
        sync.release.set()
    again = sender.cache_manager.transfer_cache_async(src, Ready(), [config])
    assert await again == [OK]
    for i in range(16):
        np.testing.assert_array_equal(raw(dst, i), raw(src, i))


async def test_validation_before_anything_starts(accessible: Pair, pair: Pair) -> None:
    cm = accessible.decoder.cache_manager
    desc = CacheDesc(4, [2, 64], DataType.DT_UINT8)
    src = await cm.allocate_cache(desc)
    key = CacheKeyByIdAndIndex(accessible.prompt.cluster_id, 1)
    good = TransferWithCacheKeyConfig(key, range(1), range(1))
    sync = Ready()
    cases: list[tuple[dict[str, object], type[Exception], str]] = [
        ({"src_cache": None}, TypeError, ""),
        ({"src_cache": "cache"}, TypeError, ""),
        ({"dst_block_indices": [0, "1"]}, TypeError, ""),
        ({"src_block_indices": [-1]}, ValueError, ""),
        ({"dst_block_memory_size": -1}, ValueError, ""),
        ({"src_block_indices": [0], "dst_block_indices": []}, LLMException, "blocks to cache"),
        ({"src_block_indices": [0], "dst_block_indices": [0, 1]}, LLMException, "length"),
        ({"dst_block_indices": [0]}, LLMException, "dst_block_memory_size"),
        ({"layer_synchronizer": None}, TypeError, ""),
        ({"transfer_configs": None}, TypeError, ""),
        ({"transfer_configs": [TransferConfig(1, [1, 2])]}, TypeError,
         "enable_remote_cache_accessible"),
        ({"dst_block_memory_size": 1}, LLMException, "None or 0"),
        ({"transfer_configs": [TransferWithCacheKeyConfig(key, range(3), range(3))]},
         LLMException, "out of range"),
        ({"transfer_configs": [TransferWithCacheKeyConfig(key, range(1), range(1), 2)]},
         LLMException, r"src_batch_index 2 out of range: \[0, 2\)"),
    ]
    for change, error, match in cases:
        args: dict[str, object] = {"src_cache": src, "layer_synchronizer": sync,
                                   "transfer_configs": [good], **change}
        with pytest.raises(error, match=match or None):
            cm.transfer_cache_async(**args)  # type: ignore[arg-type]
    odd = await cm.allocate_cache(CacheDesc(3, [1, 64], DataType.DT_UINT8))
    with pytest.raises(LLMException, match="not even"):
        cm.transfer_cache_async(odd, sync, [good])
    host = Cache(5, CacheDesc(2, [1, 8], DataType.DT_UINT8, Placement.HOST), [1, 2])
    with pytest.raises(LLMException):
        cm.transfer_cache_async(host, sync, [good])
    defaulted = TransferConfig(accessible.prompt.cluster_id, [1, 2, 3, 4])
    plain_src = await pair.decoder.cache_manager.allocate_cache(desc)
    task = pair.decoder.cache_manager.transfer_cache_async(plain_src, Ready(), [defaulted])
    assert defaulted.src_layer_range == range(2)  # assigned on the user's object
    assert await task.synchronize() != OK  # no link from this cluster
    assert sync.calls == []


async def test_cancelling_the_awaiter_cancels_the_task(accessible: Pair) -> None:
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(8, [1, 4096], DataType.DT_UINT8)
    src = await sender.cache_manager.allocate_cache(desc)
    dst = await receiver.cache_manager.allocate_cache(desc)
    key = CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id)
    sync = HoldAt(1)  # the awaiter is cancelled while layer 1 is being computed
    task = sender.cache_manager.transfer_cache_async(
        src, sync, [TransferWithCacheKeyConfig(key, range(0, 4), range(0, 4))])
    waiter = asyncio.ensure_future(task)
    try:
        await sync.wait_reached()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await task.synchronize(5000) == LLMStatusCode.LLM_TIMEOUT and task.done()
    finally:
        sync.release.set()
    # Once layer 1's answer is in, the synchronizer's thread ends without asking for more.
    await sync.wait_thread_ended()
    assert len(sync.calls) < 4  # it stopped asking for layers
    assert sync.calls == [0, 1]


@pytest_asyncio.fixture
async def legacy(prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
                 next_cluster_id: Callable[[], int]) -> AsyncIterator[tuple[Pair, LLMDataDist]]:
    """Remote-cache-accessible off: a sender linked to two receivers (TransferConfig)."""
    made = await make_pair(decode_daemon, prefill_daemon, next_cluster_id)
    second = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    await second.init(options())
    await made.decoder.link_clusters([cluster_info(second.cluster_id,
                                                   prefill_daemon.peer_address)])
    yield made, second
    await made.decoder.finalize()
    await made.prompt.finalize()
    await second.finalize()


async def test_transfer_config_writes_blocks_to_raw_remote_addresses(
        legacy: tuple[Pair, LLMDataDist]) -> None:
    pair, _ = legacy
    sender, receiver = pair.decoder, pair.prompt
    desc = CacheDesc(4, [16, 1024], DataType.DT_UINT8)  # 2 layers of 16 blocks
    src = await sender.cache_manager.allocate_blocks_cache(desc)
    fill(src)
    dst = await receiver.cache_manager.allocate_blocks_cache(desc)
    before = [raw(dst, i).copy() for i in range(4)]
    # The addresses name each destination tensor's block 0; blocks are counted from there.
    config = TransferConfig(receiver.cluster_id, list(dst.tensor_addrs), range(0, 2))
    task = sender.cache_manager.transfer_cache_async(src, Ready(), [config], [0, 1, 5],
                                                     [9, 10, 2])
    assert await task == [OK]
    for i in range(4):
        np.testing.assert_array_equal(raw(dst, i)[[9, 10, 2]], raw(src, i)[[0, 1, 5]])
        untouched = [b for b in range(16) if b not in (9, 10, 2)]
        np.testing.assert_array_equal(raw(dst, i)[untouched], before[i][untouched])
    # One continuous slot scattered into blocks at raw addresses.
    slot = await sender.cache_manager.allocate_cache(CacheDesc(4, [1, 3 * 1024],
                                                               DataType.DT_UINT8))
    fill(slot)
    task = sender.cache_manager.transfer_cache_async(
        slot, Ready(), [config], dst_block_indices=[12, 3, 4], dst_block_memory_size=1024)
    assert await task == [OK]
    for i in range(4):
        np.testing.assert_array_equal(raw(dst, i)[[12, 3, 4]].reshape(-1), raw(slot, i)[0])


async def test_transfer_config_writes_to_raw_remote_addresses(
        legacy: tuple[Pair, LLMDataDist]) -> None:
    pair, second = legacy
    sender, receiver = pair.decoder, pair.prompt
    desc = CacheDesc(10, [2, 2048], DataType.DT_UINT8)  # 5 layers, 2 slots
    src = await sender.cache_manager.allocate_cache(desc)
    fill(src)
    first_dst = await receiver.cache_manager.allocate_cache(desc)
    second_dst = await second.cache_manager.allocate_cache(desc)
    stride = desc.size // 2

    def addrs(cache: Cache, layers: range, slot: int) -> list[int]:
        return [cache.tensor_addrs[t] + slot * stride
                for layer in layers for t in (2 * layer, 2 * layer + 1)]

    class SlowFirst(LayerSynchronizer):
        def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
            if layer_index == 0:
                time.sleep(0.3)
            return True

    # the pinned legacy shape: 6 addresses for layers 0..2, 4 for layers 2..3
    configs = [TransferConfig(receiver.cluster_id, addrs(first_dst, range(0, 3), 1),
                              range(0, 3), src_batch_index=0),
               TransferConfig(second.cluster_id, addrs(second_dst, range(2, 4), 0),
                              range(2, 4), src_batch_index=1)]
    task = sender.cache_manager.transfer_cache_async(src, SlowFirst(), configs)
    assert await task.synchronize(0) == LLMStatusCode.LLM_TIMEOUT
    assert await task.get_results(0) == [LLMStatusCode.LLM_TIMEOUT] * 2
    assert await task.synchronize(1000) == OK
    assert await task.get_results() == [OK, OK]
    for t in range(6):
        np.testing.assert_array_equal(raw(first_dst, t)[1], raw(src, t)[0])
    for t in range(4, 8):
        np.testing.assert_array_equal(raw(second_dst, t)[0], raw(src, t)[1])
    outside = TransferConfig(receiver.cluster_id, [1 << 40, 1 << 40], range(0, 1))
    task = sender.cache_manager.transfer_cache_async(src, Ready(), [outside])
    assert await task == [LLMStatusCode.LLM_PARAM_INVALID]  # not inside a receiver cache


async def test_layerwise_inside_one_daemon(prefill_daemon: DaemonProcess,
                                           next_cluster_id: Callable[[], int]) -> None:
    for accessible_mode in (True, False):
        pair = await make_pair(prefill_daemon, prefill_daemon, next_cluster_id,
                               remote_accessible=accessible_mode)
        sender, receiver = pair.decoder, pair.prompt
        try:
            desc = CacheDesc(4, [1, 8192], DataType.DT_UINT8)
            src = await sender.cache_manager.allocate_cache(desc)
            fill(src)
            dst = await receiver.cache_manager.allocate_cache(desc)
            if accessible_mode:
                config: TransferConfig | TransferWithCacheKeyConfig = TransferWithCacheKeyConfig(
                    CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id), range(0, 2),
                    range(0, 2))
            else:
                config = TransferConfig(receiver.cluster_id, list(dst.tensor_addrs), range(0, 2))
            task = sender.cache_manager.transfer_cache_async(src, Ready(), [config])
            assert await task == [OK]
            for t in range(4):
                np.testing.assert_array_equal(raw(dst, t), raw(src, t))
        finally:
            await sender.finalize()
            await receiver.finalize()


@pytest.mark.parametrize("lane", [True, False])
async def test_layers_go_as_lane_calls_or_stream_messages(
        lane: bool, prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    receiver = LLMDataDist(LLMRole.PROMPT, next_cluster_id(),
                           daemon=prefill_daemon.client_target)
    sender = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode_daemon.client_target,
                         transfer_lane=lane)
    await receiver.init(options(remote_accessible=True))
    await sender.init(options(remote_accessible=True))
    try:
        status, _ = await sender.link_clusters(
            [cluster_info(receiver.cluster_id, prefill_daemon.peer_address)], timeout=5000)
        assert status == OK
        desc = CacheDesc(8, [2, 4096], DataType.DT_UINT8)  # 4 layers
        src = await sender.cache_manager.allocate_cache(desc)
        fill(src)
        dst = await receiver.cache_manager.allocate_cache(desc)
        calls_before = await _lane_calls(decode_daemon, sender.cluster_id)
        config = TransferWithCacheKeyConfig(
            CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id, 1), range(4), range(4))
        assert await sender.cache_manager.transfer_cache_async(src, Ready(), [config]) == [OK]
        for tensor in range(8):
            np.testing.assert_array_equal(raw(dst, tensor)[1], raw(src, tensor)[0])
        calls = await _lane_calls(decode_daemon, sender.cluster_id) - calls_before
        assert calls == (4 if lane else 0)  # one LayerReady per layer on the lane
    finally:
        await sender.finalize()
        await receiver.finalize()


async def test_thread_lanes_are_reused_and_async_synchronizers_send_from_the_loop(
        accessible: Pair) -> None:
    """A blocking synchronizer's task takes one more lane connection of the session
    (its thread writes there), handed on to the next task; an ``async def``
    synchronizer's layers go on the session's lane itself."""
    sender, receiver = accessible.decoder, accessible.prompt
    desc = CacheDesc(8, [1, 4096], DataType.DT_UINT8)  # 4 layers
    src = await sender.cache_manager.allocate_cache(desc)
    dst = await receiver.cache_manager.allocate_cache(desc)
    config = TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id),
                                        range(4), range(4))

    class AsyncReady(LayerSynchronizer):
        async def synchronize_layer(self, layer_index: int,  # type: ignore[override]
                                    timeout_in_millis: int | None) -> bool:
            return True

    assert await sender.cache_manager.transfer_cache_async(src, AsyncReady(), [config]) == [OK]
    assert (await _lane_use(accessible.decoder_daemon, sender.cluster_id))[0] == 1
    for _ in range(3):
        assert await sender.cache_manager.transfer_cache_async(src, Ready(), [config]) == [OK]
    connections, calls = await _lane_use(accessible.decoder_daemon, sender.cluster_id)
    assert connections == 2
    assert await sender.cache_manager.transfer_cache_async(src, AsyncReady(), [config]) == [OK]
    assert await _lane_use(accessible.decoder_daemon, sender.cluster_id) == (2, calls + 4)


async def _lane_use(daemon: DaemonProcess, cluster_id: int) -> tuple[int, int]:
    """A session's lane connections and the calls they carried."""
    status = await daemon_status(daemon.client_target)
    session = next(s for s in status.sessions if s.cluster_id == cluster_id)
    return session.lane_connections, session.lane_calls


async def _lane_calls(daemon: DaemonProcess, cluster_id: int) -> int:
    return (await _lane_use(daemon, cluster_id))[1]
