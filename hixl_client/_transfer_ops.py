"""Transfers between clusters: pull_cache, pull_blocks, push_cache, push_blocks."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hixl_wire._proto.hixl.v1 import client_pb2
from hixl_wire.lane import RepeatFrame
from hixl_wire.types import TransferShape

from . import timing
from ._layerwise import CacheTask, build_start, drive
from ._manager_base import PULL_KWARGS, ManagerBase, ref_to_proto
from ._transport import CALL_MARGIN_S
from ._validation import (
    check_int64,
    check_isinstance,
    check_layer_range,
    check_list_uint64,
    check_uint32,
    check_uint64,
    layer_range_to_tensor_indices,
)
from .cache import Cache
from .keys import BlocksCacheKey, CacheKey, CacheKeyByIdAndIndex, check_cache_key
from .status import LLMStatusCode, raise_if_false
from .transfer_config import TransferConfig, TransferWithCacheKeyConfig
from .types import LayerSynchronizer, Placement

if TYPE_CHECKING:
    from ._carrier import BlockingCarrier

# The daemon method behind each transfer of the CacheManager.
_RPC_OF = {"pull_cache": "PullCache", "pull_blocks": "PullBlocks", "push_cache": "PushCache",
           "push_blocks": "PushBlocks"}
_UINT32_MAX = 2**32 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _plain_int(value: Any, low: int, high: int) -> bool:
    """The common case of the integer checks, decided without a call per check:
    an exact int in range (anything else goes through the full check and its message)."""
    return type(value) is int and low <= value <= high


_PULL_KWARG_NAMES = frozenset(PULL_KWARGS)


def _plain_layers(layers: Any) -> bool:
    """None, or a step-1 range whose layers are all uint32: the checks would pass."""
    return layers is None or (type(layers) is range and layers.step == 1 and (
        not layers or (0 <= layers.start and layers.stop <= _UINT32_MAX + 1)))


def _layer_tensors(layers: range | None, per_layer: int) -> list[int]:
    """The tensor indices of ``layers`` (already checked); none means every tensor."""
    if not layers:
        return []
    return list(range(layers.start * per_layer, layers.stop * per_layer))


def checksum_to_proto(checksum: Any) -> client_pb2.Checksum:
    """A transfer call's ``checksum`` argument as the request's ``Checksum``: None
    leaves it to the daemon's ``[transfer] checksum``."""
    if checksum is None:
        return client_pb2.CHECKSUM_DEFAULT
    if type(checksum) is not bool:
        raise TypeError(f"checksum should be a bool or None, but got {type(checksum).__name__}")
    return client_pb2.CHECKSUM_ON if checksum else client_pb2.CHECKSUM_OFF


def check_tensor_num_per_layer(value: Any) -> int:
    check_uint32("tensor_num_per_layer", value)
    raise_if_false(value > 0, "tensor_num_per_layer should be > 0, but got {0}.", value)
    return int(value)


_INT_ONLY = {int}


def check_blocks_list(name: str, blocks: Any) -> Sequence[int]:
    """A list/tuple of uint64 block indices (TypeError / ValueError as LLM-DataDist).

    Returns the list or tuple itself: the request message copies it.
    """
    # Block tables run to thousands of entries: check them with C-level builtins
    # (exact ints only: a bool is refused as the reference refuses it), and walk
    # them one by one only to word the error of a bad one.
    if type(blocks) in (list, tuple) and (not blocks or (
            set(map(type, blocks)) == _INT_ONLY and min(blocks) >= 0 and max(blocks) < 2**64)):
        return blocks  # type: ignore[no-any-return]
    check_isinstance(name, blocks, [list, tuple], int, allow_none=False)
    check_list_uint64(name, blocks)
    return list(blocks)


def push_layer_indices(cache: Cache, src_range: range | None, dst_range: range | None,
                       per_layer: int) -> tuple[list[int], list[int]]:
    """Tensor indices of a push; both ranges default to every layer of the source."""
    check_layer_range("src_layer_range", src_range)
    check_layer_range("dst_layer_range", dst_range)
    num_layers = cache.cache_desc.num_tensors // per_layer
    src_layers = src_range if src_range is not None else range(num_layers)
    dst_layers = dst_range if dst_range is not None else range(num_layers)
    raise_if_false(len(src_layers) == len(dst_layers), "src_layer_range {0} and "
                   "dst_layer_range {1} should have the same length.", src_layers, dst_layers)

    def tensors(layers: range) -> list[int]:
        return [t for layer in layers for t in range(layer * per_layer, (layer + 1) * per_layer)]

    return tensors(src_layers), tensors(dst_layers)


