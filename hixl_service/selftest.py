"""The doctor's self-test: a short read over each outbound link, timed.

It reads from a far cache the link already knows (a resolve the link
remembers, or a cache of the far cluster when it lives in this daemon) into
scratch memory of the daemon's own, never into a client's cache, so it
changes no byte a client sees and the far end serves it as it serves any
read of that link. It goes through the link's transport, so what it
measures is the path the link's transfers take. Links that know no far
cache yet, or whose memory is on a device, are reported as skipped, with
why.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

import hixl_native

from hixl_wire.status import LLMException
from hixl_wire.types import Placement

from .engine import Engine
from .links import OutboundLink
from .memory.host import HostMemory
from .planning import as_ranges
from .transports.base import REACHES_HOST_MEMORY

DEFAULT_BYTES = 4 << 20
MAX_BYTES = 64 << 20
TIMEOUT_MS = 10_000
_PAGE_SHIFT = 12


@dataclass(frozen=True)
class LinkTest:
    """One link's self-test: what moved in how long, or why nothing did."""

    local_cluster_id: int
    remote_cluster_id: int
    transport: str
    bytes: int = 0
    seconds: float = 0.0
    skipped: str = ""
    error: str = ""


def _ranges(tensor_offsets: list[int], tensor_size: int, nbytes: int) -> list[tuple[int, int,
                                                                                     int]]:
    """(far offset, scratch offset, length) covering up to ``nbytes`` of the tensors."""
    ranges, done = [], 0
    for offset in tensor_offsets:
        length = min(tensor_size, nbytes - done)
        if length <= 0:
            break
        ranges.append((offset, done, length))
        done += length
    return ranges


async def _test_link(link: OutboundLink, nbytes: int) -> LinkTest:
    info = link.transport.info()
    result = LinkTest(link.local_cluster_id, link.remote_cluster_id, info.name)
    if REACHES_HOST_MEMORY not in info.capabilities:  # the scratch is host memory
        return replace(result, skipped="device memory: not self-tested")
    far = link.far.known()
    if far is None:
        return replace(result, skipped="no cache of the far cluster is known to the link yet "
                                      "(it is learnt by the first transfer by cache id)")
    ranges = _ranges(list(far.layout.tensor_offsets), far.layout.tensor_size, nbytes)
    total = sum(length for _, _, length in ranges)
    size = max(1, -(-total >> _PAGE_SHIFT)) << _PAGE_SHIFT
    scratch_pool = await asyncio.to_thread(hixl_native.SharedPool, "hixl-selftest", size,
                                           _PAGE_SHIFT, True)
    scratch = HostMemory(0, Placement.HOST, scratch_pool)
    try:
        started = time.perf_counter()
        await link.transport.read(scratch, far.place, as_ranges(ranges), TIMEOUT_MS)
        seconds = time.perf_counter() - started
    except LLMException as exc:
        return replace(result, error=str(exc))
    finally:
        await scratch.wait_unpinned()
        await asyncio.to_thread(scratch.release)
    return replace(result, bytes=total, seconds=seconds)


async def self_test(engine: Engine, nbytes: int) -> list[LinkTest]:
    """Test every outbound link of the daemon, one after another (so that the
    figures do not share the network or the memory bus)."""
    nbytes = min(nbytes or DEFAULT_BYTES, MAX_BYTES)
    results = []
    for cluster in list(engine.clusters.values()):
        for link in list(cluster.links.values()):
            results.append(await _test_link(link, nbytes))
    return results
