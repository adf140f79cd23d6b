"""A cluster (one initialized LLMDataDist) inside the daemon, and its options.

The options are LLM-DataDist's engine options, as ``LLMConfig`` emits them.
The daemon checks them the way LLM-DataDist's native init does, keeps the
ones that matter on this backend, and reports the others through the admin
status instead of silently dropping them.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.status import param_invalid as _invalid
from hixl_wire.types import LLMRole, Placement

from .cluster_listeners import (
    OPT_LISTEN_IP_INFO,
    ClusterListener,
    ListenAddress,
    parse_listen_ip_info,
)
from .memory.base import Pool, PoolSpec, UserBuffer
from .memory.process import ClientProcess
from .notifies import Inbox
from .peer_api import CacheRefSpec, IdRef, KeyRef
from .registry import CacheEntry, CacheRegistry
from .repeats import RepeatTable

if TYPE_CHECKING:
    from .links import OutboundLink

OPT_MEM_POOL = "llm.MemPoolConfig"
OPT_HOST_MEM_POOL = "llm.HostMemPoolConfig"
OPT_SYNC_TIMEOUT = "llm.SyncKvCacheWaitTime"
OPT_REMOTE_ACCESSIBLE = "llm.EnableRemoteCacheAccessible"
OPT_TRANSFER_BACKEND = "llm.TransferBackend"
OPT_DEVICE_ID = "ge.exec.deviceId"
OPT_LINK_TOTAL_TIME = "llm.LinkTotalTime"
OPT_LINK_RETRY_COUNT = "llm.LinkRetryCount"

DEFAULT_SYNC_TIMEOUT_MS = 1000
SUPPORTED_TRANSFER_BACKENDS = ("hixl",)
MAX_LINK_RETRY_COUNT = 100



@dataclass(frozen=True)
class ClusterSettings:
    """What the daemon takes from a cluster's engine options."""

    sync_timeout_ms: int = DEFAULT_SYNC_TIMEOUT_MS
    device_pool: PoolSpec | None = None
    host_pool: PoolSpec | None = None
    remote_cache_accessible: bool = False
    device_id: int = 0
    # LLM-DataDist's link options: at most this many seconds for one link (0: only
    # link_clusters' own timeout), in up to this many attempts.
    link_total_s: int = 0
    link_attempts: int = 1
    # listen_ip_info: the cluster's own peer listener (cluster_listeners.py); None: none.
    listen: ListenAddress | None = None

    @property
    def sync_timeout_s(self) -> float:
        return self.sync_timeout_ms / 1000.0

    @classmethod
    def from_options(cls, options: dict[str, str]) -> ClusterSettings:
        """Check options as LLM-DataDist's native init does (LLM_PARAM_INVALID on failure)."""
        timeout = options.get(OPT_SYNC_TIMEOUT, str(DEFAULT_SYNC_TIMEOUT_MS))
        if not timeout.isdigit() or int(timeout) <= 0:
            raise _invalid(f"{OPT_SYNC_TIMEOUT} must be a positive integer, got {timeout!r}")
        accessible = options.get(OPT_REMOTE_ACCESSIBLE, "0")
        if accessible not in ("0", "1"):
            raise _invalid(f"{OPT_REMOTE_ACCESSIBLE} must be '0' or '1', got {accessible!r}")
        backend = options.get(OPT_TRANSFER_BACKEND)
        if backend is not None and backend not in SUPPORTED_TRANSFER_BACKENDS:
            raise _invalid(f"{OPT_TRANSFER_BACKEND} {backend!r} is not supported; "
                           f"use one of {SUPPORTED_TRANSFER_BACKENDS}")
        device = options.get(OPT_DEVICE_ID, "0").split(";")[0]
        if not device.isdigit():
            raise _invalid(f"{OPT_DEVICE_ID} must be a device number, got {device!r}")
        link_total = options.get(OPT_LINK_TOTAL_TIME, "0")
        if not link_total.isdigit() or int(link_total) > 0xFFFFFFFF:
            raise _invalid(f"{OPT_LINK_TOTAL_TIME} must be seconds in [0, 2**32-1], "
                           f"got {link_total!r}")
        attempts = options.get(OPT_LINK_RETRY_COUNT, "1")
        if not attempts.isdigit() or not 1 <= int(attempts) <= MAX_LINK_RETRY_COUNT:
            raise _invalid(f"{OPT_LINK_RETRY_COUNT} must be in [1, {MAX_LINK_RETRY_COUNT}], "
                           f"got {attempts!r}")
        pools = {name: PoolSpec.parse(name, options[name])
                 for name in (OPT_MEM_POOL, OPT_HOST_MEM_POOL) if options.get(name)}
        listen = parse_listen_ip_info(options.get(OPT_LISTEN_IP_INFO, ""))
        return cls(
            sync_timeout_ms=int(timeout),
            device_pool=pools.get(OPT_MEM_POOL),
            host_pool=pools.get(OPT_HOST_MEM_POOL),
            remote_cache_accessible=accessible == "1",
            device_id=int(device),
            link_total_s=int(link_total),
            link_attempts=int(attempts),
            listen=listen,
        )


