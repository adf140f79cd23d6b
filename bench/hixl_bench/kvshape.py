"""KV-shaped mode: the time to move one prompt's KV cache of a model preset.

Per preset a layer has a K and a V tensor of ``[tokens, kv_heads, head_dim]``
fp16. Modes:

* ``pull_cache``: one continuous cache ``2*layers x [1, tokens, kv_heads, head_dim]``
  pulled whole (works in every build);
* ``pull_cache_layers``: the same cache pulled one layer at a time (``layers``
  sequential ``pull_cache`` calls with layer ranges), the per-layer cost;
* ``pull_blocks``: a paged cache ``2*layers x [pages, page_tokens, kv_heads,
  head_dim]`` on both sides, the prompt's pages listed in a shuffled order on
  each side (as a paged allocator scatters them);
* ``transfer_cache_async``: the initiator's continuous cache sent layer by
  layer to the target's cache (LLM-DataDist's layer-wise API), waited for.
  Every layer is ready at once for the timed prompts; then a few *paced*
  prompts model a model computing: layer L becomes ready (a blocking
  synchronizer returns) at ``(L + 1) * pace`` with ``pace`` =
  ``PACE_FACTOR`` x one layer's transfer time (the unpaced prompt time over
  the layers). For those the row reports the **layer lag**: from a layer's
  synchronizer returning (stamped in the thread it ran in) to the daemon
  reporting that layer landed, the median over ``LAG_PROMPTS`` prompts. The
  goal is the last layer landing within one layer's transfer time of its
  synchronizer returning (``lag_ratio`` <= 1). One layer's transfer time
  is measured on its own: the median of ``push_cache`` calls each moving
  one layer (K and V) alone over the same link, the layers in turn (cold in
  cache, as a layer-wise transfer's layers are), each after the same idle
  time as a paced layer (``layer_alone_ms``), a few after each paced prompt
  so that both halves of the ratio see the same moments of a noisy host.
  The unpaced prompt time over the layers (``layer_ms``) is kept as a
  second reference (``lag_ratio_avg``); it is not the target's, since it
  shrinks whenever the daemon overlaps more of one layer's fixed cost with
  the next one's bytes, which makes a faster pipeline look worse.

A mode this build's CacheManager lacks is reported as skipped.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from hixl_bench.env import Clusters, remote_accessible, supports
from hixl_bench.model import HIXL, Budget, Row, drive
from hixl_bench.plan import KvCase
from hixl_client import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LayerSynchronizer,
)

_METHODS = {"pull_cache": "pull_cache", "pull_cache_layers": "pull_cache",
            "pull_blocks": "pull_blocks", "transfer_cache_async": "transfer_cache_async"}
_MODEL_ID = 7
# Paced layer-wise prompts: a layer's compute takes this many times its transfer.
PACE_FACTOR = 1.5
# Paced prompts per layer-wise row (their median lag is reported), and the
# pushes of one layer alone after each of them, whose median is one layer's
# transfer time.
LAG_PROMPTS = 7
ALONE_PUSHES_PER_PROMPT = 4
# Small prompts take more paced prompts, up to this many or the row's time
# budget: their lag is a fraction of a millisecond, which a busy moment of
# the host moves.
LAG_PROMPTS_MAX = 25
# The step between two layers pushed alone, as a fraction of the model (see
# _LayerAlone): about 1 / golden ratio^2, which spreads any number of steps
# evenly.
SPREAD_FRACTION = 0.382


class _Ready(LayerSynchronizer):
    """Every layer is ready at once: the transfer alone is timed."""

    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        return True


class _Paced(LayerSynchronizer):
    """Layer L is ready ``(L + 1) * pace_s`` after ``start()``, as if computed then; blocking,
    like a device event, so the client runs it in a worker thread."""

    def __init__(self, pace_s: float) -> None:
        self.pace_s = pace_s
        self.started = time.perf_counter()

    def start(self) -> None:
        self.started = time.perf_counter()

    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        wait = self.started + (layer_index + 1) * self.pace_s - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        return True


def _continuous(kv: KvCase) -> CacheDesc:
    m = kv.model
    return CacheDesc(2 * m.layers, [1, kv.tokens, m.kv_heads, m.head_dim], DataType.DT_FLOAT16)


def _paged(kv: KvCase) -> CacheDesc:
    m = kv.model
    return CacheDesc(2 * m.layers, [kv.num_pages, kv.page_tokens, m.kv_heads, m.head_dim],
                     DataType.DT_FLOAT16)


def _row(kv: KvCase) -> Row:
    block, nblocks = kv.ceiling_shape(1 << 62)
    op = "push" if kv.mode == "transfer_cache_async" else "pull"
    return Row(HIXL, "hixl", "kv", op, kv.path, block, nblocks, extra={
        "model": kv.model.name, "tokens": kv.tokens, "page_tokens": kv.page_tokens,
        "kv_mode": kv.mode, "prompt_bytes": kv.prompt_bytes})


async def _wait_task(task: Any) -> None:
    done = task.synchronize() if hasattr(task, "synchronize") else task
    if inspect.isawaitable(done):
        done = await done
    if hasattr(done, "__iter__"):  # LLM-DataDist returns (status, per-cluster statuses)
        status = next(iter(done), None)
        if status is not None and int(status) != 0:
            raise RuntimeError(f"transfer_cache_async finished with {done}")


class _Prompt:
    """The caches of one KV case on both sides, and its request."""

    def __init__(self, env: Clusters, kv: KvCase) -> None:
        self.env, self.kv = env, kv
        self.target = env.target_id(kv.path)
        self.local: Cache | None = None
        self.remote: Cache | None = None

    async def setup(self) -> Callable[[int], Awaitable[None]]:
        cm, tcm = self.env.cm, self.env.target_cm(self.kv.path)
        if self.kv.mode == "pull_blocks":
            desc = _paged(self.kv)
            self.remote = await tcm.allocate_blocks_cache(desc, BlocksCacheKey(0, _MODEL_ID))
            self.local = await cm.allocate_blocks_cache(desc, BlocksCacheKey(0, _MODEL_ID))
            return self._pull_blocks
        desc = _continuous(self.kv)
        self.remote = await tcm.allocate_cache(desc)
        self.local = await cm.allocate_cache(desc)
        return {"pull_cache": self._pull, "pull_cache_layers": self._pull_layers,
                "transfer_cache_async": self._transfer}[self.kv.mode]

    async def close(self) -> None:
        for cache, cm in ((self.local, self.env.cm),
                          (self.remote, self.env.target_cm(self.kv.path))):
            if cache is not None:
                free = cm.deallocate_blocks_cache if cache.is_blocks_cache else \
                    cm.deallocate_cache
                await free(cache)

    def _key(self) -> CacheKeyByIdAndIndex:
        assert self.remote is not None
        return CacheKeyByIdAndIndex(self.target, self.remote.cache_id, 0)

    async def _pull(self, _index: int) -> None:
        assert self.local is not None
        await self.env.cm.pull_cache(self._key(), self.local)

    async def _pull_layers(self, _index: int) -> None:
        assert self.local is not None
        key = self._key()
        for layer in range(self.kv.model.layers):
            layers = range(layer, layer + 1)
            await self.env.cm.pull_cache(key, self.local, src_layer_range=layers,
                                         dst_layer_range=layers)

    async def _pull_blocks(self, index: int) -> None:
        assert self.local is not None
        pages = list(range(self.kv.num_pages))
        order = random.Random(index)
        src, dst = order.sample(pages, len(pages)), order.sample(pages, len(pages))
        cm: Any = self.env.cm  # pull_blocks is not in every build
        pull_blocks = cm.pull_blocks
        await pull_blocks(BlocksCacheKey(self.target, _MODEL_ID), self.local, src, dst)

    async def _transfer(self, _index: int, synchronizer: LayerSynchronizer | None = None) -> None:
        assert self.local is not None and self.remote is not None
        from hixl_client.transfer_config import TransferConfig, TransferWithCacheKeyConfig

        layers = range(self.kv.model.layers)
        config: object = (
            TransferWithCacheKeyConfig(self._key(), layers, layers) if remote_accessible()
            else TransferConfig(self.target, list(self.remote.tensor_addrs)))
        cm: Any = self.env.cm  # nor transfer_cache_async
        transfer = cm.transfer_cache_async
        task = transfer(self.local, synchronizer or _Ready(), [config])
        if inspect.isawaitable(task):
            task = await task
        await _wait_task(task)

    async def layer_lags(self, layer_s: float, prompts: int,
                         seconds: float) -> dict[str, float] | None:
        """Paced prompts (see the module docstring), at least ``prompts`` of them
        and more while ``seconds`` last:
        the median lag of the last layer and of every layer, against one layer's
        transfer time measured alone (and against the unpaced average ``layer_s``)."""
        try:
            from hixl_client.timing import capture_layer_lags
        except ImportError:  # a build without the layer-wise hooks
            return None
        pacer = _Paced(PACE_FACTOR * layer_s)
        alone = _LayerAlone(self)
        await alone.warm()
        last, every, alone_times = [], [], []
        started = time.perf_counter()
        index = 0
        while index < prompts or (index < LAG_PROMPTS_MAX and
                                  time.perf_counter() - started < seconds):
            index += 1
            with capture_layer_lags() as tasks:
                pacer.start()
                await self._transfer(index, pacer)
            lags = [lag.lag_s for lag in tasks[-1] if lag.lag_s is not None] if tasks else []
            if len(lags) != self.kv.model.layers:
                return None  # some layer never reported landing
            last.append(lags[-1])
            every.extend(lags)
            # Right after each prompt, so that the host's drift enters both sides alike.
            alone_times += await alone.timed(ALONE_PUSHES_PER_PROMPT, pacer.pace_s)
        last_s = statistics.median(last)
        result = {"layer_ms": layer_s * 1e3, "pace_ms": pacer.pace_s * 1e3,
                  "last_lag_ms": last_s * 1e3, "median_lag_ms": statistics.median(every) * 1e3,
                  "max_lag_ms": max(every) * 1e3, "lag_ratio_avg": last_s / layer_s,
                  "lag_prompts": index}
        alone_s = statistics.median(alone_times) if alone_times else None
        if alone_s is not None:
            result["layer_alone_ms"] = alone_s * 1e3
        result["lag_ratio"] = last_s / (alone_s or layer_s)
        return result


class _LayerAlone:
    """One layer's transfer time on its own: ``push_cache`` calls each moving one
    layer (K and V) alone, with the same bytes, link and direction as a layer of
    a layer-wise transfer, each after the idle time a paced layer has (its
    compute). Nothing where push is not available.

    The layers take turns, so that each push finds its bytes as cold in cache
    as a layer of a layer-wise transfer does: a fixed order that visits every
    layer once per round, the last layer first, each step a good part of the
    model away (a stride coprime to the layer count). The pushes a row has
    time for so spread over the whole model; in turn from layer 0, 28 pushes
    of an 80-layer model never reached the layers the lag is taken on.
    Pushing one layer over and over
    kept its bytes in cache at both ends (4 MiB at 1k tokens): 0.84-0.94 ms a
    push against 1.05-1.16 ms for layers in turn, faster than any layer of a
    layer-wise transfer can move. Every layer is pushed once first, untimed
    (:meth:`warm`), so that the timed pushes repeat a known shape by its
    handle, as a layer-wise task's layers reuse their planned ranges.
    """

    def __init__(self, prompt: _Prompt) -> None:
        self._prompt = prompt
        self._order = alone_order(prompt.kv.model.layers)
        self._available = remote_accessible()

    async def _push(self, layer: int) -> None:
        prompt = self._prompt
        assert prompt.local is not None
        cm: Any = prompt.env.cm  # push_cache is not in every build
        one = range(layer, layer + 1)
        await cm.push_cache(prompt._key(), prompt.local, src_layer_range=one,
                            dst_layer_range=one)

    async def warm(self) -> None:
        if self._available:
            for layer in range(self._prompt.kv.model.layers):
                await self._push(layer)

    async def timed(self, count: int, gap_s: float) -> list[float]:
        """The times of ``count`` more pushes, each of the least recently pushed layer."""
        if not self._available:
            return []
        times = []
        for _ in range(count):
            await asyncio.sleep(gap_s)
            layer = next(self._order)
            started = time.perf_counter()
            await self._push(layer)
            times.append(time.perf_counter() - started)
        return times


def alone_order(layers: int) -> Iterator[int]:
    """The layers ``_LayerAlone`` pushes, without end: every layer once per round,
    the last one first, each a stride coprime to ``layers`` from the one before."""
    stride = max(1, round(layers * SPREAD_FRACTION))
    while math.gcd(stride, layers) != 1:
        stride += 1
    index = 0
    while True:
        yield (layers - 1 - index * stride) % layers
        index += 1


async def run_kv(env: Clusters, kv: KvCase, budget: Budget) -> Row:
    """Measure one KV case: p50 of the whole prompt's move is its ``prompt_ms``."""
    row = _row(kv)
    method = _METHODS[kv.mode]
    if not supports(env.cm, method):
        row.status = f"skipped: {method} not available in this build"
        return row
    prompt = _Prompt(env, kv)
    try:
        request = await prompt.setup()
        timing = await drive(request, 1, budget)
        row.fill(timing, kv.prompt_bytes)
        row.extra["prompt_ms"] = None if row.p50_us is None else row.p50_us / 1e3
        if kv.mode == "transfer_cache_async" and row.p50_us is not None:
            lags = await prompt.layer_lags(row.p50_us / 1e6 / kv.model.layers,
                                           max(LAG_PROMPTS, budget.min_requests),
                                           budget.seconds)
            if lags is not None:
                row.extra.update(lags)
    except Exception as exc:  # reported in the row; the run goes on
        row.status = f"error: {type(exc).__name__}: {exc}"
    finally:
        await prompt.close()
    return row
