"""KvCache: LLM-DataDist's legacy (v1) cache handle, kept so ported code imports.

hixl serves the v2 API (`CacheManager` and `Cache`); the v1 manager that
hands out ``KvCache`` objects is not provided. The type is still exported,
as LLM-DataDist exports it, so code that names it (type hints, isinstance
checks, ``KvCache.create_cpu_cache``) keeps working when ported.
"""

from __future__ import annotations

from typing import Any, cast

from ._validation import check_int64, check_isinstance
from .status import raise_if_false
from .types import CacheDesc, validate_cpu_cache_args


class KvCache:
    """A v1 cache: ``num_tensors`` tensors of one layout, on one or more devices.

    Args:
        cache_id: the cache id (int64; -1 for CPU caches).
        cache_desc: the layout of every tensor.
        per_device_tensor_addrs: per device, the address of each tensor.
        kv_cache_manager: the v1 manager that owns it, if any.
    """

    def __init__(self, cache_id: int, cache_desc: CacheDesc,
                 per_device_tensor_addrs: list[list[int]], kv_cache_manager: Any = None) -> None:
        check_isinstance("cache_id", cache_id, int, allow_none=False)
        check_int64("cache_id", cache_id)
        check_isinstance("cache_desc", cache_desc, CacheDesc, allow_none=False)
        check_isinstance("per_device_tensor_addrs", per_device_tensor_addrs, list, list,
                         allow_none=False)
        self._cache_id = cache_id
        self._cache_desc = cache_desc
        self._per_device_tensor_addrs = [list(addrs) for addrs in per_device_tensor_addrs]
        self._kv_cache_manager = kv_cache_manager

    @property
    def cache_id(self) -> int:
        """The cache id (int64)."""
        return self._cache_id

    @property
    def cache_desc(self) -> CacheDesc:
        """The layout of every tensor."""
        return self._cache_desc

    @property
    def per_device_tensor_addrs(self) -> list[list[int]]:
        """Per device, the address of each tensor."""
        return self._per_device_tensor_addrs

    @property
    def tensor_addrs(self) -> list[int]:
        """The first device's tensor addresses (empty when there is none)."""
        return self._per_device_tensor_addrs[0] if self._per_device_tensor_addrs else []

    def __repr__(self) -> str:
        return (f"KvCache(cache_id = {self._cache_id}, devices = "
                f"{len(self._per_device_tensor_addrs)}, tensors per device = "
                f"{len(self.tensor_addrs)})")

    __str__ = __repr__

    @classmethod
    def create_cpu_cache(cls, cache_desc: CacheDesc, addrs: list[int] | list[list[int]]) -> KvCache:
        """Describe user host memory: ``addrs`` is one address per tensor, or one
        such list per device.

        Raises:
            TypeError: ``addrs`` is not a list, or holds neither ints nor lists of int.
            LLMException: ``addrs`` mixes ints and lists, the placement is not
                HOST, or a device's address count differs from ``num_tensors``
                (``LLM_PARAM_INVALID``).
        """
        check_isinstance("addrs", addrs, list, allow_none=False)
        flat = all(isinstance(a, int) for a in addrs)
        nested = all(isinstance(a, list) for a in addrs)
        raise_if_false(flat or nested, "addrs should be consistent: all int, or all list of int.")
        per_device = [cast(list[int], addrs)] if flat else cast(list[list[int]], addrs)
        for device_addrs in per_device:
            validate_cpu_cache_args(cache_desc, device_addrs)
        return cls(-1, cache_desc, per_device, None)
