"""What a link costs in threads, fds and memory on both daemons (issue 21, scale).

A CI-sized run of ``hixl_bench.links``: 48 links between two daemons on
loopback, every one up on both sides (Admin), a pull over a sample, and
everything unlinked twice. The cost is measured, not assumed, and held to
what docs/architecture.md ("Data plane") says a link costs: no thread of
its own on either side (the streams of all links share
``transfer.data_threads`` workers), and per stream a socket on each side,
plus a stop eventfd on the linking side.
``python -m hixl_bench.links --links 1000`` runs the full-sized one.
"""

from __future__ import annotations

import pytest

links = pytest.importorskip("hixl_bench.links")

# About the daemons' links and processes: once, on uvloop (scripts/test.sh).
pytestmark = [pytest.mark.asyncio, pytest.mark.one_loop]

LINKS = 48
STREAMS = 4
DATA_THREADS = 16  # transfer.data_threads' default, on each side, whatever the links
# Started once, not per link: the linking side's watcher thread; the event
# loop's default executor (at most 32 threads, started on first use); a
# channel and lanes to the far daemon.
ONCE_THREADS = 1 + 32
ONCE_FDS = 32
# A socket per stream on each side; the linking side adds the link's stop eventfd.
FDS_PER_LINK = {"decode": STREAMS + 1, "prompt": STREAMS}
RSS_PER_LINK_BYTES = 128 << 10


async def test_links_cost_what_the_data_plane_says_and_unlinking_returns_it() -> None:
    result = await links.run_link_scale(LINKS, streams=STREAMS, sample=8, cycles=2)

    assert result.up_s is not None, "not every link came up"
    for side, direction in (("decode", "outbound"), ("prompt", "inbound")):
        assert result.admin["linked"][side].links == {f"{direction} up": LINKS}
        assert result.admin["unlinked 2"][side].links == {}
    assert result.sampled == 8 and result.sample_failures == []
    for side in ("decode", "prompt"):
        # A bound that does not grow with LINKS: threads are not per link.
        assert result.delta(side, "threads") <= DATA_THREADS + ONCE_THREADS, side
        assert result.delta(side, "fds") <= FDS_PER_LINK[side] * LINKS + ONCE_FDS, side
        # Each stream is a connection on both sides: at least that many fds.
        assert result.delta(side, "fds") >= STREAMS * LINKS, side
        assert result.delta(side, "rss_bytes") <= RSS_PER_LINK_BYTES * LINKS, side
    # The first unlink leaves what a daemon keeps once it used it (threads,
    # its channel to the far daemon, the sampled links' remembered repeats);
    # the second leaves nothing more.
    for side in ("decode", "prompt", "tool"):
        for what in ("threads", "fds"):
            assert result.delta(side, what, "unlinked 2") <= result.delta(side, what, "unlinked")
    assert result.problems() == []
