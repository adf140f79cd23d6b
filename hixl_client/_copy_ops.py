"""Copies inside the cluster: copy_cache, copy_blocks, swap_blocks."""

from __future__ import annotations

from hixl_wire._proto.hixl.v1 import client_pb2

from ._manager_base import ManagerBase
from ._validation import (
    check_dict,
    check_int64,
    check_isinstance,
    check_uint32,
    check_uint64,
)
from .cache import Cache
from .shareable import locate
from .status import raise_if_false
from .types import Placement


class CopyOps(ManagerBase):
    """Local copy coroutines of the CacheManager."""

    async def copy_cache(self, dst: Cache, src: Cache, dst_batch_index: int = 0,
                         src_batch_index: int = 0, offset: int = 0, size: int = -1,
                         req_id: int | None = None) -> None:
        """Copy one batch slot of every tensor of ``src`` into a slot of ``dst``.

        Args:
            dst: the destination continuous cache.
            src: the source continuous cache (same number of tensors).
            dst_batch_index: the destination slot.
            src_batch_index: the source slot.
            offset: where in the slot to start, in bytes.
            size: bytes per tensor, -1 for the rest of the slot.
            req_id: only used in logs (LLM-DataDist compatibility).

        Raises:
            TypeError / ValueError: wrong argument types.
            LLMException: a blocks cache, a slot or range outside the caches
                (``LLM_PARAM_INVALID``), or an unknown cache (``LLM_KV_CACHE_NOT_EXIST``).
        """
        self._check_is_inited()
        check_isinstance("dst", dst, Cache, allow_none=False)
        check_isinstance("src", src, Cache, allow_none=False)
        check_uint32("dst_batch_index", dst_batch_index)
        check_uint32("src_batch_index", src_batch_index)
        check_uint64("offset", offset)
        check_int64("size", size)
        raise_if_false(size == -1 or size > 0, "size should be -1 or > 0, but got {0}.", size)
        raise_if_false(not dst.is_blocks_cache and not src.is_blocks_cache,
                       "copy_cache does not support blocks cache, please use copy_blocks.")
        if req_id is not None:  # LLM-DataDist only logs it
            check_uint64("req_id", req_id)
        await self._connection.transfer("CopyCache", client_pb2.CopyCacheRequest(
            dst_cache_id=dst.cache_id, src_cache_id=src.cache_id,
            dst_batch_index=dst_batch_index, src_batch_index=src_batch_index, offset=offset,
            size=size))

    async def copy_blocks(self, cache: Cache, copy_block_info: dict[int, list[int]]) -> None:
        """Copy blocks inside one blocks cache: ``{src: [dst, ...]}``, for every tensor.

        Raises:
            TypeError: ``cache`` is not a Cache or the dict is malformed.
            LLMException: not a blocks cache, or a block index out of range
                (``LLM_PARAM_INVALID``).
        """
        self._check_is_inited()
        check_isinstance("cache", cache, Cache, allow_none=False)
        check_isinstance("copy_block_info", copy_block_info, dict, allow_none=False)
        check_dict("copy_block_info", copy_block_info, int, list, int)
        raise_if_false(cache.is_blocks_cache, "copy_blocks only supports blocks cache.")
        pairs = [(src, dst) for src, dsts in copy_block_info.items() for dst in dsts]
        if not pairs:
            return
        await self._connection.transfer("CopyBlocks", client_pb2.CopyBlocksRequest(
            cache_id=cache.cache_id, src_blocks=[s for s, _ in pairs],
            dst_blocks=[d for _, d in pairs]))

    async def swap_blocks(self, src_cache: Cache, dst_cache: Cache,
                          src_to_dst: dict[int, int]) -> None:
        """Move blocks between the HOST and the DEVICE pool (swap out or in).

        Raises:
            TypeError: wrong argument types.
            LLMException: not two blocks caches, different block sizes or tensor
                counts, a block index out of range, a direction other than
                HOST<->DEVICE, or CPU memory outside this cluster's pools
                (``LLM_PARAM_INVALID``).
        """
        self._check_is_inited()
        check_isinstance("src_cache", src_cache, Cache, allow_none=False)
        check_isinstance("dst_cache", dst_cache, Cache, allow_none=False)
        raise_if_false(src_cache.is_blocks_cache and dst_cache.is_blocks_cache,
                       "swap_blocks only supports blocks cache.")
        check_isinstance("src_to_dst", src_to_dst, dict, allow_none=False)
        check_dict("src_to_dst", src_to_dst, int, int)
        src_desc, dst_desc = src_cache.cache_desc, dst_cache.cache_desc
        src_block = src_desc.size // src_desc.batch_size
        dst_block = dst_desc.size // dst_desc.batch_size
        raise_if_false(src_block == dst_block, "block size of src_cache {0} and dst_cache {1} "
                       "should be the same.", src_block, dst_block)
        raise_if_false(src_desc.num_tensors == dst_desc.num_tensors, "num_tensors of src_cache "
                       "and dst_cache should be the same.")
        for src, dst in src_to_dst.items():
            raise_if_false(0 <= src < src_desc.batch_size, "src block {0} is out of range "
                           "[0, {1}).", src, src_desc.batch_size)
            raise_if_false(0 <= dst < dst_desc.batch_size, "dst block {0} is out of range "
                           "[0, {1}).", dst, dst_desc.batch_size)
        directions = {(Placement.HOST, Placement.DEVICE), (Placement.DEVICE, Placement.HOST)}
        raise_if_false((src_desc.placement, dst_desc.placement) in directions,
                       "swap_blocks only supports HOST to DEVICE or DEVICE to HOST.")
        if not src_to_dst:
            return
        await self._connection.transfer("SwapBlocks", client_pb2.SwapBlocksRequest(
            src=await self._operand(src_cache), dst=await self._operand(dst_cache),
            src_blocks=list(src_to_dst.keys()), dst_blocks=list(src_to_dst.values())))

    async def _operand(self, cache: Cache) -> client_pb2.CacheOperand:
        """Name a cache for the daemon: by id, or by where a CPU cache's tensors lie.

        A CPU cache (``create_cpu_cache``) must lie in one of the cluster's pools
        or in one ``alloc_shareable`` buffer, which is handed to the daemon once.
        """
        if cache.cache_id != -1:
            return client_pb2.CacheOperand(cache_id=cache.cache_id)
        desc = cache.cache_desc
        operand = client_pb2.CacheOperand(cache_id=-1, tensor_size=desc.size,
                                          batch_size=desc.batch_size)
        for pool in self._pools.values():
            base, end = pool.base, pool.base + pool.size
            if all(base <= a and a + desc.size <= end for a in cache.tensor_addrs):
                operand.pool_id = pool.pool_id
                operand.tensor_offsets.extend(a - base for a in cache.tensor_addrs)
                return operand
        buffer, offsets = locate(cache.tensor_addrs, desc.size)
        operand.buffer_id = await self._buffer_id(buffer)
        operand.tensor_offsets.extend(offsets)
        return operand

