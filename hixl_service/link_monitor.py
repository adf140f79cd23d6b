"""The link monitor: heartbeats, leases and self-healing, one task per daemon.

Each round (every ``links.heartbeat_interval_s``, or a third of the
shortest lease a far daemon gave, whichever is shorter):

* **linking side**: one ``Peer.Heartbeat`` per far daemon names the tokens
  of every link to it, which renews their leases there. The answer moves
  each link's state (``link_health``): answered and every data stream
  connected, up; streams being reopened (the native link does that in the
  background) or a heartbeat missed, degraded; nothing heard for
  ``links.down_after_s``, down. An answer from another daemon id (the far
  daemon restarted) or one that no longer knows the token (its lease ran
  out meanwhile) makes the link handshake again by itself
  (``OutboundLinks.reopen``); a link the far cluster dropped itself stays
  down until ``link_clusters`` replaces it.
* **owner side**: ``InboundLinks.reap`` drops inbound links whose lease
  ran out (a linker killed or partitioned away).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hixl_wire.status import LLMException

from .link_health import LinkState
from .peer_api import HeartbeatAnswer, Lease

if TYPE_CHECKING:
    from .cluster import Cluster
    from .inbound import InboundLinks
    from .links import OutboundLink
    from .outbound import OutboundLinks
    from .peer_api import PeerApi

logger = logging.getLogger(__name__)

# The owner reaps at least this often, whatever the heartbeat interval.
MAX_REAP_PAUSE_S = 1.0
# Linking again to a restarted daemon whose cluster is not back yet: the
# first retry after this, the pause doubling up to the maximum.
FIRST_RETRY_PAUSE_S = 0.5
MAX_RETRY_PAUSE_S = 10.0


class LinkMonitor:
    """Keeps every link's state true, renews leases, reaps and heals."""

    def __init__(self, daemon_id: str, clusters: Mapping[int, Cluster],
                 outbound: OutboundLinks, inbound: InboundLinks) -> None:
        self._daemon_id = daemon_id
        self._clusters = clusters
        self._outbound = outbound
        self._inbound = inbound
        self._task: asyncio.Task[None] | None = None
        self._reopening: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._reopening) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    def _pause_s(self) -> float:
        pause = min(self._outbound.settings.heartbeat_interval_s, MAX_REAP_PAUSE_S,
                    self._inbound.leases.lease_s / 3)
        for cluster in self._clusters.values():
            for link in cluster.links.values():
                if link.lease_s:
                    pause = min(pause, link.lease_s / 3)
        return max(pause, 0.05)

    async def _run(self) -> None:
        heartbeat_due = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._inbound.reap()
                if loop.time() >= heartbeat_due:
                    heartbeat_due = loop.time() + min(
                        self._outbound.settings.heartbeat_interval_s, self._shortest_lease_s())
                    await self.beat()
            except Exception:  # a bug here must not end liveness for good
                logger.exception("link monitor round failed")
            await asyncio.sleep(self._pause_s())

    def _shortest_lease_s(self) -> float:
        leases = [link.lease_s / 3 for cluster in self._clusters.values()
                  for link in cluster.links.values() if link.lease_s]
        return min(leases, default=self._outbound.settings.heartbeat_interval_s)

    async def beat(self) -> None:
        """One heartbeat round over every outbound link."""
        by_peer: dict[int, tuple[PeerApi, list[tuple[Cluster, OutboundLink]]]] = {}
        for cluster in list(self._clusters.values()):
            if cluster.closed:
                continue
            for link in list(cluster.links.values()):
                peer = link.far.peer
                if peer is None:
                    self._judge_local(link)
                elif not link.dropped and link.health.state is not LinkState.CONNECTING:
                    by_peer.setdefault(id(peer), (peer, []))[1].append((cluster, link))
        await asyncio.gather(*(self._beat_peer(peer, links)
                               for peer, links in by_peer.values()))

    @staticmethod
    def _judge_local(link: OutboundLink) -> None:
        if link.far.reachable():
            link.health.move_to(LinkState.UP)
        else:
            link.health.move_to(LinkState.DOWN, f"cluster {link.remote_cluster_id} of this "
                                f"daemon is gone (finalized)")

    async def _beat_peer(self, peer: PeerApi,
                         links: list[tuple[Cluster, OutboundLink]]) -> None:
        settings = self._outbound.settings
        loop = asyncio.get_running_loop()
        try:
            answer = await asyncio.wait_for(
                peer.heartbeat(self._daemon_id, [link.token for _, link in links],
                               settings.heartbeat_timeout_s),
                settings.heartbeat_timeout_s)
        except (LLMException, asyncio.TimeoutError) as exc:
            cause = f"heartbeat to {peer.address} failed: {exc or 'timed out'}"
            for _, link in links:
                silent_s = loop.time() - link.last_heard
                if link.far_stopping:
                    continue  # down since it said so; back once it answers again
                if silent_s >= settings.down_after_s:
                    link.health.move_to(LinkState.DOWN, f"{cause} (nothing heard for "
                                        f"{silent_s:.1f} s)")
                else:
                    link.health.move_to(LinkState.DEGRADED, cause)
            return
        for (cluster, link), lease in zip(links, answer.leases, strict=True):
            self._judge(cluster, link, lease, answer, loop.time())

    def _judge(self, cluster: Cluster, link: OutboundLink, lease: Lease,
               answer: HeartbeatAnswer, now: float) -> None:
        if answer.daemon_id != link.remote_daemon_id:
            self._reopen(cluster, link, f"daemon at {link.remote_peer_address} restarted "
                         f"(id {link.remote_daemon_id} is now {answer.daemon_id})")
            return
        if lease is Lease.DROPPED:
            link.dropped = True
            link.health.move_to(LinkState.DOWN, f"cluster {link.remote_cluster_id} dropped "
                                f"the link itself; link_clusters links again")
            return
        if lease is Lease.STOPPING:
            link.far_stopping = True
            link.health.move_to(LinkState.DOWN, f"daemon {answer.daemon_id} at "
                                f"{link.remote_peer_address} is stopping (drained); the link "
                                f"comes back by itself when that daemon is started again")
            return
        if lease is Lease.UNKNOWN:
            self._reopen(cluster, link, f"daemon {answer.daemon_id} no longer holds the link "
                         f"(its lease ended)")
            return
        link.last_heard = now
        if answer.lease_ms:
            link.lease_s = answer.lease_ms / 1000
        info = link.info()
        up = info.connected
        if link.alive and up >= info.streams:
            link.health.move_to(LinkState.UP)
        else:
            link.health.move_to(LinkState.DEGRADED, f"{up} of {info.streams} data streams "
                                f"connected; the others are reopened in the background")

    def _reopen(self, cluster: Cluster, link: OutboundLink, why: str) -> None:
        now = asyncio.get_running_loop().time()
        if link.health.state is LinkState.CONNECTING or now < link.retry_at:
            return
        link.health.move_to(LinkState.CONNECTING, why)  # not heartbeaten meanwhile
        task = asyncio.ensure_future(self._reopen_link(cluster, link, why))
        self._reopening.add(task)
        task.add_done_callback(self._reopening.discard)

    async def _reopen_link(self, cluster: Cluster, link: OutboundLink, why: str) -> None:
        if await self._outbound.reopen(cluster, link, why):
            return
        link.retry_pause_s = min(MAX_RETRY_PAUSE_S,
                                 max(FIRST_RETRY_PAUSE_S, link.retry_pause_s * 2))
        link.retry_at = asyncio.get_running_loop().time() + link.retry_pause_s
