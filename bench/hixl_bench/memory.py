"""The daemons' memory beside their pools, sampled all through a run.

Issue 4 bounds what a daemon holds beyond its pools (under 100 MiB during
the sweep). The pools are shared memory, counted in ``RssShmem``; everything
else the process holds, its heap, libraries and interpreter, is ``RssAnon``
plus ``RssFile`` of ``/proc/PID/status``. A background task reads them
every ``SAMPLE_S`` while the daemons run (``FAST_SAMPLE_S`` where asked)
and keeps each daemon's peak.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping

# Often enough to see what a row leaves behind, rarely enough (one small
# /proc read per daemon) to stay out of the rows' timing.
SAMPLE_S = 0.1
# Where a request's memory comes and goes within milliseconds and the rows'
# latency is not at stake (100k-block pulls take about 0.1 s each).
FAST_SAMPLE_S = 0.002
_FIELDS = ("RssAnon:", "RssFile:")


def beside_pools_bytes(pid: int) -> int | None:
    """RssAnon + RssFile of ``pid`` in bytes; None if it cannot be read (gone, not Linux)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            fields = [line.split() for line in status if line.startswith(_FIELDS)]
    except OSError:
        return None
    if len(fields) != len(_FIELDS):
        return None
    return sum(int(field[1]) for field in fields) * 1024  # the file counts kB


class Sampler:
    """How often ``watch`` samples; a suite of long, allocation-heavy requests
    (the scale suite) may ask for ``FAST_SAMPLE_S`` while it runs."""

    def __init__(self) -> None:
        self.interval = SAMPLE_S

    @contextlib.contextmanager
    def fast(self) -> Iterator[None]:
        """Sample every ``FAST_SAMPLE_S`` inside the block."""
        self.interval = FAST_SAMPLE_S
        try:
            yield
        finally:
            self.interval = SAMPLE_S


@contextlib.asynccontextmanager
async def watch(pids: Mapping[str, int], peaks: dict[str, int]) -> AsyncIterator[Sampler]:
    """Sample ``pids`` (name -> pid) until the block ends, raising ``peaks[name]``
    to the largest figure seen (bytes); daemons that cannot be read are left out."""
    sampler = Sampler()

    def sample() -> None:
        for name, pid in pids.items():
            now = beside_pools_bytes(pid)
            if now is not None:
                peaks[name] = max(peaks.get(name, 0), now)

    async def keep_sampling() -> None:
        while True:
            sample()
            await asyncio.sleep(sampler.interval)

    task = asyncio.create_task(keep_sampling())
    try:
        yield sampler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sample()  # what the last rows left behind