class TransferOps(ManagerBase):
    """Pull and push coroutines of the CacheManager."""

    def _pull_args(self, kwargs: dict[str, Any]) -> tuple[int, list[int], list[int]]:
        if not kwargs:  # every tensor, two per layer
            return 2, [], []
        per_layer = kwargs.get("tensor_num_per_layer", 2)
        src_range, dst_range = kwargs.get("src_layer_range"), kwargs.get("dst_layer_range")
        # What engines pass on every request, decided without the checks' calls;
        # anything else takes the full checks below and their messages.
        if (not kwargs.keys() - _PULL_KWARG_NAMES and _plain_int(per_layer, 1, _UINT32_MAX)
                and _plain_layers(src_range) and _plain_layers(dst_range)):
            return per_layer, _layer_tensors(src_range, per_layer), \
                _layer_tensors(dst_range, per_layer)
        unknown = set(kwargs) - set(PULL_KWARGS)
        if unknown:
            raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
        per_layer = check_tensor_num_per_layer(kwargs.get("tensor_num_per_layer", 2))
        src_indices, dst_indices = layer_range_to_tensor_indices(
            kwargs.get("src_layer_range"), kwargs.get("dst_layer_range"), per_layer)
        return per_layer, src_indices, dst_indices

    async def _call_transfer(self, operation: str, request: Any) -> Any:
        started = time.perf_counter()
        # The daemon bounds the transfer by sync_kv_timeout; the connection adds
        # the margin that bounds a daemon which stopped answering.
        reply = await self._connection.begin_transfer(_RPC_OF[operation], request,
                                                      self._sync_timeout_s)
        timing.record(operation, time.perf_counter() - started, reply)
        return reply

    def _call_transfer_blocking(self, carrier: BlockingCarrier, operation: str,
                                request: Any) -> None:
        """:meth:`_call_transfer` on a blocking carrier, for the blocking facade:
        the request is built by :meth:`_pull_blocks_request` or
        :meth:`_push_blocks_request` on the calling thread."""
        started = time.perf_counter()
        reply = carrier.call(_RPC_OF[operation], request, self._sync_timeout_s + CALL_MARGIN_S)
        timing.record(operation, time.perf_counter() - started, reply)

    async def _repeated(self, shape: TransferShape, src_batch: int, dst_batch: int) -> bool:
        """Run a transfer of ``shape`` by the handle the daemon gave for it, if
        there is one and the lane is open: on the session's rings when the
        daemon runs it there, else a 16-byte lane frame, answered as the full
        call. False: there is none; send the full call."""
        handle = self._repeat_handles.get(shape)
        connection = self._connection
        lane = connection.lane
        if not handle or lane is None or not connection.has_lane:
            return False
        started = time.perf_counter()
        operation = "push_cache" if shape.push else "pull_cache"
        timeout_s = self._sync_timeout_s + CALL_MARGIN_S
        rings = connection.rings
        if rings is not None and handle in self._native_handles:
            done = await rings.repeat(shape.push, handle, src_batch, dst_batch, timeout_s)
            if done is not None:
                timing.record(operation, time.perf_counter() - started, done)
                return True
        reply = await lane.begin("RepeatPush" if shape.push else "RepeatPull",
                                 RepeatFrame(handle, src_batch, dst_batch), timeout_s)
        timing.record(operation, time.perf_counter() - started, reply)
        self._handle_given(shape, reply)
        return True

    def _handle_given(self, shape: TransferShape, reply: Any) -> None:
        """Keep the repeat handle a reply gave for ``shape``, and whether the
        daemon runs its repeats natively (rings) or on the lane."""
        handle = reply.repeat_handle
        self._repeat_handles[shape] = handle
        if reply.repeat_native:
            self._native_handles.add(handle)
        else:
            self._native_handles.discard(handle)

    async def pull_cache(self, cache_key: CacheKey | CacheKeyByIdAndIndex, cache: Cache,
                         batch_index: int = 0, size: int = -1, *, checksum: bool | None = None,
                         **kwargs: Any) -> None:
        """Copy a remote cache slot into batch slot ``batch_index`` of ``cache``.

        Args:
            cache_key: the remote slot, by key or by cache id and batch index.
            cache: the local continuous destination cache.
            batch_index: the destination slot (uint32).
            size: bytes per tensor, -1 for the whole destination slot.
            checksum: hixl's extension: the bytes carry a CRC-32C over a TCP link
                and the pull fails with ``LLM_LINK_FAILED`` if they arrive
                changed; None: the daemon's ``[transfer] checksum``.
            **kwargs: ``src_layer_range`` / ``dst_layer_range`` (``range`` of layers),
                ``tensor_num_per_layer`` (default 2).

        Raises:
            TypeError / ValueError: wrong argument types or ranges.
            LLMException: a broken rule (``LLM_PARAM_INVALID``), no link
                (``LLM_NOT_YET_LINK``), no such remote cache
                (``LLM_KV_CACHE_NOT_EXIST``), bytes changed on the way
                (``LLM_LINK_FAILED``, with ``checksum``), or no answer within
                ``sync_kv_timeout`` (``LLM_TIMEOUT``).
        """
        self._check_is_inited()
        if type(cache_key) is not CacheKeyByIdAndIndex:
            self._check_source_key("cache_key", cache_key, blocks_ok=False)
        if type(cache) is not Cache:
            check_isinstance("cache", cache, Cache, allow_none=False)
        if not _plain_int(batch_index, 0, _UINT32_MAX):
            check_uint32("batch_index", batch_index)
        if not _plain_int(size, _INT64_MIN, _INT64_MAX):
            check_int64("size", size)
        if size != -1 and size <= 0:
            raise_if_false(False, "size should be -1 or > 0, but got {0}.", size)
        if cache.is_blocks_cache:
            raise_if_false(False, "pull_cache does not support blocks cache, "
                           "please use pull_blocks.")
        per_layer, src_indices, dst_indices = self._pull_args(kwargs)
        checked = checksum_to_proto(checksum)
        if isinstance(cache_key, CacheKey):
            check_cache_key(cache_key)
        # A pull by cache id of a shape pulled before goes by its repeat handle.
        shape: TransferShape | None = None
        if isinstance(cache_key, CacheKeyByIdAndIndex):
            shape = TransferShape(False, cache_key.cluster_id, cache_key.cache_id,
                                  cache.cache_id, size, per_layer, tuple(src_indices),
                                  tuple(dst_indices), checked)
            if await self._repeated(shape, cache_key.batch_index, batch_index):
                return
        reply = await self._call_transfer("pull_cache", client_pb2.PullCacheRequest(
            src=ref_to_proto(cache_key), dst_cache_id=cache.cache_id, batch_index=batch_index,
            size=size, src_tensor_indices=src_indices, dst_tensor_indices=dst_indices,
            tensor_num_per_layer=per_layer, checksum=checked))
        if shape is not None and reply.repeat_handle:
            self._handle_given(shape, reply)

    def _check_source_key(self, name: str, key: Any, blocks_ok: bool) -> None:
        if self._enable_remote_cache_accessible:
            allowed: list[type] = [CacheKeyByIdAndIndex, *([BlocksCacheKey] if blocks_ok else [])]
            check_isinstance(name, key, allowed, allow_none=False,
                             extra_fmt="While enable_remote_cache_accessible is True, ")
        else:
            allowed = [CacheKey, CacheKeyByIdAndIndex, *([BlocksCacheKey] if blocks_ok else [])]
            check_isinstance(name, key, allowed, allow_none=False)

    async def pull_blocks(self, src_cache_key: CacheKey | CacheKeyByIdAndIndex | BlocksCacheKey,
                          dst_cache: Cache, src_blocks: Sequence[int] | None = (),
                          dst_blocks: Sequence[int] = (), *, checksum: bool | None = None,
                          **kwargs: Any) -> None:
        """Pull remote blocks (or a remote continuous slot) into blocks of ``dst_cache``.

        Block ``src_blocks[i]`` lands in block ``dst_blocks[i]``. With a
        ``CacheKey`` or ``CacheKeyByIdAndIndex`` the remote continuous slot is cut
        into blocks and scattered into ``dst_blocks`` (``src_blocks`` stays empty).

        Raises:
            TypeError / ValueError: wrong argument types.
            LLMException: a broken block rule (``LLM_PARAM_INVALID``) or a failed
                transfer, as for `pull_cache`.
        """
        await self._call_transfer("pull_blocks", self._pull_blocks_request(
            src_cache_key, dst_cache, src_blocks, dst_blocks, checksum=checksum, **kwargs))

    def _pull_blocks_request(
            self, src_cache_key: CacheKey | CacheKeyByIdAndIndex | BlocksCacheKey,
            dst_cache: Cache, src_blocks: Sequence[int] | None = (),
            dst_blocks: Sequence[int] = (), *, checksum: bool | None = None,
            **kwargs: Any) -> client_pb2.PullCacheRequest:
        """`pull_blocks`' checks, and the request it sends: also for the blocking
        facade, which sends it from its calling thread (:meth:`_call_transfer_blocking`)."""
        self._check_is_inited()
        if type(src_cache_key) is not BlocksCacheKey:  # allowed in every mode
            self._check_source_key("src_cache_key", src_cache_key, blocks_ok=True)
        if type(dst_cache) is not Cache:
            check_isinstance("dst_cache", dst_cache, Cache, allow_none=False)
        if not dst_cache.is_blocks_cache:
            raise_if_false(False, "pull_blocks only supports blocks cache as dst_cache, "
                           "please use pull_cache.")
        src_list = check_blocks_list("src_blocks", src_blocks or ())
        dst_list = check_blocks_list("dst_blocks", dst_blocks)
        if not dst_list:
            raise_if_false(False, "dst_blocks should not be empty.")
        per_layer, src_indices, dst_indices = self._pull_args(kwargs)
        if isinstance(src_cache_key, BlocksCacheKey):
            if not src_list:
                raise_if_false(False, "src_blocks should not be empty when "
                               "src_cache_key is BlocksCacheKey.")
        else:
            raise_if_false(len(src_list) == 0, "src_blocks should be empty when "
                           "src_cache_key is not BlocksCacheKey.")
            if isinstance(src_cache_key, CacheKey):
                check_cache_key(src_cache_key)
        return client_pb2.PullCacheRequest(
            src=ref_to_proto(src_cache_key), dst_cache_id=dst_cache.cache_id, size=-1,
            src_tensor_indices=src_indices, dst_tensor_indices=dst_indices,
            tensor_num_per_layer=per_layer, src_blocks=src_list, dst_blocks=dst_list,
            checksum=checksum_to_proto(checksum))

    def _check_push_mode(self) -> None:
        raise_if_false(self._enable_remote_cache_accessible, "push is only supported while "
                       "enable_remote_cache_accessible is True.")

    async def push_cache(self, dst_cache_key: CacheKeyByIdAndIndex, src_cache: Cache,
                         src_batch_index: int = 0, src_layer_range: range | None = None,
                         dst_layer_range: range | None = None, size: int = -1,
                         tensor_num_per_layer: int = 2, *,
                         checksum: bool | None = None) -> None:
        """Write a local cache slot into a remote-accessible cache slot.

        Both layer ranges default to every layer of ``src_cache`` and must have
        the same length; ``size`` must be -1 (whole slots). ``checksum``: as
        for `pull_cache`.

        Raises:
            TypeError / ValueError: wrong argument types.
            LLMException: not in remote-cache-accessible mode, a broken rule
                (``LLM_PARAM_INVALID``) or a failed transfer.
        """
        self._check_is_inited()
        self._check_push_mode()
        check_isinstance("dst_cache_key", dst_cache_key, CacheKeyByIdAndIndex, allow_none=False)
        check_isinstance("src_cache", src_cache, Cache, allow_none=False)
        check_uint32("src_batch_index", src_batch_index)
        raise_if_false(not src_cache.is_blocks_cache, "push_cache does not support blocks "
                       "cache, please use push_blocks.")
        per_layer = check_tensor_num_per_layer(tensor_num_per_layer)
        src_indices, dst_indices = push_layer_indices(src_cache, src_layer_range,
                                                      dst_layer_range, per_layer)
        check_int64("size", size)
        raise_if_false(size == -1, "push_cache only supports size == -1, but got {0}.", size)
        checked = checksum_to_proto(checksum)
        if not src_indices:
            return  # no whole layer to push (e.g. one tensor, two per layer)
        # A push of a shape pushed before goes by its repeat handle.
        shape = TransferShape(True, dst_cache_key.cluster_id, dst_cache_key.cache_id,
                              src_cache.cache_id, -1, per_layer, tuple(src_indices),
                              tuple(dst_indices), checked)
        if await self._repeated(shape, src_batch_index, dst_cache_key.batch_index):
            return
        reply = await self._call_transfer("push_cache", client_pb2.PushRequest(
            dst=ref_to_proto(dst_cache_key), src_cache_id=src_cache.cache_id,
            src_batch_index=src_batch_index, src_tensor_indices=src_indices,
            dst_tensor_indices=dst_indices, tensor_num_per_layer=per_layer, checksum=checked))
        if reply.repeat_handle:
            self._handle_given(shape, reply)

    async def push_blocks(self, dst_cache_key: BlocksCacheKey, src_cache: Cache,
                          src_blocks: Sequence[int] = (), dst_blocks: Sequence[int] = (),
                          src_layer_range: range | None = None,
                          dst_layer_range: range | None = None,
                          tensor_num_per_layer: int = 2, *,
                          checksum: bool | None = None) -> None:
        """Write local blocks into blocks of a remote-accessible blocks cache
        (``checksum``: as for `pull_cache`).

        Raises:
            TypeError / ValueError: wrong argument types.
            LLMException: not in remote-cache-accessible mode, a broken rule
                (``LLM_PARAM_INVALID``) or a failed transfer.
        """
        request = self._push_blocks_request(dst_cache_key, src_cache, src_blocks, dst_blocks,
                                            src_layer_range, dst_layer_range,
                                            tensor_num_per_layer, checksum=checksum)
        if request is not None:
            await self._call_transfer("push_blocks", request)

    def _push_blocks_request(self, dst_cache_key: BlocksCacheKey, src_cache: Cache,
                             src_blocks: Sequence[int] = (), dst_blocks: Sequence[int] = (),
                             src_layer_range: range | None = None,
                             dst_layer_range: range | None = None,
                             tensor_num_per_layer: int = 2, *,
                             checksum: bool | None = None) -> client_pb2.PushRequest | None:
        """`push_blocks`' checks, and the request it sends (None: no whole layer
        to push), also for the blocking facade, as :meth:`_pull_blocks_request`."""
        self._check_is_inited()
        self._check_push_mode()
        check_isinstance("dst_cache_key", dst_cache_key, BlocksCacheKey, allow_none=False)
        check_isinstance("src_cache", src_cache, Cache, allow_none=False)
        raise_if_false(src_cache.is_blocks_cache, "push_blocks only supports blocks cache as "
                       "src_cache, please use push_cache.")
        src_list = check_blocks_list("src_blocks", src_blocks)
        dst_list = check_blocks_list("dst_blocks", dst_blocks)
        raise_if_false(len(dst_list) > 0, "dst_blocks should not be empty.")
        per_layer = check_tensor_num_per_layer(tensor_num_per_layer)
        src_indices, dst_indices = push_layer_indices(src_cache, src_layer_range,
                                                      dst_layer_range, per_layer)
        checked = checksum_to_proto(checksum)
        if not src_indices:
            return None
        return client_pb2.PushRequest(
            dst=ref_to_proto(dst_cache_key), src_cache_id=src_cache.cache_id,
            src_tensor_indices=src_indices, dst_tensor_indices=dst_indices,
            tensor_num_per_layer=per_layer, src_blocks=src_list, dst_blocks=dst_list,
            checksum=checked)

    def transfer_cache_async(
            self, src_cache: Cache, layer_synchronizer: LayerSynchronizer,
            transfer_configs: Sequence[TransferConfig | TransferWithCacheKeyConfig],
            src_block_indices: Sequence[int] | None = None,
            dst_block_indices: Sequence[int] | None = None,
            dst_block_memory_size: int | None = None) -> CacheTask:
        """Start a layer-wise transfer and return its task at once (call it in a running loop).

        Each source layer is sent as soon as ``layer_synchronizer.synchronize_layer``
        returns True for it, while the next layer is still being computed.
        ``await task`` (or ``await task.get_results()``) gives one result per config.

        Args:
            src_cache: the local source (DEVICE placement).
            layer_synchronizer: tells when each layer may go; a blocking method runs in
                a worker thread, an ``async def`` one is awaited.
            transfer_configs: the destinations: ``TransferWithCacheKeyConfig`` in
                remote-cache-accessible mode, ``TransferConfig`` otherwise.
            src_block_indices: source blocks (blocks to blocks).
            dst_block_indices: destination blocks (blocks or cache to blocks).
            dst_block_memory_size: block size in bytes when a cache goes into blocks.

        Raises:
            TypeError / ValueError / LLMException: LLM-DataDist's checks, before
                anything starts.
        """
        self._check_is_inited()
        num_layers = check_transfer_args(
            src_cache, layer_synchronizer, transfer_configs, src_block_indices,
            dst_block_indices, dst_block_memory_size, self._enable_remote_cache_accessible)
        task = CacheTask(transfer_configs, LLMStatusCode.LLM_TIMEOUT)
        start = build_start(src_cache.cache_id, transfer_configs, src_block_indices,
                            dst_block_indices, dst_block_memory_size)
        task._start(drive(task, self._connection, start, layer_synchronizer, num_layers,
                          self._sync_timeout_s))
        return task