@dataclass
class Cluster:
    """One initialized LLMDataDist: its pools, caches, keys and outbound links."""

    cluster_id: int
    role: LLMRole
    session_id: str
    options: dict[str, str]
    settings: ClusterSettings
    pools: dict[Placement, Pool] = field(default_factory=dict)
    registry: CacheRegistry = field(default_factory=CacheRegistry)
    links: dict[int, OutboundLink] = field(default_factory=dict)
    buffers: dict[int, UserBuffer] = field(default_factory=dict)
    # Handles for transfers of a shape seen before (repeats.py).
    repeats: RepeatTable = field(default_factory=RepeatTable)
    upload_token: bytes = field(default_factory=lambda: secrets.token_bytes(16))
    # The peer listener at its listen_ip_info, owned here: closed at finalize.
    listener: ClusterListener | None = None
    # The client process, bound on the fd socket: engine memory it registers is its own.
    process: ClientProcess | None = None
    # Its session's: where notifications for this cluster are queued.
    inbox: Inbox = field(default_factory=Inbox)
    closed: bool = False

    def pool_for(self, placement: Placement) -> Pool:
        pool = self.pools.get(placement)
        if pool is None:
            option = OPT_MEM_POOL if placement is Placement.DEVICE else OPT_HOST_MEM_POOL
            raise LLMException(
                f"cluster {self.cluster_id} has no {placement.name} pool; set {option} at init",
                status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        return pool

    def link_to(self, remote_cluster_id: int) -> OutboundLink:
        link = self.links.get(remote_cluster_id)
        if link is None:
            raise LLMException(
                f"cluster {self.cluster_id} is not linked to cluster {remote_cluster_id}",
                status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        return link

    def lookup(self, ref: CacheRefSpec) -> tuple[CacheEntry, int]:
        """The cache a reference names and the batch slot it means."""
        if isinstance(ref, KeyRef):
            binding = self.registry.lookup_key(ref.key)
            return binding.cache, binding.batch_index
        if isinstance(ref, IdRef):
            return self.registry.get(ref.cache_id), ref.batch_index
        return self.registry.lookup_blocks(ref.model_id), 0

    def find_address(self, address: int, length: int) -> tuple[CacheEntry, int]:
        """The cache whose memory holds [address, address + length) in the client's
        address space, and the offset inside its region."""
        for entry in self.registry.caches():
            base = entry.memory.client_base
            if base is None:
                continue
            start = base + entry.extent_offset
            if start <= address and address + length <= start + entry.extent_size:
                return entry, address - start
        raise LLMException(f"[{address:#x}, +{length}) is not inside a cache of cluster "
                           f"{self.cluster_id}", status_code=LLMStatusCode.LLM_PARAM_INVALID)
