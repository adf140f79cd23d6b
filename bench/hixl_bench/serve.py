"""The serving suite: a decode instance pulling prompts from a prefill instance.

What vLLM-Ascend's and MindIE's connectors do per request, between two real
daemons: the prefill side (daemon B) holds a paged KV cache keyed
``BlocksCacheKey(prefill_cluster, model_id)``; the decode side (daemon A)
pulls one prompt with

    pull_blocks(BlocksCacheKey(prefill_cluster, model_id), dst, src_blocks, dst_blocks,
                src_layer_range=range(layers), dst_layer_range=range(layers))

Block tables are drawn at random from each side's cache, differently on the
two sides (seeded), as a long-running cache leaves its free blocks; the
requests in flight use disjoint blocks. Memory, the same on both sides:

* ``shareable``: ``alloc_shareable`` + ``register_blocks_cache``;
* ``pool``: ``allocate_blocks_cache`` from the cluster's pool;
* ``engine``: a numpy array the engine allocated itself, registered with
  ``register_blocks_cache`` (the daemons reach it with cross-memory calls and
  stage it through their bounce buffers); a daemon whose host forbids that
  (Yama, another user) refuses it, and the row says so (skipped).

The ``async`` client runs here; the blocking facade (``sync``) runs in a
process of its own (``serve_worker``), since grpc.aio serves one event loop
per process. Every row checks its pulls byte-exact (before and after the
timed requests): each source block holds a pattern of its tensor and block
index, so the decode side knows what must have landed where. This module
holds the cases' memory, tables and checks; ``serve_group`` times them,
the rows compared with each other side by side.
"""

from __future__ import annotations

import asyncio
import ctypes
import random
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hixl_bench.env import Clusters
from hixl_bench.model import HIXL, PROBE, Budget, Row, drive
from hixl_bench.plan import ServeCase
from hixl_bench.runner import Caches, Pull
from hixl_client import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheManager,
    DataType,
    LLMException,
    alloc_shareable,
)

SUITE = "serve"
REF_4K = "hixl-4k"  # the repeated 4 KiB pull by cache id the small rows compare with
# Block tables each request slot cycles through.
ROTATIONS = 4
_KEY_MULTIPLIER = 0x9E37_79B1  # odd
_DTYPES = {"fp16": DataType.DT_FLOAT16, "bf16": DataType.DT_BF16}


def desc_of(case: ServeCase) -> CacheDesc:
    m = case.model
    return CacheDesc(case.tensors, [case.pool_blocks, case.block_tokens, m.kv_heads, m.head_dim],
                     _DTYPES[case.dtype])


def block_tables(case: ServeCase, seed: int) -> list[list[list[int]]]:
    """``[slot][rotation]`` -> one prompt's block indices on one side.

    The cache's blocks are shuffled and dealt to the ``conc`` request slots,
    so requests in flight never share a block; each table is a random sample
    of its slot's share in random order: the scattered free blocks of a
    cache that has served for a while."""
    rng = random.Random(seed)
    order = list(range(case.pool_blocks))
    rng.shuffle(order)
    share = case.pool_blocks // case.conc
    return [[rng.sample(order[slot * share:(slot + 1) * share], case.blocks)
             for _ in range(ROTATIONS)] for slot in range(case.conc)]


def side_tables(case: ServeCase, index: int) -> tuple[list[list[list[int]]],
                                                      list[list[list[int]]]]:
    """(prefill tables, decode tables) of the ``index``-th case: different seeds."""
    return block_tables(case, 2 * index), block_tables(case, 2 * index + 1)


def _words(case: ServeCase) -> int:
    return case.block_bytes // 4


def tensor_view(addr: int, case: ServeCase) -> np.ndarray:
    """One tensor as ``[pool_blocks, words]`` uint32, over memory at ``addr`` in this process."""
    raw = (ctypes.c_uint8 * (case.pool_blocks * case.block_bytes)).from_address(addr)
    view: np.ndarray = np.frombuffer(memoryview(raw).cast("B"), dtype=np.uint32)
    return view.reshape(case.pool_blocks, _words(case))


