"""Handles for repeated transfers: one per pull_cache or push_cache shape.

An inference engine moves slot after slot between the same two caches: the
same source cache, destination cache, size and tensors, only the two batch
indices change. After a pull_cache or push_cache that names the remote slot
by ``CacheKeyByIdAndIndex``, the daemon gives the client a handle for that
*shape* (``repeat_handle`` in the reply); the client sends later transfers
of the shape as a 16-byte lane frame naming the handle and the two indices
(``RepeatPull`` / ``RepeatPush``), which the daemon answers as it answers
the full call (``prepared.again``) without decoding a request or looking up
again what the last transfer found.

This module holds the handles and what a repeat reuses (``PreparedTransfer``),
so that ``Cluster`` can own the table without importing the transfer code;
``prepared`` starts repeats and falls back to the full call. The shape itself
(``hixl_wire.types.TransferShape``) is the client's too: it keys the client's
handles by the same fields.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import TransferShape

from .links import FarCache, OutboundLink
from .planning import Layout
from .registry import CacheEntry, CacheRegistry
from .transports.base import Prepared

# A cluster gives out handles for this many shapes at most; later shapes get
# none (their transfers take the full path), so a client naming ever new
# caches cannot grow the daemon's memory.
MAX_SHAPES = 1024

# Handles are unique in the daemon's lifetime (never reused by another
# cluster or shape), so a handle from a finalized cluster cannot name a
# shape of a new one.
_handles = itertools.count(1)


@dataclass(slots=True)
class PreparedTransfer:
    """What a transfer of a shape used, ready to start again between other slots."""

    local: CacheEntry  # the pull's destination, the push's source
    link: OutboundLink
    far: FarCache  # the pull's source, the push's destination
    source: Layout  # the layouts of the plan's two columns
    destination: Layout
    bytes: int
    handle: Prepared  # the transport's, for the plan between slots 0 and 0
    checksum: bool  # whether its bytes carry a CRC-32C
    # Whether a native lane can run it (native_lanes.py); None: not asked yet.
    native_fit: bool | None = None

    def current(self, registry: CacheRegistry, links: Mapping[int, OutboundLink],
                shape: TransferShape, checksum: bool) -> bool:
        """Whether every part is still the one the full call would use."""
        link = self.link
        if registry.live(shape.local_cache_id) is not self.local \
                or links.get(shape.remote_cluster_id) is not link or not link.alive \
                or checksum != self.checksum:
            return False
        return link.far.still_current(shape.remote_cache_id, self.far)

    def shifts(self, src_batch: int, dst_batch: int) -> tuple[int, int] | None:
        """What a plan between two slots adds to every source and every destination
        offset, or None for a slot out of range."""
        source, destination = self.source, self.destination
        if not (0 <= src_batch < source.batch_size and 0 <= dst_batch < destination.batch_size):
            return None
        return src_batch * source.stride, dst_batch * destination.stride


class Repeat:
    """A shape's handle and what the transfer code last found for it."""

    __slots__ = ("found", "handle", "shape")

    def __init__(self, handle: int, shape: TransferShape) -> None:
        self.handle = handle
        self.shape = shape
        self.found: PreparedTransfer | None = None  # None until a transfer finds it again


class RepeatTable:
    """One cluster's shapes and their handles."""

    def __init__(self) -> None:
        self._by_shape: dict[TransferShape, Repeat] = {}
        self._by_handle: dict[int, Repeat] = {}
        self.repeated = 0  # transfers by handle that reused what the last one found
        self.answered_at_once = 0  # of those, ended in the lane's frame callback
        self.native = 0  # of those, run by a native lane (native_lanes.py)

    def __len__(self) -> int:
        return len(self._by_handle)

    def offer(self, shape: TransferShape) -> int:
        """The handle of ``shape``, new if needed; 0 (none) once the table is full."""
        repeat = self._by_shape.get(shape)
        if repeat is None:
            if len(self._by_handle) >= MAX_SHAPES:
                return 0
            repeat = Repeat(next(_handles), shape)
            self._by_shape[shape] = repeat
            self._by_handle[repeat.handle] = repeat
        return repeat.handle

    def get(self, handle: int, push: bool) -> Repeat:
        """The shape behind ``handle``; LLM_PARAM_INVALID for a handle this cluster
        never gave, or gave for the other direction."""
        repeat = self._by_handle.get(handle)
        if repeat is None or repeat.shape.push != push:
            raise LLMException(f"repeat handle {handle} is unknown to this cluster",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        return repeat
