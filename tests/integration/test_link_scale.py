"""What a link costs in threads, fds and memory on both daemons (issue 21, scale).

A CI-sized run of ``hixl_bench.links``: 48 links between two daemons on
loopback, every one up on both sides (Admin), a pull over a sample, and
everything unlinked twice. The per-link cost is measured, not assumed:
the bounds below are what the data plane may cost today (a thread, a
socket and a wake-up eventfd per stream on the linking side, a serving
thread and a socket per stream on the linked side); a data plane whose
streams share a bounded pool of threads tightens ``THREADS_PER_LINK``.
``python -m hixl_bench.links --links 1000`` runs the full-sized one.
"""

from __future__ import annotations

import pytest

links = pytest.importorskip("hixl_bench.links")

pytestmark = pytest.mark.asyncio

LINKS = 48
STREAMS = 4
THREADS_PER_LINK = STREAMS
# A socket and a wake-up eventfd per stream, and the link's stop eventfd.
FDS_PER_LINK = 2 * STREAMS + 1
# Not per link: the event loop's default executor starts its threads (at
# most 32) on first use, and a daemon opens a channel and lanes once per
# far daemon.
ONCE = 32
RSS_PER_LINK_BYTES = 256 << 10


async def test_links_cost_what_the_data_plane_says_and_unlinking_returns_it() -> None:
    result = await links.run_link_scale(LINKS, streams=STREAMS, sample=8, cycles=2)

    assert result.up_s is not None, "not every link came up"
    for side, direction in (("decode", "outbound"), ("prompt", "inbound")):
        assert result.admin["linked"][side].links == {f"{direction} up": LINKS}
        assert result.admin["unlinked 2"][side].links == {}
    assert result.sampled == 8 and result.sample_failures == []
    for side in ("decode", "prompt"):
        assert result.delta(side, "threads") <= THREADS_PER_LINK * LINKS + ONCE, side
        assert result.delta(side, "fds") <= FDS_PER_LINK * LINKS + ONCE, side
        assert result.delta(side, "rss_bytes") <= RSS_PER_LINK_BYTES * LINKS, side
        # Each stream is a connection on both sides: at least that many fds.
        assert result.delta(side, "fds") >= STREAMS * LINKS, side
    # The first unlink leaves what a daemon keeps per far daemon; the second
    # leaves nothing more.
    for side in ("decode", "prompt", "tool"):
        for what in ("threads", "fds"):
            assert result.delta(side, what, "unlinked 2") <= result.delta(side, what, "unlinked")
    assert result.problems() == []