def pattern(case: ServeCase, tensor: int, blocks: np.ndarray) -> np.ndarray:
    """The source's words of ``blocks`` of ``tensor``: word i of a block is i xor
    the block's own key. Keys are the (tensor, block) ids times an odd constant
    (a bijection modulo 2**32), so a block landing in the wrong place differs
    in every word, and a word out of place within a block differs too."""
    ids = np.uint64(tensor * case.pool_blocks) + blocks.astype(np.uint64)
    keys = (ids * np.uint64(_KEY_MULTIPLIER)).astype(np.uint32)
    words_of: np.ndarray = np.arange(_words(case), dtype=np.uint32)[None, :] ^ keys[:, None]
    return words_of


def fill_source(case: ServeCase, addrs: list[int]) -> None:
    everything = np.arange(case.pool_blocks)
    for tensor, addr in enumerate(addrs):
        tensor_view(addr, case)[:] = pattern(case, tensor, everything)


def clear_blocks(case: ServeCase, addrs: list[int], blocks: list[int]) -> None:
    for addr in addrs:
        tensor_view(addr, case)[blocks] = 0


def check_blocks(case: ServeCase, addrs: list[int], src: list[int], dst: list[int]) -> None:
    """Raise unless block ``dst[i]`` of every tensor holds source block ``src[i]``."""
    src_blocks = np.asarray(src)
    for tensor, addr in enumerate(addrs):
        got = tensor_view(addr, case)[dst]
        if not np.array_equal(got, pattern(case, tensor, src_blocks)):
            bad = int(np.flatnonzero((got != pattern(case, tensor, src_blocks)).any(axis=1))[0])
            raise RuntimeError(f"pull_blocks was not byte-exact: tensor {tensor}, block "
                               f"{src[bad]} -> {dst[bad]}")


@dataclass
class Side:
    """One side's cache of a case and how to give it back."""

    cache: Cache
    addrs: list[int]
    release: Callable[[], Awaitable[None]]


class Unsupported(Exception):
    """This build refuses the case's memory: the row is skipped, not failed."""


async def open_side(cm: CacheManager, case: ServeCase,
                    key: BlocksCacheKey | None) -> Side:
    """The case's cache on one side, in its memory mode (see the module docstring)."""
    desc = desc_of(case)
    if case.memory == "pool":
        cache = await cm.allocate_blocks_cache(desc, key)

        async def free_pool() -> None:
            await cm.deallocate_blocks_cache(cache)
        return Side(cache, list(cache.tensor_addrs), free_pool)
    tensor_bytes = case.pool_blocks * case.block_bytes
    owner: Any
    if case.memory == "shareable":
        owner = alloc_shareable(case.cache_bytes)
        base = owner.address
    else:  # engine: memory hixl did not allocate
        owner = np.zeros(case.cache_bytes, dtype=np.uint8)
        base = owner.ctypes.data
    addrs = [base + t * tensor_bytes for t in range(case.tensors)]
    try:
        cache = await cm.register_blocks_cache(desc, addrs, key)
    except LLMException as exc:
        if case.memory == "engine":
            raise Unsupported(refused(exc)) from exc
        raise

    async def unregister() -> None:
        await cm.unregister_cache(cache.cache_id)
        if case.memory == "shareable":
            owner.close()
    return Side(cache, addrs, unregister)


def refused(exc: LLMException) -> str:
    """The skipped status of a row whose engine-allocated memory this build refuses."""
    reason = str(exc).split(",")[0]
    return f"unsupported: the daemon cannot reach engine-allocated memory ({reason})"


def row_of(case: ServeCase, index: int, cold_bytes: int) -> Row:
    """The empty row of the ``index``-th case (``case_index`` names its block
    tables: peer rows on the same tables carry the same)."""
    _, ceiling_nblocks = case.ceiling_shape(cold_bytes)
    return Row(HIXL, "hixl", SUITE, "pull", "tcp", case.block_bytes, case.ranges, case.conc,
               extra={"case_index": index, "model": case.model.name, "dtype": case.dtype,
                      "tokens": case.tokens,
                      "block_tokens": case.block_tokens, "memory": case.memory,
                      "client": case.client, "request_bytes": case.request_bytes,
                      "pool_blocks": case.pool_blocks, "ceiling_nblocks": ceiling_nblocks})


