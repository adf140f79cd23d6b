"""Copies inside the daemon: native memcpy between host memories, and the
``copy_job`` of the other kinds (``memory``: ACL copies for device memory,
cross-memory calls for a client process's) when one of them is involved.

A host copy up to 4 MiB runs on the event loop's own thread when nothing else
is under way (``CompletionDispatcher.idle``), from 256 KiB helped by one copy
thread that the loop's thread waits for natively, since memory bandwidth
grows with cores here. Otherwise it goes to the native copy threads, so that
the loop serves the other calls meanwhile, cut into equal shares above 1 MiB.
Ranges within one memory may overlap, so only one thread copies those. The
copy threads are native (``hixl_native.CopyPool``) and finish a posted copy
through the dispatcher's completion queue: a Python thread pool
needed the GIL to start and to end each copy, and waited for it while the
loop ran other calls' Python. The measurements behind these sizes are in
docs/architecture.md and bench/RESULTS.md.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import hixl_native
import numpy as np

from .completions import CompletionDispatcher
from .memory.base import Memory
from .native_errors import copy_error
from .planning import Ranges, total_bytes

# A host copy the daemon runs alone (no other transfer under way) holds the
# event loop's thread up to these sizes: the hop to a copy thread and back
# through the completion queue costs more than copying 1 MiB. From
# HELPED_COPY_BYTES the loop's thread shares the copy with one copy thread
# and waits for it natively (CopyPool.copy_helped), since memory bandwidth
# grows with cores; below it the thread's wake-up costs more than it saves.
# A helped copy of LOOP_COPY_MAX_BYTES holds the loop about as long as one
# thread copying half of it.
INLINE_COPY_BYTES = 1 << 20
HELPED_COPY_BYTES = 256 << 10
LOOP_COPY_MAX_BYTES = 4 << 20
_SHARE_ALIGN = 4096
# Column order turning planned (src, dst, length) ranges into the native
# calls' (dst, src, length) triples; ``take`` gives a C-contiguous copy.
_DST_SRC_LENGTH = np.array([1, 0, 2])


def triples_of(ranges: Ranges) -> np.ndarray:
    """The native copies' C-contiguous (dst, src, length) rows of planned
    (src, dst, length) ranges."""
    triples: np.ndarray = ranges.take(_DST_SRC_LENGTH, axis=1)
    return triples


def split_triples(triples: np.ndarray, parts: int) -> list[np.ndarray]:
    """Cut (dst, src, length) triples into ``parts`` shares of about equal bytes.

    Cuts fall on 4 KiB boundaries of the request's byte stream, so a single
    large range is cut too; the shares together copy exactly the input's bytes.
    """
    lengths = triples[:, 2]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    total = int(ends[-1]) if len(ends) else 0
    shares = []
    low = 0
    for k in range(1, parts + 1):
        high = total if k == parts else (total * k // parts) // _SHARE_ALIGN * _SHARE_ALIGN
        if high <= low:
            continue
        first = int(np.searchsorted(ends, low, side="right"))
        last = int(np.searchsorted(starts, high, side="left"))
        share = triples[first:last].copy()
        head = low - int(starts[first])
        share[0, 0] += head
        share[0, 1] += head
        share[0, 2] -= head
        share[-1, 2] -= int(ends[last - 1]) - high
        shares.append(share)
        low = high
    return shares


class Copier:
    """Copies between host memories with native memcpy (on the loop's thread
    when small and alone, else on native copy threads); a copy touching
    another kind of memory is that kind's ``copy_job``, run on a Python
    thread pool (or on the loop's thread, small and alone, where the kind
    allows it)."""

    def __init__(self, threads: int, dispatcher: CompletionDispatcher) -> None:
        self._threads = threads
        self._dispatcher = dispatcher
        self._pool = hixl_native.CopyPool(threads, dispatcher.queue)
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="hixl-copy")

    def copy_now(self, dst: Memory, src: Memory, triples: np.ndarray, total: int,
                 dst_shift: int = 0, src_shift: int = 0) -> bool:
        """``copy`` on this thread, when the daemon has nothing else to do and the
        copy is small enough to make here; False: nothing copied, ``copy`` it.

        Takes the ``triples_of`` some ranges, of ``total`` bytes, each offset
        shifted natively by ``dst_shift`` / ``src_shift``: a repeat copies
        between other batch slots with no new array per request, which is a
        large part of a small local pull's cost.
        """
        if dst.copy_rank or src.copy_rank:  # only memcpy is made here
            return False
        return self._copy_here(dst, src, triples, total, dst_shift, src_shift)

    def _copy_here(self, dst: Memory, src: Memory, triples: np.ndarray, total: int,
                   dst_shift: int = 0, src_shift: int = 0) -> bool:
        """Make a host copy on this thread when the daemon is idle and the copy is
        small (from 256 KiB helped by a copy thread); False: nothing copied."""
        # Ranges within one memory may overlap one another (copy_blocks inside
        # a cache), so one thread copies them, in order; apart, threads share.
        shareable = dst is not src
        if not (self._dispatcher.idle
                and total <= (LOOP_COPY_MAX_BYTES if shareable else INLINE_COPY_BYTES)):
            return False
        if shareable and total >= HELPED_COPY_BYTES:
            try:
                self._pool.copy_helped(dst.native, src.native, triples, dst_shift, src_shift)
            except hixl_native.NativeError as exc:  # the pool closed: nothing copied
                raise copy_error(exc.code) from None
        else:
            hixl_native.copy_ranges(dst.native, src.native, triples, 0, dst_shift, src_shift)
        return True

    async def copy(self, dst: Memory, src: Memory, ranges: Ranges) -> None:
        """Copy (src, dst, length) ranges from one memory into another."""
        triples = triples_of(ranges)
        way = src if src.copy_rank > dst.copy_rank else dst
        if way.copy_rank:
            await self._copy_by(way, dst, src, triples, ranges)
            return
        total = total_bytes(ranges)
        if self._copy_here(dst, src, triples, total):
            return
        shareable = dst is not src
        parts = self._threads if shareable and total > INLINE_COPY_BYTES else 1
        shares = split_triples(triples, parts) if parts > 1 else [triples]
        posted: list[asyncio.Future[int]] = []
        try:
            for share in shares:
                posted.append(self._post(dst, src, share, total))
        finally:  # every posted share ends, whatever happened here
            statuses = await self._finish(dst, src, posted)
        failed = [status for status in statuses if status != hixl_native.OK]
        if failed:
            raise copy_error(failed[0])

    async def _copy_by(self, way: Memory, dst: Memory, src: Memory, triples: np.ndarray,
                       ranges: Ranges) -> None:
        """A copy made ``way``'s kind's way (``Memory.copy_job``): on the loop's
        thread when the kind allows it and the copy is small and alone, else on
        the executor, both memories pinned until it ends."""
        job = way.copy_job(dst, src, triples)  # refusals come before anything runs
        if (way.copies_inline and self._dispatcher.idle
                and total_bytes(ranges) <= INLINE_COPY_BYTES):
            job()
            return
        done = asyncio.get_running_loop().run_in_executor(self._executor, job)
        dst.pin_until(done)
        src.pin_until(done)
        await asyncio.shield(done)

    def _post(self, dst: Memory, src: Memory, share: np.ndarray,
              total: int) -> asyncio.Future[int]:
        """Queue one share on the copy threads; the future gives its native status."""
        request_id = self._dispatcher.new_id()
        try:
            self._pool.submit(request_id, dst.native, src.native, share.ravel(), total)
        except hixl_native.NativeError as exc:  # the pool closed: nothing queued
            raise copy_error(exc.code) from None
        return self._dispatcher.expect_id(request_id)

    @staticmethod
    async def _finish(dst: Memory, src: Memory, posted: list[asyncio.Future[int]]) -> list[int]:
        """Wait for the posted shares, both memories pinned until they end; their statuses."""
        if not posted:
            return []
        if len(posted) == 1:
            done: asyncio.Future[Any] = posted[0]
        else:
            done = asyncio.gather(*posted)
        dst.pin_until(done)
        src.pin_until(done)
        result = await asyncio.shield(done)
        return [result] if len(posted) == 1 else list(result)

    def close(self) -> None:
        self._pool.close()
        self._executor.shutdown(wait=True)
