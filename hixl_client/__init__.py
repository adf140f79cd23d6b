"""hixl_client: the asyncio client of the hixl KV-cache transfer service.

The public names follow LLM-DataDist's (``LLMDataDist``, ``CacheManager``,
``CacheDesc``, keys, ``LLMConfig``, ``LLMStatusCode``, ``LLMException``...);
the operations are coroutines served by the local ``hixl-serviced``.
"""

from ._layerwise import CacheTask
from .cache import Cache
from .cache_manager import CacheManager
from .config import LLMClusterInfo, LLMConfig, LlmConfig
from .device_buffer import DeviceShareableBuffer, alloc_device_shareable
from .keys import BlocksCacheKey, CacheKey, CacheKeyByIdAndIndex
from .kv_cache import KvCache
from .llm_datadist import LLMDataDist
from .notify import NotifyDesc
from .shareable import ShareableBuffer, adopt_shareable, alloc_shareable
from .status import LLMException, LLMStatusCode, Status
from .timing import TransferTiming, capture_timings
from .transfer_config import TransferConfig, TransferWithCacheKeyConfig
from .types import (
    CacheDesc,
    DataType,
    LayerSynchronizer,
    LinkState,
    LinkStatus,
    LLMRole,
    MemInfo,
    Memtype,
    Placement,
    RegisterMemStatus,
)

__version__ = "0.1.0"

__all__ = [
    "BlocksCacheKey",
    "Cache",
    "CacheDesc",
    "CacheKey",
    "CacheKeyByIdAndIndex",
    "CacheManager",
    "CacheTask",
    "DataType",
    "DeviceShareableBuffer",
    "KvCache",
    "LLMClusterInfo",
    "LLMConfig",
    "LLMDataDist",
    "LLMException",
    "LLMRole",
    "LLMStatusCode",
    "LayerSynchronizer",
    "LinkState",
    "LinkStatus",
    "LlmConfig",
    "MemInfo",
    "Memtype",
    "NotifyDesc",
    "Placement",
    "RegisterMemStatus",
    "ShareableBuffer",
    "Status",
    "TransferConfig",
    "TransferTiming",
    "TransferWithCacheKeyConfig",
    "adopt_shareable",
    "alloc_device_shareable",
    "alloc_shareable",
    "capture_timings",
]
