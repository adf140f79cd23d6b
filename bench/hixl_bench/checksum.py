"""The ``crc`` suite (``--checksum``): the cost of the data plane's CRC-32C.

A pair of daemons, linked over TCP, runs each pull and push twice in a row,
once without and once with ``checksum=True`` (the transfer's bytes carry a
CRC-32C, computed by the sender before they go out and by the receiver as
they arrive: ``tcp_wire.h``). The checked row reports its GB/s and its p50
over the unchecked row's, measured next to it (``crc_gbps_ratio``,
``crc_p50_ratio``); with ``--repeat`` the table shows their medians. A
``crc32c`` row gives the CRC's own speed on one core, over the largest block.
"""

from __future__ import annotations

import time
from typing import Any

import hixl_native

from hixl_bench.env import options
from hixl_bench.model import CEILING, HIXL, KIB, MIB, Budget, Row, Timing, drive
from hixl_bench.report import Progress
from hixl_client import (
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LLMClusterInfo,
    LLMDataDist,
    LLMRole,
)
from hixl_service.testing import start_daemon

BLOCKS = (64 * KIB, 1 * MIB, 16 * MIB)
OPS = ("pull", "push")
_POOL = 128 * MIB


def rows_per_run() -> int:
    return 1 + 2 * len(OPS) * len(BLOCKS)


def _crc_row(budget: Budget) -> Row:
    block = BLOCKS[-1]
    data = bytearray(block)
    latencies: list[float] = []
    deadline = time.perf_counter() + budget.seconds / 4
    while len(latencies) < budget.min_requests or (
            time.perf_counter() < deadline and len(latencies) < budget.max_requests):
        started = time.perf_counter()
        hixl_native.crc32c(data)
        latencies.append(time.perf_counter() - started)
    row = Row(CEILING, "crc32c", "crc", "-", "-", block, 1, 1,
              extra={"hardware": hixl_native.crc32c_hardware()})
    return row.fill(Timing(latencies, sum(latencies)), block)


async def checksum_rows(streams: int, budget: Budget, progress: Progress) -> list[Row]:
    rows = [_crc_row(budget)]
    progress(rows[-1])
    common: dict[str, Any] = {"pool__max_bytes": 4 * _POOL, "pool__populate": True,
                              "transfer__streams_per_link": streams,
                              "logging__level": "WARNING"}
    async with start_daemon(**common) as a, start_daemon(**common) as b:
        initiator = LLMDataDist(LLMRole.DECODER, 1, daemon=a.client_target)
        target = LLMDataDist(LLMRole.PROMPT, 2, daemon=b.client_target)
        await initiator.init(options(_POOL, remote_access=True))
        await target.init(options(_POOL, remote_access=True))
        try:
            await initiator.link_clusters([LLMClusterInfo.for_peer(2, b.peer_address)],
                                          timeout=10000)
            for op in OPS:
                for block in BLOCKS:
                    rows += await _pair(initiator, target, op, block, budget, progress)
        finally:
            await initiator.finalize()
            await target.finalize()
    return rows


async def _pair(initiator: LLMDataDist, target: LLMDataDist, op: str, block: int,
                budget: Budget, progress: Progress) -> list[Row]:
    """The rows of one op and block: the CRC off, then on, measured back to back."""
    desc = CacheDesc(2, [1, block // 2], DataType.DT_UINT8)  # one layer: its K and V
    far = await target.cache_manager.allocate_cache(desc)
    near = await initiator.cache_manager.allocate_cache(desc)
    key = CacheKeyByIdAndIndex(2, far.cache_id, 0)
    rows: list[Row] = []
    try:
        for checked in (False, True):
            row = Row(HIXL, f"hixl crc {'on' if checked else 'off'}", "crc", op, "tcp", block,
                      1, 1, extra={"checksum": checked})

            async def move(_: int, checked: bool = checked) -> None:
                if op == "pull":
                    await initiator.cache_manager.pull_cache(key, near, checksum=checked)
                else:
                    await initiator.cache_manager.push_cache(key, near, checksum=checked)

            try:
                row.fill(await drive(move, 1, budget), block)
            except Exception as exc:  # reported, not raised: the other rows still run
                row.status = f"error: {type(exc).__name__}: {exc}"
            rows.append(row)
        off, on = rows
        if off.ok and on.ok and off.gbps and off.p50_us:
            on.extra["crc_gbps_ratio"] = round(on.gbps / off.gbps, 4) if on.gbps else None
            on.extra["crc_p50_ratio"] = round(on.p50_us / off.p50_us, 4) if on.p50_us else None
        for row in rows:
            progress(row)
    finally:
        await initiator.cache_manager.deallocate_cache(near)
        await target.cache_manager.deallocate_cache(far)
    return rows
