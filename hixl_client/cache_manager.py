"""CacheManager: LLM-DataDist's cache operations as coroutines over the daemon.

Every method validates its arguments exactly as LLM-DataDist does (same
exception types, messages naming the argument, status codes) before any RPC,
then lets the daemon do the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._proto.hixl.v1 import client_pb2, common_pb2
from ._validation import (
    check_int64,
    check_isinstance,
    check_uint32,
    layer_range_to_tensor_indices,
)
from .cache import Cache
from .keys import BlocksCacheKey, CacheKey, CacheKeyByIdAndIndex, check_cache_key
from .status import LLMException, LLMStatusCode, raise_if_false
from .types import CacheDesc, Placement

if TYPE_CHECKING:
    from ._memory import PoolMapping
    from ._transport import DaemonConnection

# The daemon bounds a pull by sync_kv_timeout; the RPC deadline only guards
# against a daemon that stopped answering altogether.
PULL_RPC_MARGIN_S = 10.0
_PULL_KWARGS = ("src_layer_range", "dst_layer_range", "tensor_num_per_layer")


def desc_to_proto(desc: CacheDesc) -> common_pb2.CacheDescriptor:
    return common_pb2.CacheDescriptor(
        num_tensors=desc.num_tensors, shape=list(desc.shape), data_type=desc.data_type.value,
        placement=int(desc.placement), batch_dim_index=desc.batch_dim,
        seq_len_dim_index=desc.seq_len_dim_index, tensor_size=desc.size)


def key_to_proto(key: CacheKey) -> common_pb2.CacheKey:
    return common_pb2.CacheKey(cluster_id=key.cluster_id, req_id=key.req_id,
                               model_id=key.model_id, prefix_id=key.prefix_id)


def ref_to_proto(key: CacheKey | CacheKeyByIdAndIndex | BlocksCacheKey) -> common_pb2.CacheRef:
    if isinstance(key, CacheKey):
        return common_pb2.CacheRef(key=key_to_proto(key))
    if isinstance(key, CacheKeyByIdAndIndex):
        return common_pb2.CacheRef(id_and_index=common_pb2.CacheIdAndIndex(
            cluster_id=key.cluster_id, cache_id=key.cache_id, batch_index=key.batch_index))
    return common_pb2.CacheRef(blocks_key=common_pb2.BlocksKey(
        cluster_id=key.cluster_id, model_id=key.model_id))


class CacheManager:
    """Allocates caches in the daemon's pools and moves them between clusters.

    Created by ``LLMDataDist.init``; after ``finalize`` every method raises
    ``LLMException(LLM_ENGINE_FINALIZED)`` without calling the daemon.
    """

    def __init__(self, connection: DaemonConnection, options: dict[str, str],
                 pools: dict[int, PoolMapping]) -> None:
        self._connection = connection
        self._pools = pools
        self._initialized = True
        self._is_call_linked = False
        self._enabled_mem_pool = bool(options.get("llm.MemPoolConfig"))
        self._enable_host_mem_pool = bool(options.get("llm.HostMemPoolConfig"))
        self._enable_remote_cache_accessible = (
            options.get("llm.EnableRemoteCacheAccessible") == "1")
        self._sync_timeout_s = int(options.get("llm.SyncKvCacheWaitTime", "1000")) / 1000.0

    def _check_is_inited(self) -> None:
        if not self._initialized:
            raise LLMException("the LLMDataDist that created this cache manager was finalized",
                               status_code=LLMStatusCode.LLM_ENGINE_FINALIZED)

    def _expire(self) -> None:
        self._initialized = False

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
        reply = await self._connection.call(self._connection.stub.AllocateCache, request)
        pool = self._pools[reply.pool_id]
        offsets = list(reply.tensor_offsets)
        cache = Cache(reply.cache_id, cache_desc, [pool.address(o) for o in offsets], self,
                      is_registered=False, is_blocks_cache=blocks)
        cache._bind_pool(pool, offsets)
        return cache

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
        await self._connection.call(self._connection.stub.DeallocateCache,
                                    client_pb2.DeallocateCacheRequest(cache_id=cache.cache_id))
        cache._invalidate()

    async def remove_cache_key(self, cache_key: CacheKey) -> None:
        """Unbind a key (a no-op when it is not bound).

        Raises:
            TypeError: ``cache_key`` is not a CacheKey.
        """
        self._check_is_inited()
        check_isinstance("cache_key", cache_key, CacheKey, allow_none=False)
        await self._connection.call(self._connection.stub.RemoveCacheKey,
                                    client_pb2.RemoveCacheKeyRequest(key=key_to_proto(cache_key)))

    async def pull_cache(self, cache_key: CacheKey | CacheKeyByIdAndIndex, cache: Cache,
                         batch_index: int = 0, size: int = -1, **kwargs: Any) -> None:
        """Copy a remote cache slot into batch slot ``batch_index`` of ``cache``.

        Args:
            cache_key: the remote slot, by key or by cache id and batch index.
            cache: the local continuous destination cache.
            batch_index: the destination slot (uint32).
            size: bytes per tensor, -1 for the whole destination slot.
            **kwargs: ``src_layer_range`` / ``dst_layer_range`` (``range`` of layers),
                ``tensor_num_per_layer`` (default 2).

        Raises:
            TypeError / ValueError: wrong argument types or ranges.
            LLMException: a broken rule (``LLM_PARAM_INVALID``), no link
                (``LLM_NOT_YET_LINK``), no such remote cache
                (``LLM_KV_CACHE_NOT_EXIST``), or no answer within
                ``sync_kv_timeout`` (``LLM_TIMEOUT``).
        """
        self._check_is_inited()
        unknown = set(kwargs) - set(_PULL_KWARGS)
        if unknown:
            raise TypeError(f"pull_cache() got unexpected keyword arguments {sorted(unknown)}")
        if self._enable_remote_cache_accessible:
            check_isinstance("cache_key", cache_key, CacheKeyByIdAndIndex, allow_none=False,
                             extra_fmt="While enable_remote_cache_accessible is True, ")
        else:
            check_isinstance("cache_key", cache_key, [CacheKey, CacheKeyByIdAndIndex],
                             allow_none=False)
        check_isinstance("cache", cache, Cache, allow_none=False)
        check_uint32("batch_index", batch_index)
        check_int64("size", size)
        raise_if_false(size == -1 or size > 0, "size should be -1 or > 0, but got {0}.", size)
        raise_if_false(not cache.is_blocks_cache, "pull_cache does not support blocks cache, "
                       "please use pull_blocks.")
        per_layer = kwargs.get("tensor_num_per_layer", 2)
        check_uint32("tensor_num_per_layer", per_layer)
        raise_if_false(per_layer > 0, "tensor_num_per_layer should be > 0, but got {0}.",
                       per_layer)
        if isinstance(cache_key, CacheKey):
            check_cache_key(cache_key)
        src_indices, dst_indices = layer_range_to_tensor_indices(
            kwargs.get("src_layer_range"), kwargs.get("dst_layer_range"), per_layer)
        request = client_pb2.PullCacheRequest(
            src=ref_to_proto(cache_key), dst_cache_id=cache.cache_id, batch_index=batch_index,
            size=size, src_tensor_indices=src_indices, dst_tensor_indices=dst_indices,
            tensor_num_per_layer=per_layer)
        await self._connection.call(self._connection.stub.PullCache, request,
                                    timeout=self._sync_timeout_s + PULL_RPC_MARGIN_S)
