"""Per-destination configs of ``transfer_cache_async``.

`TransferConfig` gives raw remote tensor addresses (remote-cache-accessible
mode off); `TransferWithCacheKeyConfig` names the remote cache by key (mode
on). Setters validate like the constructors.
"""

from __future__ import annotations

from hixl_client._validation import (
    check_isinstance,
    check_layer_range,
    check_list_uint64,
    check_uint32,
    check_uint64,
)
from hixl_client.keys import BlocksCacheKey, CacheKeyByIdAndIndex
from hixl_client.status import raise_if_false, raise_if_true

__all__ = ["TransferConfig", "TransferWithCacheKeyConfig"]


class TransferConfig:
    """Send source layers to raw addresses in a remote cluster.

    Args:
        dst_cluster_id: the remote cluster (uint64).
        dst_addrs: remote tensor addresses (uint64 each): K and V of every destination
            layer in order, so ``2 * len(src_layer_range)`` of them; any destination
            batch offset is already included.
        src_layer_range: source layers; None means all (filled in when the task starts).
        src_batch_index: source batch slot (uint32).

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an integer is out of range.
        LLMException: ``src_layer_range`` has a step other than 1, or is empty or
            reversed (``LLM_PARAM_INVALID``).
    """

    def __init__(
        self,
        dst_cluster_id: int,
        dst_addrs: list[int] | tuple[int, ...],
        src_layer_range: range | None = None,
        src_batch_index: int = 0,
    ) -> None:
        check_uint64("dst_cluster_id", dst_cluster_id)
        _check_dst_addrs(dst_addrs)
        check_layer_range("src_layer_range", src_layer_range)
        check_uint32("src_batch_index", src_batch_index)
        self._dst_cluster_id = dst_cluster_id
        self._dst_addrs = list(dst_addrs)
        self._src_layer_range = src_layer_range
        self._src_batch_index = src_batch_index
        # Read by the transfer job, which treats both config kinds alike; never set here.
        self.dst_layer_range: range | None = None

    @property
    def dst_cluster_id(self) -> int:
        """The remote cluster."""
        return self._dst_cluster_id

    @dst_cluster_id.setter
    def dst_cluster_id(self, value: int) -> None:
        check_uint64("dst_cluster_id", value)
        self._dst_cluster_id = value

    @property
    def dst_addrs(self) -> list[int]:
        """The remote tensor addresses."""
        return self._dst_addrs

    @dst_addrs.setter
    def dst_addrs(self, value: list[int] | tuple[int, ...]) -> None:
        _check_dst_addrs(value)
        self._dst_addrs = list(value)

    @property
    def src_layer_range(self) -> range | None:
        """The source layers, or None for all."""
        return self._src_layer_range

    @src_layer_range.setter
    def src_layer_range(self, value: range | None) -> None:
        check_layer_range("src_layer_range", value)
        self._src_layer_range = value

    @property
    def src_batch_index(self) -> int:
        """The source batch slot."""
        return self._src_batch_index

    @src_batch_index.setter
    def src_batch_index(self, value: int) -> None:
        check_uint32("src_batch_index", value)
        self._src_batch_index = value

    def __repr__(self) -> str:
        return (
            f"TransferConfig(dst_cluster_id={self._dst_cluster_id}, dst_addrs={self._dst_addrs}, "
            f"src_layer_range={self._src_layer_range}, src_batch_index={self._src_batch_index})"
        )

    __str__ = __repr__


def _check_dst_addrs(value: object) -> None:
    check_isinstance("dst_addrs", value, [list, tuple], int, allow_none=False)
    check_list_uint64("dst_addrs", value)


_BLOCKS_BATCH_RULE = "src_batch_index must be 0 when cache_key is a BlocksCacheKey, but got {0}."


class TransferWithCacheKeyConfig:
    """Send source layers into a remote cache named by key.

    Args:
        cache_key: the remote cache: a `BlocksCacheKey` or a `CacheKeyByIdAndIndex`.
        src_layer_range: source layers (required).
        dst_layer_range: destination layers (required), as many as the source ones.
        src_batch_index: source batch slot (uint32; 0 for a `BlocksCacheKey`).

    Raises:
        TypeError: an argument has the wrong type, or a range is None.
        ValueError: ``src_batch_index`` is outside uint32.
        LLMException: a bad range, ranges of different lengths, or a non-zero batch
            index with a `BlocksCacheKey` (``LLM_PARAM_INVALID``).
    """

    def __init__(
        self,
        cache_key: BlocksCacheKey | CacheKeyByIdAndIndex,
        src_layer_range: range | None = None,
        dst_layer_range: range | None = None,
        src_batch_index: int = 0,
    ) -> None:
        check_isinstance(
            "cache_key", cache_key, [BlocksCacheKey, CacheKeyByIdAndIndex], allow_none=False
        )
        src = check_layer_range("src_layer_range", src_layer_range, allow_none=False)
        dst = check_layer_range("dst_layer_range", dst_layer_range, allow_none=False)
        raise_if_false(
            len(src or ()) == len(dst or ()),
            "src_layer_range {0} and dst_layer_range {1} must have the same length.",
            src,
            dst,
        )
        # The constructor checks the type first; the setter checks the key rule first.
        check_uint32("src_batch_index", src_batch_index)
        raise_if_true(
            isinstance(cache_key, BlocksCacheKey) and src_batch_index != 0,
            _BLOCKS_BATCH_RULE,
            src_batch_index,
        )
        self._cache_key: BlocksCacheKey | CacheKeyByIdAndIndex | None = cache_key
        self._src_layer_range: range | None = src
        self._dst_layer_range: range | None = dst
        self._src_batch_index = src_batch_index
        # Fixed at construction: the cache_key setter does not refresh it (reference behaviour).
        self.dst_cluster_id: int = cache_key.cluster_id

    @property
    def cache_key(self) -> BlocksCacheKey | CacheKeyByIdAndIndex | None:
        """The remote cache's key."""
        return self._cache_key

    @cache_key.setter
    def cache_key(self, value: BlocksCacheKey | CacheKeyByIdAndIndex | None) -> None:
        check_isinstance("cache_key", value, [BlocksCacheKey, CacheKeyByIdAndIndex])
        self._cache_key = value

    @property
    def src_layer_range(self) -> range | None:
        """The source layers."""
        return self._src_layer_range

    @src_layer_range.setter
    def src_layer_range(self, value: range | None) -> None:
        self._src_layer_range = check_layer_range("src_layer_range", value)

    @property
    def dst_layer_range(self) -> range | None:
        """The destination layers."""
        return self._dst_layer_range

    @dst_layer_range.setter
    def dst_layer_range(self, value: range | None) -> None:
        self._dst_layer_range = check_layer_range("dst_layer_range", value)

    @property
    def src_batch_index(self) -> int:
        """The source batch slot."""
        return self._src_batch_index

    @src_batch_index.setter
    def src_batch_index(self, value: int) -> None:
        raise_if_true(
            isinstance(self._cache_key, BlocksCacheKey) and value != 0, _BLOCKS_BATCH_RULE, value
        )
        check_uint32("src_batch_index", value)
        self._src_batch_index = value

    def __repr__(self) -> str:
        return (
            f"TransferWithCacheKeyConfig(cache_key={self._cache_key}, "
            f"src_layer_range={self._src_layer_range}, dst_layer_range={self._dst_layer_range}, "
            f"src_batch_index={self._src_batch_index})"
        )

    __str__ = __repr__
