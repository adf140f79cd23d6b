"""Handles for repeated pulls: one per pull_cache shape a cluster has pulled.

An inference engine pulls slot after slot between the same two caches: the
same source cache, destination cache, size and tensors, only the two batch
indices change. After a pull by ``CacheKeyByIdAndIndex`` the daemon gives
the client a handle for that *shape* (``PullCacheReply.repeat_handle``); the
client sends later pulls of the shape as a 16-byte lane frame naming the
handle and the two indices (``RepeatPull``), which the daemon answers as it
answers ``PullCache`` (``transfers.pull_again``) without decoding a request
or looking up again what the last pull found.

This module holds only the shapes and their handles, so that ``Cluster``
can own a table without importing the transfer code.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from hixl_client.status import LLMException, LLMStatusCode

# A cluster gives out handles for this many shapes at most; later shapes get
# none (their pulls take the full path), so a client naming ever new caches
# cannot grow the daemon's memory.
MAX_SHAPES = 1024

# Handles are unique in the daemon's lifetime (never reused by another
# cluster or shape), so a handle from a finalized cluster cannot name a
# shape of a new one.
_handles = itertools.count(1)


@dataclass(frozen=True, slots=True)
class PullShape:
    """A pull_cache request less its two batch indices."""

    src_cluster_id: int
    src_cache_id: int
    dst_cache_id: int
    size: int
    src_tensor_indices: tuple[int, ...]
    dst_tensor_indices: tuple[int, ...]
    tensor_num_per_layer: int


class Repeat:
    """A shape's handle and what the transfer code last found for it."""

    __slots__ = ("found", "handle", "shape")

    def __init__(self, handle: int, shape: PullShape) -> None:
        self.handle = handle
        self.shape = shape
        self.found: Any = None  # transfers.Found, or None until a pull finds it again


class PullShapes:
    """One cluster's shapes and their handles."""

    def __init__(self) -> None:
        self._by_shape: dict[PullShape, Repeat] = {}
        self._by_handle: dict[int, Repeat] = {}
        self.repeated = 0  # pulls by handle that found what the last one did (admin status)

    def __len__(self) -> int:
        return len(self._by_handle)

    def offer(self, shape: PullShape) -> int:
        """The handle of ``shape``, new if needed; 0 (none) once the table is full."""
        repeat = self._by_shape.get(shape)
        if repeat is None:
            if len(self._by_handle) >= MAX_SHAPES:
                return 0
            repeat = Repeat(next(_handles), shape)
            self._by_shape[shape] = repeat
            self._by_handle[repeat.handle] = repeat
        return repeat.handle

    def get(self, handle: int) -> Repeat:
        """The shape behind ``handle``, or LLM_PARAM_INVALID for one this cluster never gave."""
        repeat = self._by_handle.get(handle)
        if repeat is None:
            raise LLMException(f"repeat handle {handle} is unknown to this cluster",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        return repeat
