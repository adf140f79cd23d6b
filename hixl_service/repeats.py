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

This module holds only the shapes and their handles, so that ``Cluster``
can own a table without importing the transfer code.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from hixl_wire.status import LLMException, LLMStatusCode

# A cluster gives out handles for this many shapes at most; later shapes get
# none (their transfers take the full path), so a client naming ever new
# caches cannot grow the daemon's memory.
MAX_SHAPES = 1024

# Handles are unique in the daemon's lifetime (never reused by another
# cluster or shape), so a handle from a finalized cluster cannot name a
# shape of a new one.
_handles = itertools.count(1)


@dataclass(frozen=True, slots=True)
class TransferShape:
    """A pull_cache or push_cache request less its two batch indices."""

    push: bool
    remote_cluster_id: int
    remote_cache_id: int  # the pull's source, the push's destination
    local_cache_id: int  # the pull's destination, the push's source
    size: int  # -1 for every push
    src_tensor_indices: tuple[int, ...]
    dst_tensor_indices: tuple[int, ...]
    tensor_num_per_layer: int
    checksum: bool = False  # the transfers carry a CRC-32C (TCP links)


class Repeat:
    """A shape's handle and what the transfer code last found for it."""

    __slots__ = ("found", "handle", "shape")

    def __init__(self, handle: int, shape: TransferShape) -> None:
        self.handle = handle
        self.shape = shape
        self.found: Any = None  # prepared.PreparedTransfer, or None until a transfer finds it again


class RepeatTable:
    """One cluster's shapes and their handles."""

    def __init__(self) -> None:
        self._by_shape: dict[TransferShape, Repeat] = {}
        self._by_handle: dict[int, Repeat] = {}
        self.repeated = 0  # transfers by handle that reused what the last one found
        self.answered_at_once = 0  # of those, ended in the lane's frame callback

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
