"""Regions: the byte ranges of caches that linked peers may reach.

Every cache is a region of its memory. The memory registers its region with
the native data server where it can (``Memory.expose``: host memory, a
client process's), which checks each remote request against it (and the
link token's cluster) before a byte moves; device memory (the hccl backend)
is out of the data server's sight, so its regions are kept here for the HCCL
peer calls to check against.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import hixl_native

from .memory.base import Memory


@dataclass(frozen=True)
class DeviceRegion:
    """Device memory linked peers may reach over HCCL."""

    memory: Memory
    offset: int
    size: int
    cluster_id: int
    writable: bool


class Regions:
    """The daemon's region table: ids, host regions in the data server, device regions."""

    def __init__(self, data_server: hixl_native.DataServer) -> None:
        self._data_server = data_server
        self._ids = itertools.count(1)
        self._device: dict[int, DeviceRegion] = {}

    def add(self, memory: Memory, offset: int, size: int, cluster_id: int,
            writable: bool) -> int:
        """Make [offset, offset + size) of ``memory`` reachable by linked peers; its id.

        Region ids are never reused, so a stale id can only be refused."""
        region_id = next(self._ids)
        if not memory.expose(self._data_server, region_id, offset, size, cluster_id, writable):
            self._device[region_id] = DeviceRegion(memory, offset, size, cluster_id, writable)
        return region_id

    def device(self, region_id: int) -> DeviceRegion | None:
        return self._device.get(region_id)

    async def remove(self, region_id: int) -> None:
        if self._device.pop(region_id, None) is not None:
            return  # HCCL batches in flight pin the memory itself
        # Waits for data-plane reads of the region that already started.
        await asyncio.to_thread(self._data_server.unregister_region, region_id)
