"""Cache: the handle of an allocated (or CPU) cache, with zero-copy views."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._validation import check_int64, check_isinstance
from .status import LLMException, LLMStatusCode
from .types import CacheDesc, validate_cpu_cache_args

if TYPE_CHECKING:
    from ._memory import PoolMapping


class Cache:
    """A cache of ``num_tensors`` equally shaped tensors.

    Users do not construct it: ``CacheManager.allocate_cache`` (or
    ``Cache.create_cpu_cache``) does. Beyond LLM-DataDist's properties, a hixl
    cache allocated from a daemon pool offers zero-copy access to its tensors
    through `tensor_view` and `numpy`.

    Args:
        cache_id: the daemon's id of the cache (int64; -1 for CPU caches).
        cache_desc: the layout of every tensor.
        tensor_addrs: the address of each tensor in this process.
        cache_manager: the manager that owns it, if any.
        is_registered: whether the memory is the user's (never freed by hixl).
        is_blocks_cache: whether it is a paged (blocks) cache.
    """

    def __init__(self, cache_id: int, cache_desc: CacheDesc, tensor_addrs: list[int],
                 cache_manager: Any = None, is_registered: bool = False,
                 is_blocks_cache: bool = False) -> None:
        check_isinstance("cache_id", cache_id, int, allow_none=False)
        check_int64("cache_id", cache_id)
        self._cache_id = cache_id
        self._cache_desc = cache_desc
        self._tensor_addrs = list(tensor_addrs)
        self._cache_manager = cache_manager
        self._is_registered = is_registered
        self._is_blocks_cache = is_blocks_cache
        self._valid = True
        self._pool: PoolMapping | None = None
        self._offsets: list[int] = []

    @property
    def cache_id(self) -> int:
        """The cache id (int64)."""
        return self._cache_id

    @property
    def cache_desc(self) -> CacheDesc:
        """The layout of every tensor."""
        return self._cache_desc

    @property
    def tensor_addrs(self) -> list[int]:
        """Tensor addresses valid in this process; empty after deallocation."""
        return self._tensor_addrs

    @property
    def is_blocks_cache(self) -> bool:
        """Whether this is a paged (blocks) cache."""
        return self._is_blocks_cache

    def __repr__(self) -> str:
        return (f"Cache(cache_id = {self._cache_id}, device_tensor_addrs = "
                f"{len(self._tensor_addrs)}, is_blocks_cache = {self._is_blocks_cache})")

    __str__ = __repr__

    @classmethod
    def create_cpu_cache(cls, cache_desc: CacheDesc, addrs: list[int]) -> Cache:
        """Describe user host memory as a blocks cache usable by swap_blocks.

        Raises:
            TypeError: ``addrs`` is not a list of int.
            LLMException: the placement is not HOST or the address count differs
                from ``num_tensors`` (``LLM_PARAM_INVALID``).
        """
        validate_cpu_cache_args(cache_desc, addrs)
        return cls(-1, cache_desc, addrs, None, False, True)

    def _bind_pool(self, pool: PoolMapping, offsets: list[int]) -> None:
        self._pool = pool
        self._offsets = list(offsets)

    def _invalidate(self) -> None:
        self._tensor_addrs = []
        self._valid = False
        self._pool = None
        self._offsets = []

    def tensor_view(self, index: int) -> memoryview:
        """A writable zero-copy view of tensor ``index`` (``cache_desc.size`` bytes).

        Raises:
            LLMException: the cache was deallocated or is not a pool cache
                (``LLM_KV_CACHE_NOT_EXIST``), or it is in Ascend device memory
                (``LLM_FEATURE_NOT_ENABLED``: copy it with ACL instead).
            IndexError: ``index`` is not a tensor of the cache.
        """
        if not self._valid or self._pool is None:
            raise LLMException(f"cache {self._cache_id} has no pool memory to view",
                               status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        if not 0 <= index < len(self._offsets):
            raise IndexError(f"tensor index {index} is out of range [0, {len(self._offsets)})")
        return self._pool.view(self._offsets[index], self._cache_desc.size)

    def numpy(self, index: int) -> Any:
        """Tensor ``index`` as a zero-copy numpy array of the cache's shape and dtype."""
        import numpy as np

        from . import types

        dtype = types.dtype_to_np_dtype[self._cache_desc.data_type]
        array = np.frombuffer(self.tensor_view(index), dtype=np.uint8)
        return array.view(dtype).reshape(tuple(self._cache_desc.shape))
