"""The local transport: both clusters live in this daemon, so a transfer is a
copy between their memories (``copier``: native memcpy with the GIL
released, or ACL copies for device memory)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

import numpy as np

from ..copier import triples_of
from .base import REACHES_HOST_MEMORY, Place, Prepared, TransportInfo

if TYPE_CHECKING:
    from ..copier import Copier
    from ..memory.base import Memory
    from ..planning import Ranges


def _far_memory(far: Place) -> Memory:
    assert far.memory is not None, "a local link's far end is memory of this daemon"
    return far.memory


class LocalTransport:
    """Copies between two clusters of this daemon."""

    name = "local"
    capabilities = frozenset({REACHES_HOST_MEMORY})
    peer_calls: tuple[str, ...] = ()  # of the far daemon, beyond protocol 1's: none
    alive = True

    def __init__(self, copier: Copier) -> None:
        self._copier = copier

    def info(self) -> TransportInfo:
        return TransportInfo(self.name, capabilities=self.capabilities)

    async def read(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                   checksum: bool = False) -> None:
        await self._copier.copy(local, _far_memory(far), ranges)

    async def write(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                    checksum: bool = False) -> None:
        await self._copier.copy(_far_memory(far), local, ranges)

    def prepare(self, writing: bool, local: Memory, far: Place, ranges: Ranges,
                nbytes: int, checksum: bool = False) -> Prepared:
        far_memory = _far_memory(far)
        dst, src = (far_memory, local) if writing else (local, far_memory)
        return _PreparedCopy(self._copier, dst, src, ranges, nbytes)

    async def close(self) -> None:
        return None


class _PreparedCopy:
    """A copy made again between other slots: on the loop's thread when the
    daemon is idle (the shifts applied natively, no array per repeat), else
    posted to the copy threads."""

    __slots__ = ("_copier", "_dst", "_nbytes", "_ranges", "_src", "_triples")

    def __init__(self, copier: Copier, dst: Memory, src: Memory, ranges: Ranges,
                 nbytes: int) -> None:
        self._copier = copier
        self._dst = dst
        self._src = src
        self._ranges = ranges
        self._nbytes = nbytes
        self._triples = triples_of(ranges)

    def start(self, src_shift: int, dst_shift: int,
              timeout_ms: int) -> Awaitable[None] | None:
        if self._copier.copy_now(self._dst, self._src, self._triples, self._nbytes,
                                 dst_shift, src_shift):
            return None
        shifted = self._ranges + np.array((src_shift, dst_shift, 0), dtype=np.uint64)
        return self._copier.copy(self._dst, self._src, shifted)

