"""Caches and registered memory of the daemon's clusters: allocation in pools,
registration of user memory, keys, and the regions that make them reachable."""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import Placement

from .cluster import Cluster
from .memory.base import Memory, Pool, UserBuffer
from .memory.process import ClientProcess, ProcessBackend, ProcessMemory
from .pools import PoolManager
from .regions import Regions
from .registry import CacheEntry, KeySpec


@dataclass(frozen=True)
class NewCache:
    """The layout of a cache to allocate, checked by the servicer."""

    num_tensors: int
    tensor_size: int
    batch_size: int
    placement: Placement
    blocks: bool = False
    blocks_model_id: int | None = None


def peer_writable(cluster: Cluster, remote_accessible: bool) -> bool:
    """May linked peers write into a cache? (its region's data-plane permission)

    In remote-cache-accessible mode, only caches marked remote-accessible.
    Otherwise LLM-DataDist's contract is TransferConfig: a linked peer writes
    to the addresses its user names, so every cache of the cluster is open
    to it; a push by key or id still needs a remote-accessible cache.
    """
    return remote_accessible or not cluster.settings.remote_cache_accessible


class Caches:
    """Allocates, registers and frees the caches of every cluster."""

    def __init__(self, clusters: Mapping[int, Cluster], regions: Regions, pools: PoolManager,
                 process: ProcessBackend) -> None:
        self._clusters = clusters
        self._regions = regions
        # Clients' buffers are made by the pools' backends, engine memory by ``process``.
        self._pools = pools
        self.process = process
        self._buffer_ids = itertools.count(1)
        self._releasing: set[asyncio.Task[None]] = set()  # closed buffers being unmapped

    def allocate(self, cluster: Cluster, spec: NewCache, keys: list[KeySpec]) -> CacheEntry:
        pool = cluster.pool_for(spec.placement)
        registry = cluster.registry
        if spec.blocks_model_id is not None:
            registry.check_blocks_key(spec.blocks_model_id)
        if not spec.blocks:
            registry.check_keys(keys, spec.batch_size)
        cache_id = registry.reserve_id()
        offset, size, tensor_offsets = pool.alloc_cache(spec.num_tensors, spec.tensor_size)
        writable = cluster.settings.remote_cache_accessible
        try:
            region_id = self._regions.add(pool, offset, size, cluster.cluster_id,
                                          peer_writable(cluster, writable))
        except BaseException:
            pool.allocator.free(offset)
            raise
        entry = CacheEntry(cache_id=cache_id, blocks=spec.blocks, num_tensors=spec.num_tensors,
                           tensor_size=spec.tensor_size, batch_size=spec.batch_size,
                           memory=pool, extent_offset=offset, extent_size=size,
                           tensor_offsets=tensor_offsets, region_id=region_id,
                           blocks_model_id=spec.blocks_model_id, writable=writable)
        registry.add(entry, keys)
        return entry

    async def deallocate(self, cluster: Cluster, cache_id: int, blocks: bool) -> None:
        await self.free(cluster.registry.release(cache_id, blocks))

    async def remove_key(self, cluster: Cluster, key: KeySpec) -> None:
        await self.free(cluster.registry.remove_key(key))

    async def free(self, entry: CacheEntry | None) -> None:
        """Unregister a cache's region and return its extent to its pool, once
        nothing can touch it any more (see ``fence``)."""
        if entry is None:
            return
        if entry.memory.revoke():  # the cache's own memory: nothing reaches it from now on
            await self._end_access(entry)
            return
        await self.fence(entry)
        if entry.registered:
            await self._cache_gone(entry.memory)
            return
        if entry.memory.closed:
            return  # the whole pool went away with its cluster
        assert isinstance(entry.memory, Pool)
        entry.memory.allocator.free(entry.extent_offset)

    async def fence(self, entry: CacheEntry) -> None:
        """Wait until no byte can reach a cache the registry dropped (``entry.gone``):
        peers' requests (the data server refuses its region from now on and waits
        for those already in it), this daemon's transfers that found it before
        (they start nothing more in it, ``CacheEntry.check_present``, and are
        waited for) and the native jobs pinning its memory now (each bounded by
        its deadline). Only then may its memory have a new owner."""
        await self._regions.remove(entry.region_id)
        await entry.still()
        await entry.memory.jobs_ended()

    async def _end_access(self, entry: CacheEntry) -> None:
        """A cache's own memory was revoked (``Memory.revoke``): later native calls
        fail at once; return once those under way (peers' requests, this
        daemon's transfers and copies) have ended."""
        await self._regions.remove(entry.region_id)
        await entry.memory.wait_unpinned()

    async def drop(self, entry: CacheEntry) -> None:
        """Its cluster ends: no peer reaches the cache any more, and memory of its
        own is revoked and waited for (pools and buffers go with the cluster)."""
        if entry.memory.revoke():
            await self._end_access(entry)
        else:
            await self._regions.remove(entry.region_id)

    def _cluster_of_token(self, upload_token: bytes) -> Cluster:
        cluster = next((c for c in self._clusters.values()
                        if secrets.compare_digest(c.upload_token, upload_token)), None)
        if cluster is None:
            raise LLMException("unknown upload token", status_code=LLMStatusCode.LLM_FAILED)
        return cluster

    def bind_process(self, upload_token: bytes, process: ClientProcess) -> None:
        """Bind the process the kernel named on the fd socket to the token's
        cluster: the memory its engine registers is that process's."""
        cluster = self._cluster_of_token(upload_token)
        if cluster.process is not None and cluster.process.pid != process.pid:
            raise LLMException("another process already bound this cluster",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if cluster.process is not None:
            process.close()
            return
        cluster.process = process

    async def add_user_buffer(self, upload_token: bytes, fd: int) -> int:
        """Map a client's shareable buffer (fd from the fd socket); return its id."""
        cluster = self._cluster_of_token(upload_token)
        size = os.fstat(fd).st_size
        if size <= 0:
            raise LLMException("the uploaded buffer is empty",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        buffer_id = next(self._buffer_ids)
        # Page-locked for ACL copies (a swap, a copy_cache) where host memory is.
        buffer = await self._pools.map_buffer(buffer_id, cluster.cluster_id, fd, size)
        if cluster.closed:  # finalized meanwhile: nothing may keep the buffer
            await asyncio.to_thread(buffer.release)
            raise LLMException("the cluster was finalized during the upload",
                               status_code=LLMStatusCode.LLM_FAILED)
        cluster.buffers[buffer_id] = buffer
        return buffer_id

    async def drop_user_buffer(self, upload_token: bytes, buffer_id: int) -> bool:
        """The client is closing a buffer it handed over: nothing new may use it.

        A shareable host buffer is unmapped once the caches registered over it
        are gone (right after this returns when there are none). Device memory is the client's
        to free only after the daemon closed its import (CANN's order for
        ``aclrtIpcMemClose``): it is closed now, or, while caches lie in it,
        not at all, and False says so (the client keeps the buffer).
        """
        cluster = self._cluster_of_token(upload_token)
        buffer = cluster.buffers.get(buffer_id)
        if buffer is None:
            raise LLMException(f"buffer {buffer_id} was not handed over by this cluster",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if buffer.close_on_drop:
            if buffer.caches:
                return False
            buffer.dropped = True
            await self._release_if_unused(buffer)  # the client frees it once we answer
            return True
        buffer.dropped = True
        if not buffer.caches:  # unmapped off the answer's path: close() waits for no munmap
            releasing = asyncio.get_running_loop().create_task(self._release_if_unused(buffer))
            self._releasing.add(releasing)
            releasing.add_done_callback(self._releasing.discard)
        return True

    async def _cache_gone(self, memory: Memory) -> None:
        """A registered cache's memory is the user's again (fenced)."""
        if isinstance(memory, UserBuffer):
            memory.caches -= 1
            await self._release_if_unused(memory)

    async def _release_if_unused(self, buffer: UserBuffer) -> None:
        """Unmap a buffer its client closed once no cache lies in it (counting
        those still being fenced) and no native job uses it."""
        cluster = self._clusters.get(buffer.cluster_id)
        if not buffer.dropped or buffer.caches or buffer.closed or cluster is None:
            return  # in use, or its cluster ended, which unmaps it
        buffer.closed = True
        cluster.buffers.pop(buffer.buffer_id, None)
        await buffer.wait_unpinned()
        await asyncio.to_thread(buffer.release)

    async def import_device_buffer(self, cluster: Cluster, key: str, size: int,
                                   device_id: int) -> int:
        """Import a client's exported device memory (hccl backend); return its buffer id."""
        buffer = await self._pools.import_buffer(next(self._buffer_ids), cluster.cluster_id,
                                                 cluster.settings.device_id, key, size,
                                                 device_id)
        cluster.buffers[buffer.buffer_id] = buffer
        return buffer.buffer_id

    async def register(self, cluster: Cluster, spec: NewCache, buffer_id: int,
                       tensor_offsets: list[int], keys: list[KeySpec], remote_accessible: bool,
                       buffer_address: int = 0, client_addrs: list[int] | None = None,
                       pool_id: int | None = None) -> tuple[CacheEntry, list[CacheEntry]]:
        """Describe user memory as a cache; return it and caches its keys orphaned.

        The memory is a shareable buffer the client uploaded (``buffer_id``),
        a part of one of the cluster's pools (``pool_id``), or the client
        process's own memory at ``client_addrs`` (reached by cross-memory
        calls, probed here).
        """
        count = len(client_addrs) if client_addrs else len(tensor_offsets)
        if count != spec.num_tensors:
            raise LLMException(f"{count} addresses for {spec.num_tensors} tensors",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if spec.blocks_model_id is not None:
            cluster.registry.check_blocks_key(spec.blocks_model_id)
        memory: Memory
        if client_addrs:
            reached = await self._reach(cluster, spec, client_addrs)
            tensor_offsets = [a - reached.span.base for a in client_addrs]
            memory = reached
        elif pool_id is not None:
            pool = next((p for p in cluster.pools.values() if p.pool_id == pool_id), None)
            if pool is None or pool.fd is None:  # only a pool the client maps
                raise LLMException(f"cluster {cluster.cluster_id} has no host pool {pool_id}",
                                   status_code=LLMStatusCode.LLM_PARAM_INVALID)
            memory = pool
        else:
            buffer = cluster.buffers.get(buffer_id)
            if buffer is None or buffer.dropped:
                raise LLMException(f"buffer {buffer_id} was not uploaded by this cluster "
                                   f"or was closed",
                                   status_code=LLMStatusCode.LLM_PARAM_INVALID)
            if buffer_address:
                buffer.client_base = buffer_address
            memory = buffer
        if any(o + spec.tensor_size > memory.size for o in tensor_offsets):
            raise LLMException("a tensor runs past the end of its memory",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        start = min(tensor_offsets)
        span = max(tensor_offsets) + spec.tensor_size - start
        try:
            region_id = self._regions.add(memory, start, span, cluster.cluster_id,
                                          peer_writable(cluster, remote_accessible))
        except BaseException:
            memory.revoke()  # the cache's own memory goes with it; a pool or buffer stays
            raise
        entry = CacheEntry(cache_id=cluster.registry.reserve_id(), blocks=spec.blocks,
                           num_tensors=spec.num_tensors, tensor_size=spec.tensor_size,
                           batch_size=spec.batch_size, memory=memory, extent_offset=start,
                           extent_size=span, tensor_offsets=list(tensor_offsets),
                           region_id=region_id, blocks_model_id=spec.blocks_model_id,
                           writable=remote_accessible, registered=True)
        orphans = cluster.registry.add_registered(entry, keys)
        if isinstance(memory, UserBuffer):
            memory.caches += 1  # until the cache is unregistered and fenced
        return entry, orphans

    async def _reach(self, cluster: Cluster, spec: NewCache, addrs: list[int]) -> ProcessMemory:
        """The client's own memory at ``addrs``, probed (LLM_PARAM_INVALID if the
        daemon may not or cannot reach it). The probe reads the client's memory
        and its /proc maps, so it runs off the event loop."""
        process = self.process.check(cluster.process)
        memory = await asyncio.to_thread(self.process.reach, process, cluster.cluster_id, addrs,
                                         spec.tensor_size)
        if cluster.closed:  # finalized while the probe ran: nothing may keep the memory
            memory.release()
            raise LLMException(f"cluster {cluster.cluster_id} was finalized during the "
                               f"registration", status_code=LLMStatusCode.LLM_FAILED)
        return memory

    async def unregister(self, cluster: Cluster, cache_id: int) -> None:
        entry = cluster.registry.unregister(cache_id)
        if entry is None:
            return
        if entry.memory.revoke():
            await self._end_access(entry)
        else:  # the memory is the user's again once this returns
            await self.fence(entry)
            await self._cache_gone(entry.memory)

    async def free_all(self, entries: list[CacheEntry]) -> None:
        for entry in entries:
            await self.free(entry)

    async def record_pull(self, source: Cluster, key: KeySpec,
                          tensor_indices: list[int]) -> None:
        """A pull by key of ``source``'s slot moved ``tensor_indices``: account it."""
        await self.free(source.registry.record_pull(key, tensor_indices))

    async def share_device_pools(self, cluster: Cluster, tgid: int) -> list[tuple[int, str]]:
        """Let a client process import the cluster's pools it cannot map (device
        pools); (pool id, key) each."""
        shared = []
        for pool in cluster.pools.values():
            key = await pool.share_with(tgid)
            if key is not None:
                shared.append((pool.pool_id, key))
        return shared
