"""Engine options and link targets (``LLMClusterInfo.for_peer``) for the
clusters end-to-end tests create."""

from __future__ import annotations

import json

from hixl_client import LLMClusterInfo, LLMConfig

cluster_info = LLMClusterInfo.for_peer

__all__ = ["cluster_info", "cluster_options"]


def cluster_options(pool_bytes: int, *, device_id: int = 0, host_pool_bytes: int = 0,
                    sync_kv_timeout: int | None = None,
                    remote_accessible: bool | None = None) -> dict[str, str]:
    """LLM-DataDist options of a cache-manager cluster with a DEVICE pool of ``pool_bytes``."""
    config = LLMConfig()
    config.device_id = device_id
    config.enable_cache_manager = True
    config.mem_pool_cfg = json.dumps({"memory_size": pool_bytes, "page_shift": 16})
    if host_pool_bytes:
        config.host_mem_pool_cfg = json.dumps({"memory_size": host_pool_bytes})
    if sync_kv_timeout is not None:
        config.sync_kv_timeout = sync_kv_timeout
    if remote_accessible is not None:
        config.enable_remote_cache_accessible = remote_accessible
    return dict(config.generate_options())