def case_spec(case: ServeCase) -> dict[str, Any]:
    spec = asdict(case)
    spec["model"] = asdict(case.model)
    return spec


def case_from_spec(spec: dict[str, Any]) -> ServeCase:
    from hixl_bench.plan import ModelPreset

    return ServeCase(**{**spec, "model": ModelPreset(**spec["model"])})


class Prefill:
    """The prefill side of one case: its cache filled with the source pattern."""

    def __init__(self, env: Clusters, case: ServeCase, model_id: int) -> None:
        self.env, self.case, self.model_id = env, case, model_id
        self.key = BlocksCacheKey(env.target_id("tcp"), model_id)
        self.side: Side | None = None

    async def open(self) -> None:
        self.side = await open_side(self.env.target_cm("tcp"), self.case, self.key)
        await asyncio.to_thread(fill_source, self.case, self.side.addrs)

    async def close(self) -> None:
        if self.side is not None:
            await self.side.release()


async def verify(cm: CacheManager, case: ServeCase, key: BlocksCacheKey, dst: Side,
                  pairs: list[tuple[list[int], list[int]]]) -> int:
    """Pull each (src, dst) table pair into cleared blocks and check the bytes."""
    layers = range(case.model.layers)
    for src, dst_blocks in pairs:
        clear_blocks(case, dst.addrs, dst_blocks)
        await cm.pull_blocks(key, dst.cache, src, dst_blocks, src_layer_range=layers,
                             dst_layer_range=layers)
        await asyncio.to_thread(check_blocks, case, dst.addrs, src, dst_blocks)
    return len(pairs)


def verify_pairs(src: list[list[list[int]]], dst: list[list[list[int]]],
                 rotations: range) -> list[tuple[list[int], list[int]]]:
    """The (src, dst) tables of every slot in ``rotations``.

    Checked before the timed pulls with every rotation, the pairs are also
    their warm-up: every block a timed pull moves has been moved once, so no
    timed pull pays for the first touch of a page in either daemon's
    mapping, which a serving cache that has run a while does not either."""
    return [(src[slot][r], dst[slot][r]) for r in rotations for slot in range(len(src))]


BEFORE, AFTER = range(ROTATIONS), range(ROTATIONS - 1, ROTATIONS)


def worker_pool(case: ServeCase) -> int:
    """The facade cluster's pool: the case's cache in pool mode, else a token pool."""
    return case.cache_bytes + (16 << 20) if case.memory == "pool" else 16 << 20


class Reference:
    """The repeated 4 KiB ``pull_cache`` by cache id that the small rows' p50
    compares with, in one pair of clusters; its caches are allocated on first use."""

    def __init__(self, env: Clusters) -> None:
        self.env = env
        self._caches: Caches | None = None

    async def pull(self) -> Pull:
        if self._caches is None:
            desc = CacheDesc(1, [2, 4096], DataType.DT_UINT8)
            local = await self.env.cm.allocate_cache(desc)
            remote = await self.env.target_cm("tcp").allocate_cache(desc)
            self._caches = Caches(local, remote, 2)
        return Pull(self.env, "tcp", self._caches)

    async def close(self) -> None:
        if self._caches is not None:
            await self.env.cm.deallocate_cache(self._caches.local)
            await self.env.target_cm("tcp").deallocate_cache(self._caches.remote)
            self._caches = None


async def ref_4k_row(env: Clusters, budget: Budget) -> Row:
    """The reference's row of its own."""
    reference = Reference(env)
    try:
        timing = await drive((await reference.pull()).request, 1, budget)
    finally:
        await reference.close()
    return Row(PROBE, REF_4K, SUITE, "pull", "tcp", 4096, 1).fill(timing, 4096)


def pool_bytes(cases: tuple[ServeCase, ...]) -> int:
    """Each serving cluster's pool: the largest pool-mode cache and the 4 KiB probe's."""
    return max([c.cache_bytes for c in cases if c.memory == "pool"] or [0]) + (64 << 20)
