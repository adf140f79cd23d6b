"""The ``sec`` suite: the same pulls between two daemons in each security mode.

For each mode of ``--security`` a fresh pair of daemons authenticates its
peers that way (credentials made for the run: a token file, or a CA and two
certificates), and the suite reports the link set-up time (the median of
link and unlink rounds: the Hello, its challenge in token mode, the TLS
handshake in mtls, and every data stream's proof) beside a pull of one
small and one large block over TCP. Authentication happens only when a link
and its connections are made, so the pull rows should match across modes.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from hixl_bench.env import options
from hixl_bench.model import HIXL, KIB, MIB, Budget, Row, drive
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
from hixl_service.testing_credentials import (
    CertificateAuthority,
    mtls_settings,
    token_settings,
    write_token,
)

MODES = ("none", "token", "mtls")
BLOCKS = (4 * KIB, 1 * MIB)
LINK_ROUNDS = 10
_POOL = 64 * MIB


def _settings(mode: str, where: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    if mode == "token":
        token = write_token(where / "token")
        return token_settings(token), token_settings(token)
    if mode == "mtls":
        ca = CertificateAuthority(where / "ca")
        return (mtls_settings(ca.issue("bench-a", spiffe="spiffe://hixl-bench/a")),
                mtls_settings(ca.issue("bench-b", spiffe="spiffe://hixl-bench/b")))
    return {"mode": "none"}, {"mode": "none"}


async def _link_setup_ms(initiator: LLMDataDist, target: int, address: str) -> float:
    """Median wall time of one link_clusters (unlinked again after each)."""
    took = []
    for _ in range(LINK_ROUNDS):
        start = time.perf_counter()
        status, results = await initiator.link_clusters([LLMClusterInfo.for_peer(target, address)],
                                                        timeout=10000)
        took.append((time.perf_counter() - start) * 1000)
        if results[0] != 0:
            raise RuntimeError(f"link_clusters failed: {status} {results}")
        await initiator.unlink_clusters([LLMClusterInfo.for_peer(target, address)], timeout=10000)
    return statistics.median(took)


async def security_rows(modes: list[str], streams: int, budget: Budget,
                        progress: Progress) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="hixl-bench-sec-") as tmp:
        for mode in modes:
            where = Path(tmp) / mode
            where.mkdir()
            first, second = _settings(mode, where)
            common: dict[str, Any] = {"pool__max_bytes": 4 * _POOL,
                                      "transfer__streams_per_link": streams,
                                      "logging__level": "WARNING"}
            async with start_daemon(security=first, **common) as a, \
                    start_daemon(security=second, **common) as b:
                rows += await _mode_rows(mode, a.client_target, b.client_target, b.peer_address,
                                         budget, progress)
    return rows


async def _mode_rows(mode: str, a_target: str, b_target: str, b_peer: str, budget: Budget,
                     progress: Progress) -> list[Row]:
    initiator = LLMDataDist(LLMRole.DECODER, 1, daemon=a_target)
    target = LLMDataDist(LLMRole.PROMPT, 2, daemon=b_target)
    rows: list[Row] = []
    await initiator.init(options(_POOL, remote_access=True))
    await target.init(options(_POOL, remote_access=True))
    try:
        setup_ms = await _link_setup_ms(initiator, 2, b_peer)
        await initiator.link_clusters([LLMClusterInfo.for_peer(2, b_peer)], timeout=10000)
        for block in BLOCKS:
            desc = CacheDesc(1, [1, block], DataType.DT_UINT8)
            src = await target.cache_manager.allocate_cache(desc)
            dst = await initiator.cache_manager.allocate_cache(desc)
            key = CacheKeyByIdAndIndex(2, src.cache_id, 0)
            row = Row(HIXL, f"hixl {mode}", "sec", "pull", "tcp", block, 1, 1,
                      extra={"security": mode, "link_setup_ms": round(setup_ms, 3)})

            async def pull(_: int, key: CacheKeyByIdAndIndex = key, dst: Any = dst) -> None:
                await initiator.cache_manager.pull_cache(key, dst)

            try:
                row.fill(await drive(pull, 1, budget), block)
            except Exception as exc:  # reported, not raised: the other rows still run
                row.status = f"error: {type(exc).__name__}: {exc}"
            await initiator.cache_manager.deallocate_cache(dst)
            await target.cache_manager.deallocate_cache(src)
            rows.append(row)
            progress(row)
    finally:
        await initiator.finalize()
        await target.finalize()
    return rows
