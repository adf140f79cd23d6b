"""The caches and keys of one cluster, with LLM-DataDist's reference rules.

Pure bookkeeping: no I/O, no awaits. Every method changes the invariants in
one synchronous step and returns what the caller must free afterwards, so the
engine can do the (slow) freeing outside the critical section.

Rules kept from LLM-DataDist (see the spec, section 2.8):

* cache ids start at 1 per cluster and are shared by every kind of cache;
* the i-th key of an allocation binds batch slot i; a key with
  ``req_id == prefix_id == 2**64-1`` is a placeholder that occupies its slot
  without being indexed;
* an allocated cache lives while its id reference (dropped by
  ``deallocate_cache``) or any bound key remains;
* a successful pull by ``CacheKey`` (req id, not prefix) drops the key once
  every tensor of the slot has been pulled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.types import PLACEHOLDER_ID

from .planning import Layout

if TYPE_CHECKING:
    from .memory.base import Memory

KeyIndex = tuple[int, int]  # (req_id or prefix_id, model_id)


@dataclass(frozen=True)
class KeySpec:
    """A CacheKey as the daemon sees it (its cluster id only routes pulls)."""

    req_id: int
    model_id: int
    prefix_id: int = PLACEHOLDER_ID

    @property
    def is_prefix(self) -> bool:
        return self.prefix_id != PLACEHOLDER_ID

    @property
    def is_placeholder(self) -> bool:
        return self.req_id == PLACEHOLDER_ID and not self.is_prefix

    @property
    def index(self) -> KeyIndex:
        return (self.prefix_id, self.model_id) if self.is_prefix else (self.req_id, self.model_id)


@dataclass
class CacheEntry:
    """One cache: where its tensors live and who still references it."""

    cache_id: int
    blocks: bool
    num_tensors: int
    tensor_size: int
    batch_size: int  # number of slots (continuous) or blocks (blocks cache)
    memory: Memory  # the pool (or registered user buffer) holding the tensors
    extent_offset: int  # start of the cache's extent in its memory
    extent_size: int
    tensor_offsets: list[int]  # offsets of each tensor in its memory
    region_id: int
    released: bool = False  # the id reference was dropped
    keys: set[KeyIndex] = field(default_factory=set)
    prefix_keys: set[KeyIndex] = field(default_factory=set)
    blocks_model_id: int | None = None
    writable: bool = False  # remote-accessible: linked peers may push into it
    registered: bool = False  # the user's memory: never freed, keys not refcounted
    # Fencing (caches.Caches.free): set once the registry dropped the cache, so
    # that a transfer that found it before starts nothing more in its memory;
    # its extent goes back to the pool only once the transfers moving its bytes
    # (``moving``) have ended.
    gone: bool = field(default=False, compare=False)
    moving: int = field(default=0, repr=False, compare=False)
    _still: asyncio.Event | None = field(default=None, repr=False, compare=False)
    # Run once, when the registry drops the cache (``drop``): users of its memory
    # that no ``in_use`` counts stop here (native lanes' cells, native_lanes.py).
    when_gone: list[Callable[[CacheEntry], None]] = field(default_factory=list, repr=False,
                                                        compare=False)

    @property
    def stride(self) -> int:
        """Bytes of one batch slot (or block) of one tensor."""
        return self.tensor_size // self.batch_size

    @functools.cached_property
    def layout(self) -> Layout:
        """The planners' view of the tensors, built once: every transfer asks."""
        return Layout(self.tensor_offsets, self.tensor_size, self.batch_size)

    @property
    def alive(self) -> bool:
        return not self.released or bool(self.keys) or bool(self.prefix_keys)

    def drop(self) -> None:
        """The registry dropped the cache: nothing new may start in it (``gone``)."""
        self.gone = True
        hooks, self.when_gone = self.when_gone, []
        for hook in hooks:
            hook(self)

    def check_present(self) -> None:
        """Raise LLM_KV_CACHE_NOT_EXIST once the cache was freed or unregistered."""
        if self.gone:
            raise LLMException(f"cache {self.cache_id} was freed while a transfer used it",
                               status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """Count a transfer that moves the cache's bytes while the block runs."""
        self.moving += 1
        try:
            yield
        finally:
            self.moving -= 1
            if self.moving == 0 and self._still is not None:
                self._still.set()

    async def still(self) -> None:
        """Return once no transfer counted by ``in_use`` runs (each ends by its deadline)."""
        while self.moving:
            self._still = asyncio.Event()
            await self._still.wait()


@dataclass(frozen=True)
class Binding:
    """Where a key points: a cache and the batch slot bound to the key."""

    cache: CacheEntry
    batch_index: int


class CacheRegistry:
    """Caches, key indexes and reference counts of one cluster."""

    def __init__(self) -> None:
        self._next_id = 1
        self._caches: dict[int, CacheEntry] = {}
        self._req_keys: dict[KeyIndex, tuple[int, int]] = {}
        self._prefix_keys: dict[KeyIndex, tuple[int, int]] = {}
        self._blocks_by_model: dict[int, int] = {}
        # Tensors of a keyed slot already pulled by layer-ranged pulls.
        self._pulled: dict[KeyIndex, set[int]] = {}

    # -- queries ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self._caches)

    def caches(self) -> list[CacheEntry]:
        return list(self._caches.values())

    @property
    def key_count(self) -> int:
        return len(self._req_keys) + len(self._prefix_keys)

    def get(self, cache_id: int) -> CacheEntry:
        """Return a live cache addressable by id, or raise LLM_KV_CACHE_NOT_EXIST."""
        entry = self._caches.get(cache_id)
        if entry is None or entry.released:
            raise LLMException(f"cache {cache_id} does not exist",
                               status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        return entry

    def live(self, cache_id: int) -> CacheEntry | None:
        """:meth:`get` without the error: the live cache, or None."""
        entry = self._caches.get(cache_id)
        return None if entry is None or entry.released else entry

    def lookup_key(self, key: KeySpec) -> Binding:
        """Find the slot bound to a CacheKey, or raise LLM_KV_CACHE_NOT_EXIST."""
        table = self._prefix_keys if key.is_prefix else self._req_keys
        bound = None if key.is_placeholder else table.get(key.index)
        if bound is None:
            raise LLMException(f"no cache is bound to {key}",
                               status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        cache_id, batch_index = bound
        return Binding(self._caches[cache_id], batch_index)

    def lookup_blocks(self, model_id: int) -> CacheEntry:
        cache_id = self._blocks_by_model.get(model_id)
        if cache_id is None:
            raise LLMException(f"no blocks cache for model_id {model_id}",
                               status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        return self._caches[cache_id]

    # -- allocation ------------------------------------------------------

    def reserve_id(self) -> int:
        """Take the next cache id (ids may be consumed by calls that fail later)."""
        cache_id = self._next_id
        self._next_id += 1
        return cache_id

    def check_keys(self, keys: list[KeySpec], batch_size: int) -> None:
        """Apply LLM-DataDist's allocation-time key rules before any memory is taken."""
        if len(keys) > batch_size:
            raise LLMException(
                f"{len(keys)} cache keys exceed the batch size {batch_size}",
                status_code=LLMStatusCode.LLM_PARAM_INVALID)
        seen: set[KeySpec] = set()
        for key in keys:
            if key in seen:
                raise LLMException(f"multiply identical cache_keys: {key}",
                                   status_code=LLMStatusCode.LLM_PARAM_INVALID)
            seen.add(key)
            table = self._prefix_keys if key.is_prefix else self._req_keys
            taken = key.index in table or (
                not key.is_prefix and key.req_id == PLACEHOLDER_ID
                and key.model_id in self._blocks_by_model)
            if taken:
                raise LLMException(f"cache key {key} is already bound to a cache",
                                   status_code=LLMStatusCode.LLM_PARAM_INVALID)

    def check_blocks_key(self, model_id: int) -> None:
        if model_id in self._blocks_by_model:
            raise LLMException(f"a blocks cache for model_id {model_id} already exists",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)

    def add(self, entry: CacheEntry, keys: list[KeySpec]) -> None:
        """Insert an allocated cache and bind its keys (checked by check_keys)."""
        self._caches[entry.cache_id] = entry
        for batch_index, key in enumerate(keys):
            if key.is_placeholder:
                continue
            if key.is_prefix:
                self._prefix_keys[key.index] = (entry.cache_id, batch_index)
                entry.prefix_keys.add(key.index)
            else:
                self._req_keys[key.index] = (entry.cache_id, batch_index)
                entry.keys.add(key.index)
        if entry.blocks_model_id is not None:
            self._blocks_by_model[entry.blocks_model_id] = entry.cache_id

    # -- release ---------------------------------------------------------

    def release(self, cache_id: int, blocks: bool) -> CacheEntry | None:
        """Drop the id reference; return the entry if it must be freed now.

        Unknown ids are a no-op, as in LLM-DataDist. A blocks cache is freed at
        once together with its blocks key.
        """
        entry = self._caches.get(cache_id)
        if entry is None or entry.released or entry.registered:
            return None
        if entry.blocks != blocks:
            kind = "blocks" if entry.blocks else "non-blocks"
            raise LLMException(f"cache {cache_id} is a {kind} cache",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        entry.released = True
        if entry.blocks_model_id is not None:
            self._blocks_by_model.pop(entry.blocks_model_id, None)
        return self._reap(entry)

    def remove_key(self, key: KeySpec) -> CacheEntry | None:
        """Unbind a key; return the cache if that was its last reference."""
        table = self._prefix_keys if key.is_prefix else self._req_keys
        bound = table.get(key.index)
        if bound is None or self._caches[bound[0]].registered:
            return None
        del table[key.index]
        self._pulled.pop(key.index, None)
        entry = self._caches[bound[0]]
        (entry.prefix_keys if key.is_prefix else entry.keys).discard(key.index)
        return self._reap(entry)

    def record_pull(self, key: KeySpec, tensor_indices: list[int]) -> CacheEntry | None:
        """Account a successful pull by key; drop the key once all tensors were pulled.

        Prefix keys never lose their reference through a pull.
        """
        if key.is_prefix or key.is_placeholder or key.index not in self._req_keys:
            return None
        entry = self._caches[self._req_keys[key.index][0]]
        if entry.registered:
            return None
        if tensor_indices:
            pulled = self._pulled.setdefault(key.index, set())
            pulled.update(i for i in tensor_indices if 0 <= i < entry.num_tensors)
            if len(pulled) < entry.num_tensors:
                return None
        return self.remove_key(key)

    def add_registered(self, entry: CacheEntry, keys: list[KeySpec]) -> list[CacheEntry]:
        """Insert a registered cache; its keys overwrite earlier bindings (no checks).

        Returns the allocated caches that lost their last reference that way.
        """
        orphans = []
        for key in keys:
            table = self._prefix_keys if key.is_prefix else self._req_keys
            previous = None if key.is_placeholder else table.get(key.index)
            if previous is not None:
                old = self._caches[previous[0]]
                (old.prefix_keys if key.is_prefix else old.keys).discard(key.index)
                if self._reap(old) is not None:
                    orphans.append(old)
        self.add(entry, keys)
        return orphans

    def unregister(self, cache_id: int) -> CacheEntry | None:
        """Forget a registered cache and the keys bound to it; unknown ids are a no-op."""
        entry = self._caches.get(cache_id)
        if entry is None or not entry.registered:
            return None
        for index in entry.keys:
            self._req_keys.pop(index, None)
            self._pulled.pop(index, None)
        for index in entry.prefix_keys:
            self._prefix_keys.pop(index, None)
        if entry.blocks_model_id is not None:
            self._blocks_by_model.pop(entry.blocks_model_id, None)
        del self._caches[cache_id]
        entry.drop()
        return entry

    def drain(self) -> list[CacheEntry]:
        """Forget everything (cluster teardown) and return every cache to free."""
        entries = list(self._caches.values())
        for entry in entries:
            entry.drop()
        self._caches.clear()
        self._req_keys.clear()
        self._prefix_keys.clear()
        self._blocks_by_model.clear()
        self._pulled.clear()
        return entries

    def _reap(self, entry: CacheEntry) -> CacheEntry | None:
        if entry.alive:
            return None
        del self._caches[entry.cache_id]
        entry.drop()
        return entry
