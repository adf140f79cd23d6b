"""CacheManager: LLM-DataDist's cache operations as coroutines over the daemon.

Every method validates its arguments exactly as LLM-DataDist does (same
exception types, messages naming the argument, status codes) before any RPC,
then lets the daemon do the work. The operations are grouped by concern:
allocation here, transfers between clusters in ``_transfer_ops``, copies
inside the cluster in ``_copy_ops``, user memory in ``_register_ops``.
"""

from __future__ import annotations

from collections.abc import Sequence

from hixl_wire._proto.hixl.v1 import client_pb2

from ._copy_ops import CopyOps
from ._manager_base import desc_to_proto, key_to_proto
from ._register_ops import RegisterOps
from ._transfer_ops import TransferOps
from ._validation import check_isinstance
from .cache import Cache
from .keys import BlocksCacheKey, CacheKey
from .status import raise_if_false
from .types import CacheDesc, Placement


class CacheManager(TransferOps, CopyOps, RegisterOps):
    """Allocates caches in the daemon's pools and moves them between clusters.

    Created by ``LLMDataDist.init``; after ``finalize`` every method raises
    ``LLMException(LLM_ENGINE_FINALIZED)`` without calling the daemon.
    """

    async def allocate_cache(self, cache_desc: CacheDesc,
                             cache_keys: Sequence[CacheKey] = ()) -> Cache:
        """Allocate a continuous cache from the pool of its placement.

        Args:
            cache_desc: the layout; ``num_tensors`` tensors of ``shape``.
            cache_keys: the i-th key binds batch slot i; ``req_id = 2**64-1`` holds
                a slot without a key.

        Returns:
            The cache, with addresses valid in this process.

        Raises:
            TypeError: wrong argument types.
            LLMException: ``num_tensors`` is 0, no pool for the placement
                (``LLM_PARAM_INVALID``), the pool is exhausted (``LLM_OUT_OF_MEMORY``)
                or a key rule is broken.
        """
        self._check_is_inited()
        check_isinstance("cache_desc", cache_desc, CacheDesc)
        check_isinstance("cache_keys", cache_keys, [list, tuple], CacheKey)
        return await self._allocate(cache_desc, list(cache_keys), blocks=False)

    async def _allocate(self, cache_desc: CacheDesc, keys: list[CacheKey], blocks: bool,
                        blocks_key: BlocksCacheKey | None = None) -> Cache:
        raise_if_false(cache_desc.num_tensors > 0, "cache_desc.num_tensors must be > 0, "
                       "but got {0}.", cache_desc.num_tensors)
        placement_ok = ((self._enabled_mem_pool and cache_desc.placement == Placement.DEVICE)
                        or (self._enable_host_mem_pool and cache_desc.placement == Placement.HOST))
        raise_if_false(placement_ok, "you should config memory pool firstly, mem_pool_cfg for "
                       "DEVICE placement or host_mem_pool_cfg for HOST placement.")
        request = client_pb2.AllocateCacheRequest(
            desc=desc_to_proto(cache_desc), keys=[key_to_proto(k) for k in keys], blocks=blocks,
            has_blocks_key=blocks_key is not None)
        if blocks_key is not None:
            request.blocks_key.model_id = blocks_key.model_id
        reply = await self._connection.call("AllocateCache", request)
        pool = self._pools[reply.pool_id]
        offsets = list(reply.tensor_offsets)
        cache = Cache(reply.cache_id, cache_desc, [pool.address(o) for o in offsets], self,
                      is_registered=False, is_blocks_cache=blocks)
        cache._bind_pool(pool, offsets)
        return cache

    async def allocate_blocks_cache(self, cache_desc: CacheDesc,
                                    blocks_cache_key: BlocksCacheKey | None = None) -> Cache:
        """Allocate a paged cache: ``shape[0]`` blocks per tensor.

        Args:
            cache_desc: the layout; ``shape[0]`` is the number of blocks.
            blocks_cache_key: indexes the cache by its model id for remote peers
                (its cluster id is ignored here).

        Returns:
            The blocks cache (``is_blocks_cache`` True); ``cache_desc`` is not changed.

        Raises:
            TypeError: wrong argument types.
            LLMException: as `allocate_cache`; a second blocks cache of the same
                model id (``LLM_PARAM_INVALID``).
        """
        self._check_is_inited()
        check_isinstance("cache_desc", cache_desc, CacheDesc)
        check_isinstance("blocks_cache_key", blocks_cache_key, BlocksCacheKey)
        return await self._allocate(cache_desc, [], blocks=True, blocks_key=blocks_cache_key)

    async def deallocate_blocks_cache(self, cache: Cache) -> None:
        """Free a blocks cache at once, with its blocks key.

        Raises:
            TypeError: ``cache`` is not a Cache.
            LLMException: ``cache`` is not a blocks cache (``LLM_PARAM_INVALID``).
        """
        self._check_is_inited()
        check_isinstance("cache", cache, Cache, allow_none=False)
        raise_if_false(cache.is_blocks_cache, "deallocate_blocks_cache only supports blocks "
                       "cache, please use deallocate_cache.")
        await self._connection.call(
            "DeallocateCache", client_pb2.DeallocateCacheRequest(cache_id=cache.cache_id,
                                                                 blocks=True))
        cache._invalidate()

    async def deallocate_cache(self, cache: Cache) -> None:
        """Drop the cache's id reference; its memory goes once no key holds it either.

        Raises:
            TypeError: ``cache`` is not a Cache.
            LLMException: ``cache`` is a blocks cache (``LLM_PARAM_INVALID``).
        """
        self._check_is_inited()
        check_isinstance("cache", cache, Cache, allow_none=False)
        raise_if_false(not cache.is_blocks_cache, "deallocate_cache does not support blocks "
                       "cache, please use deallocate_blocks_cache.")
        await self._connection.call("DeallocateCache",
                                    client_pb2.DeallocateCacheRequest(cache_id=cache.cache_id))
        cache._invalidate()

    async def remove_cache_key(self, cache_key: CacheKey) -> None:
        """Unbind a key (a no-op when it is not bound).

        Raises:
            TypeError: ``cache_key`` is not a CacheKey.
        """
        self._check_is_inited()
        check_isinstance("cache_key", cache_key, CacheKey, allow_none=False)
        await self._connection.call("RemoveCacheKey",
                                    client_pb2.RemoveCacheKeyRequest(key=key_to_proto(cache_key)))
