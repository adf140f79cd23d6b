"""Registered memory: register_cache, register_blocks_cache, unregister_cache."""

from __future__ import annotations

from collections.abc import Sequence

from hixl_wire._proto.hixl.v1 import client_pb2

from ._manager_base import ManagerBase, desc_to_proto, key_to_proto
from ._memory import PoolMapping, bind_process
from ._validation import check_int64, check_isinstance
from .cache import Cache
from .device_buffer import DeviceShareableBuffer, locate_device
from .keys import BlocksCacheKey, CacheKey
from .shareable import ShareableBuffer, find
from .status import LLMException, LLMStatusCode, raise_if_false
from .types import CacheDesc, MemInfo, Memtype, Placement


class RegisterOps(ManagerBase):
    """Caches over the caller's own (shareable) memory; hixl never frees it."""

    async def register_cache(self, cache_desc: CacheDesc, addrs: list[int],
                             cache_keys: Sequence[CacheKey] = (),
                             remote_accessible: bool | None = None) -> Cache:
        """Describe user memory as a continuous cache.

        Args:
            cache_desc: the layout of each tensor.
            addrs: one address per tensor. HOST memory: inside one buffer from
                ``hixl_client.alloc_shareable`` (zero copy), inside one of the
                cluster's pools, or memory this process allocated itself (numpy,
                torch CPU tensors, mmap, malloc: the daemon reaches it with
                process_vm_readv/writev). DEVICE memory on a daemon with the
                hccl backend: inside one ``alloc_device_shareable`` buffer.
            cache_keys: the i-th key binds batch slot i (later registrations of
                the same key win).
            remote_accessible: whether linked peers may push into it; default True
                for DEVICE placement, False for HOST.

        Raises:
            TypeError: wrong argument types (``addrs`` must be a list).
            LLMException: no addresses, a count that differs from ``num_tensors``,
                a zero address, memory the daemon cannot reach (not mapped here,
                or the kernel forbids it: the message says why), or remote access
                asked after ``link`` (``LLM_PARAM_INVALID``).
        """
        self._check_is_inited()
        check_isinstance("cache_desc", cache_desc, CacheDesc)
        check_isinstance("addrs", addrs, list, int, allow_none=False)
        check_isinstance("cache_keys", cache_keys, [list, tuple], CacheKey)
        check_isinstance("remote_accessible", remote_accessible, bool)
        raise_if_false(not (self._is_call_linked and remote_accessible is True),
                       "you can not register remote accessible cache after link.")
        raise_if_false(len(addrs) > 0, "addrs should not be empty.")
        raise_if_false(len(addrs) == cache_desc.num_tensors, "the number of addrs {0} should "
                       "equal num_tensors {1}.", len(addrs), cache_desc.num_tensors)
        raise_if_false(all(a != 0 for a in addrs), "addrs should not contain 0.")
        return await self._register(cache_desc, addrs, list(cache_keys), None,
                                    remote_accessible, blocks=False)

    async def register_blocks_cache(self, cache_desc: CacheDesc, addrs: list[int],
                                    blocks_cache_key: BlocksCacheKey | None = None,
                                    remote_accessible: bool | None = None) -> Cache:
        """Describe user memory as a blocks cache (``shape[0]`` blocks per tensor).

        Raises:
            TypeError: wrong argument types.
            LLMException: as `register_cache`; the daemon checks the address count.
        """
        self._check_is_inited()
        check_isinstance("cache_desc", cache_desc, CacheDesc)
        check_isinstance("addrs", addrs, list, int, allow_none=False)
        check_isinstance("blocks_cache_key", blocks_cache_key, BlocksCacheKey)
        check_isinstance("remote_accessible", remote_accessible, bool)
        raise_if_false(not (self._is_call_linked and remote_accessible is True),
                       "you can not register remote accessible cache after link.")
        return await self._register(cache_desc, addrs, [], blocks_cache_key,
                                    remote_accessible, blocks=True)

    async def unregister_cache(self, cache_id: int) -> None:
        """Forget a registered cache (unknown ids succeed); the memory stays the caller's.

        Raises:
            TypeError / ValueError: ``cache_id`` is not an int64.
        """
        self._check_is_inited()
        check_isinstance("cache_id", cache_id, int, allow_none=False)
        check_int64("cache_id", cache_id)
        await self._connection.call("UnregisterCache",
                                    client_pb2.UnregisterCacheRequest(cache_id=cache_id))

    async def _register(self, desc: CacheDesc, addrs: list[int], keys: list[CacheKey],
                        blocks_key: BlocksCacheKey | None, remote_accessible: bool | None,
                        blocks: bool) -> Cache:
        accessible = (remote_accessible if remote_accessible is not None
                      else desc.placement == Placement.DEVICE)
        if self._is_call_linked:
            accessible = False
        on_device = locate_device(addrs, desc.size)
        buffer: ShareableBuffer | DeviceShareableBuffer | None = None
        pool = None
        client_addrs: list[int] = []
        offsets: list[int] = []
        buffer_id = 0
        if on_device is not None:
            buffer, offsets = on_device
            buffer_id = await self._device_buffer_id(buffer)
        elif addrs and (found := find(addrs, desc.size)) is not None:
            buffer, offsets = found
            buffer_id = await self._buffer_id(buffer)
        elif addrs and (pool := self._pool_holding(addrs, desc.size)) is not None:
            offsets = [a - pool.base for a in addrs]
        elif addrs:
            # Memory the engine allocated itself: the daemon reaches it in this
            # process, which it learns from the kernel when we bind (a daemon
            # with the hccl backend refuses it).
            await self._bind_process()
            client_addrs = list(addrs)
        request = client_pb2.RegisterCacheRequest(
            desc=desc_to_proto(desc), buffer_id=buffer_id, tensor_offsets=offsets,
            keys=[key_to_proto(k) for k in keys], blocks=blocks,
            has_blocks_key=blocks_key is not None, remote_accessible=accessible,
            buffer_address=buffer.address if buffer is not None else 0,
            client_addrs=client_addrs, in_pool=pool is not None,
            pool_id=pool.pool_id if pool is not None else 0)
        if blocks_key is not None:
            request.blocks_key.model_id = blocks_key.model_id
        reply = await self._connection.call("RegisterCache", request)
        cache = Cache(reply.cache_id, desc, list(addrs), self, is_registered=True,
                      is_blocks_cache=blocks)
        if isinstance(buffer, DeviceShareableBuffer):
            cache._bind_pool(PoolMapping(0, desc.placement, device=buffer.buffer), offsets)
        elif buffer is not None:
            cache._bind_pool(PoolMapping(0, desc.placement, mapping=buffer._mapping), offsets)
        elif pool is not None:
            cache._bind_pool(pool, offsets)
        return cache

    def _pool_holding(self, addrs: list[int], length: int) -> PoolMapping | None:
        """The cluster's host pool (as mapped here) holding every tensor, if one does."""
        for pool in self._pools.values():
            if pool.mapping is None:
                continue
            base, end = pool.base, pool.base + pool.size
            if all(base <= a and a + length <= end for a in addrs):
                return pool
        return None

    async def _bind_process(self) -> None:
        """Bind this process to the cluster on the daemon's fd socket, once."""
        if not self._process_bound:
            await bind_process(self._fd_socket, self._upload_token)
            self._process_bound = True

    async def remap_registered_memory(self, mem_infos: MemInfo | list[MemInfo]) -> None:
        """LLM-DataDist's reserved remap call: validated, then not available here.

        Raises:
            LLMException: malformed ``mem_infos`` (``LLM_PARAM_INVALID``), then
                ``LLM_FEATURE_NOT_ENABLED``.
        """
        self._check_is_inited()
        infos = [mem_infos] if isinstance(mem_infos, MemInfo) else mem_infos
        raise_if_false(isinstance(infos, list), "mem_infos should be a MemInfo or a list of "
                       "MemInfo, but got {0}.", type(mem_infos))
        for info in infos:
            raise_if_false(isinstance(info, MemInfo), "mem_infos should only hold MemInfo.")
            raise_if_false(info.mem_type == Memtype.MEM_TYPE_DEVICE, "only device memory can "
                           "be remapped.")
            raise_if_false(info.addr != 0, "addr should not be 0.")
            raise_if_false(info.size > 0, "size should be > 0.")
        raise LLMException("remap_registered_memory is not available on hixl's host backend",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
