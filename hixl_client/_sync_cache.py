"""Blocking CacheManager and CacheTask of ``hixl_client.sync``.

Each method runs the async `hixl_client.CacheManager` coroutine of the same
name on the facade's loop thread and returns its result; the async layer does
all validation. Block transfers, the calls engines make per request, run on
the calling thread instead: the async layer checks them and builds the
request there, and the thread's blocking carrier takes it (its own lane
connection, ``_blocking_lane``). A method the async CacheManager of this
release lacks raises ``LLMException(LLM_FEATURE_NOT_ENABLED)``.

Every method has its async twin's parameters (``tests/client/test_sync_parity.py``
checks it), so LLM-DataDist's signatures plus hixl's keyword-only ``checksum=``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from ._blocking_lane import ThreadLanes
from ._sync_loop import call_method, ensure_not_in_loop
from .cache import Cache
from .status import LLMStatusCode

if TYPE_CHECKING:
    from .cache_manager import CacheManager as _AsyncCacheManager
    from .keys import BlocksCacheKey, CacheKey, CacheKeyByIdAndIndex
    from .transfer_config import TransferConfig, TransferWithCacheKeyConfig
    from .types import CacheDesc, LayerSynchronizer, MemInfo

__all__ = ["AsyncCacheTask", "CacheManager", "CacheTask"]

_OWNER = "CacheManager"


class AsyncCacheTask(Protocol):
    """What `CacheTask` wraps: the async client's layer-wise transfer task."""

    async def synchronize(self, timeout_in_millis: int | None) -> LLMStatusCode:
        """Wait for the task; see `CacheTask.synchronize`."""

    async def get_results(self, timeout_in_millis: int | None) -> list[LLMStatusCode | None]:
        """Wait for the task; see `CacheTask.get_results`."""


class CacheTask:
    """A running ``transfer_cache_async`` job, waited on from any plain thread.

    Created by `CacheManager.transfer_cache_async`. Waiting with a timeout
    never stops the transfer: a task that is still running can be waited on
    again.

    Args:
        transfer_async_task: the async client's task.
    """

    def __init__(self, transfer_async_task: AsyncCacheTask) -> None:
        self._task = transfer_async_task

    def synchronize(self, timeout_in_millis: int | None = None) -> LLMStatusCode:
        """Wait for the whole transfer.

        Args:
            timeout_in_millis: how long to wait (uint32); None waits until the end.

        Returns:
            ``LLM_TIMEOUT`` if the task is still running at the deadline; else the
            first per-config failure, or ``LLM_SUCCESS``.

        Raises:
            TypeError / ValueError: ``timeout_in_millis`` is not a uint32.
        """
        status: LLMStatusCode = call_method(self._task, "CacheTask", "synchronize",
                                            timeout_in_millis)
        return status

    def get_results(self, timeout_in_millis: int | None = None) -> list[LLMStatusCode | None]:
        """Wait for the transfer, then report each config's outcome.

        Args:
            timeout_in_millis: how long to wait (uint32); None waits until the end.

        Returns:
            One entry per transfer config, in order: its status, ``None`` for a
            config whose layers were never attempted, or ``LLM_TIMEOUT`` for every
            config if the task is still running at the deadline.

        Raises:
            TypeError / ValueError: ``timeout_in_millis`` is not a uint32.
        """
        results: list[LLMStatusCode | None] = call_method(
            self._task, "CacheTask", "get_results", timeout_in_millis)
        return results


