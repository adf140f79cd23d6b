"""Transfers over many links while the prompt daemon restarts (issue 21, scale and soak).

A CI-sized run of ``hixl_bench.soak``: real daemons, SIGKILL and SIGTERM of
the prompt daemon, its clusters initialised and their caches registered
again on the new one. Every transfer must end, with a status a restart
explains; the links heal by themselves; and after a full garbage collection
in each process nothing is left behind (fds, threads, pool bytes, caches,
sessions, links). ``python -m hixl_bench.soak`` runs the full-sized soak.
"""

from __future__ import annotations

import pytest

soak = pytest.importorskip("hixl_bench.soak")

# About the daemons' links and processes: once, on uvloop (scripts/test.sh).
pytestmark = [pytest.mark.asyncio, pytest.mark.one_loop]


async def test_transfers_across_prompt_daemon_restarts_all_end_and_leave_nothing() -> None:
    config = soak.SoakConfig(links=8, transfers=600, concurrency=8, restarts=2, warmup=100,
                             signals=("SIGKILL", "SIGTERM"))
    result = await soak.run_soak(config)

    assert result.started == result.ended == 600, "a transfer was never counted as ended"
    assert set(result.statuses) <= soak.ALLOWED, dict(result.statuses)
    assert result.statuses[soak.SUCCESS] > 0
    assert [r.signal for r in result.restarts] == ["SIGKILL", "SIGTERM"]
    assert all(r.heal_s is not None for r in result.restarts), result.restarts
    # Healed means every link carries a transfer again, with no link_clusters.
    assert result.final_sweep == {soak.SUCCESS: 16}
    assert result.baseline is not None and result.after is not None
    for name in ("decode", "prompt", "tool"):
        before, after = result.baseline.procs[name], result.after.procs[name]
        assert after.fds <= before.fds + config.fd_slack, (name, before, after)
        assert after.threads <= before.threads + config.thread_slack, (name, before, after)
    for name in ("decode", "prompt"):
        before_pools, after_pools = result.baseline.admin[name], result.after.admin[name]
        assert (after_pools.reserved_bytes, after_pools.used_bytes, after_pools.caches,
                after_pools.sessions) == (before_pools.reserved_bytes, before_pools.used_bytes,
                                          before_pools.caches, before_pools.sessions), name
    assert result.after.admin["decode"].links == {"outbound up": 8}
    assert result.after.admin["prompt"].links == {"inbound up": 8}
    assert result.problems() == []
