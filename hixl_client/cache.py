"""Cache: the handle of an allocated (or CPU) cache, with zero-copy views."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from ._validation import check_int64, check_isinstance
from .status import LLMException, LLMStatusCode
from .types import CacheDesc, DataType, numpy_dtype, validate_cpu_cache_args

if TYPE_CHECKING:
    from ._memory import PoolMapping

_DLPACK_CPU = 1  # DLDeviceType kDLCPU


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
        """Tensor ``index`` as a zero-copy numpy array of the cache's shape and dtype.

        ``DT_BF16`` tensors are ``ml_dtypes.bfloat16`` arrays: numpy has no
        bfloat16 of its own, and a float16 view would read every value wrong.

        Raises:
            LLMException: as `tensor_view`, or ``DT_BF16`` without ml_dtypes
                installed (``LLM_FEATURE_NOT_ENABLED``).
            IndexError: ``index`` is not a tensor of the cache.
        """
        import numpy as np

        dtype = numpy_dtype(self._cache_desc.data_type)
        array = np.frombuffer(self.tensor_view(index), dtype=np.uint8)
        return array.view(dtype).reshape(tuple(self._cache_desc.shape))

    def torch(self, index: int) -> Any:
        """Tensor ``index`` as a zero-copy CPU ``torch.Tensor`` of the cache's shape
        and dtype (``DT_BF16`` is ``torch.bfloat16``); needs torch installed.

        Raises:
            LLMException / IndexError: as `numpy`.
            ModuleNotFoundError: torch is not installed.
            TypeError: ``DT_STRING``, which torch has no dtype for.
        """
        import numpy as np
        import torch

        desc = self._cache_desc
        if desc.data_type is DataType.DT_STRING:
            raise TypeError("torch has no dtype for DT_STRING tensors")
        if desc.data_type is DataType.DT_BF16:
            raw = np.frombuffer(self.tensor_view(index), dtype=np.uint16)
            return torch.from_numpy(raw).view(torch.bfloat16).reshape(tuple(desc.shape))
        return torch.from_numpy(self.numpy(index))

    def __dlpack_device__(self) -> tuple[int, int]:
        """DLPack's device of the cache: the host CPU (``kDLCPU``)."""
        return (_DLPACK_CPU, 0)

    def __dlpack__(self, **kwargs: Any) -> Any:
        """The whole cache as one DLPack tensor of shape ``(num_tensors, *shape)``,
        zero-copy (``torch.from_dlpack(cache)``, ``numpy.from_dlpack(cache)``).

        Raises:
            BufferError: the cache has no host memory (deallocated, CPU cache or
                Ascend device memory), its tensors do not lie at one stride
                (use `numpy` or `torch` per tensor), or it is ``DT_BF16``, which
                numpy cannot export (use `torch`).
        """
        return self._stacked().__dlpack__(**kwargs)

    def _stacked(self) -> Any:
        """All tensors as one strided numpy array over the pool (for DLPack)."""
        import numpy as np
        from numpy.lib.stride_tricks import as_strided

        desc = self._cache_desc
        if desc.data_type in (DataType.DT_BF16, DataType.DT_STRING):
            raise BufferError(f"{desc.data_type.name} tensors cannot be exported through "
                              f"DLPack by numpy; use Cache.torch(i) or Cache.numpy(i)")
        if not self._valid or self._pool is None or self._pool.mapping is None:
            raise BufferError(f"cache {self._cache_id} has no host memory to export")
        offsets, size = self._offsets, desc.size
        step = offsets[1] - offsets[0] if len(offsets) > 1 else size
        dtype = numpy_dtype(desc.data_type)
        if step < size or step % dtype.itemsize or any(
                b - a != step for a, b in itertools.pairwise(offsets)):
            raise BufferError(f"the tensors of cache {self._cache_id} do not lie at one "
                              f"stride; export them one at a time with Cache.numpy(i)")
        span = step * (len(offsets) - 1) + size
        flat = np.frombuffer(self._pool.view(offsets[0], span), dtype=dtype)
        # each tensor is C-contiguous: its strides are those of its first one
        inner = flat[:size // dtype.itemsize].reshape(tuple(desc.shape)).strides
        return as_strided(flat, shape=(len(offsets), *desc.shape), strides=(step, *inner))