def check_transfer_args(src_cache: Any, synchronizer: Any, configs: Any,
                        src_blocks: Any, dst_blocks: Any, dst_block_memory_size: Any,
                        remote_accessible: bool) -> int:
    """LLM-DataDist's transfer_cache_async checks, in its order; returns the layer count."""
    check_isinstance("src_cache", src_cache, Cache, allow_none=False)
    raise_if_false(src_cache.cache_desc.placement != Placement.HOST,
                   "transfer_cache_async does not support HOST src_cache.")
    for name, blocks in (("dst_block_indices", dst_blocks), ("src_block_indices", src_blocks)):
        check_isinstance(name, blocks, [list, tuple], int)
        if blocks is not None:
            check_list_uint64(name, blocks)
    if dst_block_memory_size is not None:
        check_uint64("dst_block_memory_size", dst_block_memory_size)
    if src_blocks:
        raise_if_false(bool(dst_blocks), "transfer from blocks to cache is not supported.")
        raise_if_false(len(src_blocks) == len(dst_blocks), "src_block_indices and "
                       "dst_block_indices should have the same length.")
    elif dst_blocks:
        raise_if_false(dst_block_memory_size is not None, "dst_block_memory_size is required "
                       "when transferring a cache into blocks.")
    check_isinstance("layer_synchronizer", synchronizer, LayerSynchronizer, allow_none=False)
    if remote_accessible:
        check_isinstance("transfer_configs", configs, [list, tuple],
                         TransferWithCacheKeyConfig, allow_none=False,
                         extra_fmt="While enable_remote_cache_accessible is True, ")
    else:
        check_isinstance("transfer_configs", configs, [list, tuple], TransferConfig,
                         allow_none=False)
    if not dst_blocks:
        raise_if_false(not dst_block_memory_size, "dst_block_memory_size should be None or 0 "
                       "when dst is not blocks.")
    desc = src_cache.cache_desc
    raise_if_false(desc.num_tensors % 2 == 0, "num_tensors {0} is not even.", desc.num_tensors)
    num_layers: int = desc.num_tensors // 2
    for config in configs:
        if config.src_layer_range is None:
            config.src_layer_range = range(num_layers)  # on the user's object, as the reference
        layers = config.src_layer_range
        if src_cache.is_blocks_cache:
            raise_if_false(config.src_batch_index == 0, "src_batch_index {0} != 0 while src is "
                           "blocks.", config.src_batch_index)
        else:
            raise_if_false(0 <= config.src_batch_index < desc.batch_size,
                           "src_batch_index {0} out of range: [0, {1})",
                           config.src_batch_index, desc.batch_size)
        raise_if_false(0 <= layers.start < layers.stop <= num_layers, "src_layer_range {0} is "
                       "out of range [0, {1}).", layers, num_layers)
        if isinstance(config, TransferConfig):
            raise_if_false(len(config.dst_addrs) == 2 * len(layers), "expect {0} dst_addrs, "
                           "but got {1}.", 2 * len(layers), len(config.dst_addrs))
    return num_layers