class CacheManager:
    """LLM-DataDist's blocking CacheManager over `hixl_client.CacheManager`.

    Obtained from ``LLMDataDist.cache_manager``. Every method blocks the
    calling thread, may be called from several threads at once, and raises
    exactly what the async method raises. After ``LLMDataDist.finalize`` every
    method raises ``LLMException(LLM_ENGINE_FINALIZED)``.

    Args:
        cache_manager: the async cache manager to drive.
    """

    def __init__(self, cache_manager: _AsyncCacheManager) -> None:
        self._async = cache_manager
        self._lanes_made = threading.Lock()
        self._lanes: ThreadLanes | None = None  # made by the first block transfer

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return call_method(self._async, _OWNER, name, *args, **kwargs)

    def _transfer_here(self, operation: str, request: Any) -> None:
        """Send a checked transfer from this thread, on its blocking carrier
        (``ThreadLanes.carrier``: its lane, else the loop thread)."""
        if self._lanes is None:
            with self._lanes_made:
                if self._lanes is None:
                    self._lanes = ThreadLanes(self._async._connection)
        self._async._call_transfer_blocking(self._lanes.carrier(request), operation, request)

    def _close_lanes(self) -> None:
        """Close the calling threads' lanes (at finalize)."""
        with self._lanes_made:
            if self._lanes is not None:
                self._lanes.close()

    def allocate_cache(self, cache_desc: CacheDesc,
                       cache_keys: tuple[CacheKey, ...] | list[CacheKey] = ()) -> Cache:
        """Allocate a continuous cache from the pool of its placement.

        Args:
            cache_desc: the layout of every tensor.
            cache_keys: the i-th key binds batch slot i.

        Returns:
            The cache, with addresses valid in this process.
        """
        cache: Cache = self._call("allocate_cache", cache_desc, cache_keys)
        return cache

    def allocate_blocks_cache(self, cache_desc: CacheDesc,
                              blocks_cache_key: BlocksCacheKey | None = None) -> Cache:
        """Allocate a blocks (paged) cache; ``shape[0]`` is the number of blocks.

        Returns:
            The blocks cache.
        """
        cache: Cache = self._call("allocate_blocks_cache", cache_desc, blocks_cache_key)
        return cache

    def register_cache(self, cache_desc: CacheDesc, addrs: list[int],
                       cache_keys: tuple[CacheKey, ...] | list[CacheKey] = (),
                       remote_accessible: bool | None = None) -> Cache:
        """Describe user memory (one address per tensor) as a continuous cache.

        Returns:
            The registered cache (its memory stays the caller's).
        """
        cache: Cache = self._call("register_cache", cache_desc, addrs, cache_keys,
                                  remote_accessible)
        return cache

    def register_blocks_cache(self, cache_desc: CacheDesc, addrs: list[int],
                              blocks_cache_key: BlocksCacheKey | None = None,
                              remote_accessible: bool | None = None) -> Cache:
        """Describe user memory (one address per tensor) as a blocks cache.

        Returns:
            The registered blocks cache.
        """
        cache: Cache = self._call("register_blocks_cache", cache_desc, addrs,
                                  blocks_cache_key, remote_accessible)
        return cache

    def unregister_cache(self, cache_id: int) -> None:
        """Forget a registered cache (unknown ids are a no-op)."""
        self._call("unregister_cache", cache_id)

    def deallocate_cache(self, cache: Cache) -> None:
        """Drop the cache's id reference; its memory goes once no key holds it."""
        self._call("deallocate_cache", cache)

    def deallocate_blocks_cache(self, cache: Cache) -> None:
        """Free a blocks cache and its blocks key at once."""
        self._call("deallocate_blocks_cache", cache)

    def remove_cache_key(self, cache_key: CacheKey) -> None:
        """Unbind a key (a no-op when it is not bound)."""
        self._call("remove_cache_key", cache_key)

    def copy_cache(self, dst: Cache, src: Cache, dst_batch_index: int = 0,
                   src_batch_index: int = 0, offset: int = 0, size: int = -1,
                   req_id: int | None = None) -> None:
        """Copy one batch slot of ``src`` into one of ``dst``, tensor by tensor."""
        self._call("copy_cache", dst, src, dst_batch_index, src_batch_index, offset, size,
                   req_id)

    def copy_blocks(self, cache: Cache, copy_block_info: dict[int, list[int]]) -> None:
        """Copy blocks inside one blocks cache: ``{src_block: [dst_block, ...]}``."""
        self._call("copy_blocks", cache, copy_block_info)

    def swap_blocks(self, src_cache: Cache, dst_cache: Cache,
                    src_to_dst: dict[int, int]) -> None:
        """Copy blocks between a HOST and a DEVICE blocks cache: ``{src: dst}``."""
        self._call("swap_blocks", src_cache, dst_cache, src_to_dst)

    def pull_cache(self, cache_key: CacheKey | CacheKeyByIdAndIndex, cache: Cache,
                   batch_index: int = 0, size: int = -1, *, checksum: bool | None = None,
                   **kwargs: Any) -> None:
        """Copy a remote cache slot into batch slot ``batch_index`` of ``cache``.

        Args:
            cache_key: the remote slot, by key or by cache id and batch index.
            cache: the local continuous destination cache.
            batch_index: the destination slot.
            size: bytes per tensor, -1 for the whole slot.
            checksum: hixl's extension: the bytes carry a CRC-32C over a TCP link
                (``LLM_LINK_FAILED`` if they arrive changed); None: the daemon's
                ``[transfer] checksum``.
            **kwargs: ``src_layer_range``, ``dst_layer_range``, ``tensor_num_per_layer``.
        """
        self._call("pull_cache", cache_key, cache, batch_index, size, checksum=checksum,
                   **kwargs)

    def pull_blocks(self, src_cache_key: CacheKey | CacheKeyByIdAndIndex | BlocksCacheKey,
                    dst_cache: Cache, src_blocks: tuple[int, ...] | list[int] | None = (),
                    dst_blocks: tuple[int, ...] | list[int] = (), *,
                    checksum: bool | None = None, **kwargs: Any) -> None:
        """Copy remote blocks (or a remote cache slot) into blocks of ``dst_cache``.

        Args:
            src_cache_key: the remote blocks cache or cache slot.
            dst_cache: the local blocks cache.
            src_blocks: remote block indices (empty for a cache slot source).
            dst_blocks: local block indices, pairwise with ``src_blocks``.
            checksum: as for `pull_cache`.
            **kwargs: ``src_layer_range``, ``dst_layer_range``, ``tensor_num_per_layer``.
        """
        ensure_not_in_loop()
        request = self._async._pull_blocks_request(src_cache_key, dst_cache, src_blocks,
                                                   dst_blocks, checksum=checksum, **kwargs)
        self._transfer_here("pull_blocks", request)

    def push_cache(self, dst_cache_key: CacheKeyByIdAndIndex, src_cache: Cache,
                   src_batch_index: int = 0, src_layer_range: range | None = None,
                   dst_layer_range: range | None = None, size: int = -1,
                   tensor_num_per_layer: int = 2, *, checksum: bool | None = None) -> None:
        """Write a local cache slot into a remote cache (remote-cache-accessible mode);
        ``checksum``: as for `pull_cache`."""
        self._call("push_cache", dst_cache_key, src_cache, src_batch_index, src_layer_range,
                   dst_layer_range, size, tensor_num_per_layer, checksum=checksum)

    def push_blocks(self, dst_cache_key: BlocksCacheKey, src_cache: Cache,
                    src_blocks: tuple[int, ...] | list[int] = (),
                    dst_blocks: tuple[int, ...] | list[int] = (),
                    src_layer_range: range | None = None, dst_layer_range: range | None = None,
                    tensor_num_per_layer: int = 2, *, checksum: bool | None = None) -> None:
        """Write local blocks into a remote blocks cache (remote-cache-accessible mode);
        ``checksum``: as for `pull_cache`."""
        ensure_not_in_loop()
        request = self._async._push_blocks_request(dst_cache_key, src_cache, src_blocks,
                                                   dst_blocks, src_layer_range, dst_layer_range,
                                                   tensor_num_per_layer, checksum=checksum)
        if request is not None:
            self._transfer_here("push_blocks", request)

    def transfer_cache_async(
        self, src_cache: Cache, layer_synchronizer: LayerSynchronizer,
        transfer_configs: list[TransferConfig | TransferWithCacheKeyConfig]
        | tuple[TransferConfig | TransferWithCacheKeyConfig, ...],
        src_block_indices: list[int] | tuple[int, ...] | None = None,
        dst_block_indices: list[int] | tuple[int, ...] | None = None,
        dst_block_memory_size: int | None = None,
    ) -> CacheTask:
        """Start a layer-wise transfer of ``src_cache`` to one or more clusters.

        Args:
            src_cache: the local source cache.
            layer_synchronizer: tells the transfer when each layer is ready.
            transfer_configs: one config per destination.
            src_block_indices: source blocks, for a blocks source.
            dst_block_indices: destination blocks, for a blocks destination.
            dst_block_memory_size: bytes per destination block (cache to blocks).

        Returns:
            The running task; wait on it with ``synchronize`` or ``get_results``.
        """
        task = self._call("transfer_cache_async", src_cache, layer_synchronizer,
                          transfer_configs, src_block_indices, dst_block_indices,
                          dst_block_memory_size)
        return CacheTask(task)

    def remap_registered_memory(self, mem_infos: MemInfo | list[MemInfo]) -> None:
        """Re-establish registered device memory after a memory fault (reserved)."""
        self._call("remap_registered_memory", mem_infos)
