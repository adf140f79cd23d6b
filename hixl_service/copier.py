"""Copies inside the daemon: native memcpy between host memories, ACL copies
(the Ascend backend) when device memory is involved.

A small host copy runs on the event loop's own thread; a larger one is cut
into equal shares that the copy threads (and, up to a size, the loop's
thread) copy at once, since memory bandwidth grows with cores here.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import hixl_native
import numpy as np

from .planning import Ranges
from .pools import Memory

if TYPE_CHECKING:
    from .ascend.backend import AscendBackend


# A host copy up to this size runs on the event loop's own thread: the hop to
# a copy thread and back costs more here (100-300 us with wakeups) than
# copying 1 MiB, and the loop is held no longer than an inline TCP wait.
INLINE_COPY_BYTES = 1 << 20
# A larger copy is shared among threads: memory bandwidth grows with cores
# (8 MiB of 64 KiB blocks moves 1.7x faster on two). Up to this size the
# loop's thread copies one of the shares itself, which spares a wakeup.
LOOP_SHARE_MAX_BYTES = 4 << 20
_SHARE_ALIGN = 4096


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


class ExecutorCopier:
    """Copies between host memories with native memcpy (on the loop's thread
    when small, shared among a bounded, named thread pool when large), and
    ACL copies (the Ascend backend) when device memory is involved."""

    def __init__(self, threads: int, ascend: AscendBackend | None = None) -> None:
        self._threads = threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="hixl-copy")
        self._ascend = ascend

    async def copy(self, dst: Memory, src: Memory, ranges: Ranges) -> None:
        """Copy (src, dst, length) ranges from one memory into another."""
        # The native calls take (dst, src, length) triples.
        triples = np.ascontiguousarray(ranges[:, [1, 0, 2]])
        loop = asyncio.get_running_loop()
        if dst.on_device or src.on_device:
            assert self._ascend is not None, "device memory exists only with the Ascend backend"
            await self._run(dst, src, [loop.run_in_executor(
                self._executor, self._ascend.copy_job(dst, src, triples.ravel()))])
            return
        total = int(triples[:, 2].sum())
        if total <= INLINE_COPY_BYTES:
            hixl_native.copy_ranges(dst.native, src.native, triples.ravel())
            return
        # With its own share the loop's thread stands in for one copy thread.
        loop_share = total <= LOOP_SHARE_MAX_BYTES
        shares = split_triples(triples, max(self._threads, 2 if loop_share else 1))
        own = shares.pop() if loop_share else None
        jobs = [loop.run_in_executor(self._executor, hixl_native.copy_ranges, dst.native,
                                     src.native, share.ravel(), total) for share in shares]
        try:
            if own is not None:
                hixl_native.copy_ranges(dst.native, src.native, own.ravel(), total)
        finally:
            await self._run(dst, src, jobs)

    @staticmethod
    async def _run(dst: Memory, src: Memory, jobs: list[asyncio.Future[None]]) -> None:
        if not jobs:
            return
        done = jobs[0] if len(jobs) == 1 else asyncio.gather(*jobs)
        dst.pin_until(done)
        src.pin_until(done)
        await asyncio.shield(done)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
