"""Outbound links: opening a cluster's links to others, again, and closing them.

The far daemon's Hello says where the far cluster lives; the link's
``FarCaches`` and ``Transport`` follow from that, the transport through the
one factory (``transports.factory``). ``reopen`` handshakes a link again
when its far daemon restarted (the link monitor finds that out); an Unlink
the far daemon did not hear is retried until its lease would have ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from hixl_wire.compat import timeout
from hixl_wire.status import LLMException, LLMStatusCode

from .cluster import Cluster
from .far_caches import Daemon, DaemonCaches, PeerCaches
from .link_health import LinkState
from .links import FarCaches, OutboundLink
from .log_keys import keys
from .peer_api import PeerApi
from .stats import DaemonStats
from .transports.factory import LinkEnds, TransportKit, open_transport

logger = logging.getLogger(__name__)

# Between two attempts at one link (LLM-DataDist's link_retry_count).
LINK_RETRY_PAUSE_S = 0.2
# Between two tries of an Unlink the far daemon did not hear.
UNLINK_RETRY_PAUSE_S = 1.0


@dataclass(frozen=True)
class LinkerSettings:
    """The linking side of ``[links]``."""

    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 1.0
    down_after_s: float = 5.0


class OutboundLinks:
    """Opens and closes the links of this daemon's clusters."""

    def __init__(self, daemon_id: str, backend: str, daemon: Daemon, kit: TransportKit,
                 peer_factory: Callable[[str], PeerApi], connect_timeout_s: float,
                 stats: DaemonStats | None = None,
                 settings: LinkerSettings | None = None) -> None:
        self._daemon_id = daemon_id
        self._stats = stats if stats is not None else DaemonStats()
        self._backend = backend
        self._daemon = daemon
        self._kit = kit
        self._peer_factory = peer_factory
        self._connect_timeout_s = connect_timeout_s
        self.settings = settings if settings is not None else LinkerSettings()
        self._background: set[asyncio.Task[None]] = set()

    async def link(self, cluster: Cluster, remote_cluster_id: int, address: str,
                   timeout_s: float) -> OutboundLink:
        """Open a link from ``cluster`` to a cluster of the daemon at ``address``;
        a link there that is down is replaced."""
        if remote_cluster_id == cluster.cluster_id:
            raise LLMException("a cluster cannot link to itself",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        old = cluster.links.get(remote_cluster_id)
        if old is not None:
            if old.health.state is not LinkState.DOWN:
                raise LLMException(f"already linked to cluster {remote_cluster_id} (the link "
                                   f"is {old.health.state.value})",
                                   status_code=LLMStatusCode.LLM_ALREADY_LINK)
            logger.info("link %s is down (%s): link_clusters replaces it", old.link_id,
                        old.health.last_error)
            cluster.links.pop(remote_cluster_id, None)
            await self.close(old, notify=False)
        link = await self._link_with_retries(cluster, remote_cluster_id, address, timeout_s)
        if cluster.closed or remote_cluster_id in cluster.links:
            await self.close(link, notify=True)
            raise LLMException(f"already linked to cluster {remote_cluster_id}",
                               status_code=LLMStatusCode.LLM_ALREADY_LINK)
        cluster.links[remote_cluster_id] = link
        stats = self._stats
        link.health.on_change = lambda state: stats.link_state("outbound", state.value)
        logger.info("link %s: cluster %d linked to cluster %d at %s over %s", link.link_id,
                    cluster.cluster_id, remote_cluster_id, address, link.transport.name,
                    extra=keys(session=cluster.session_id, cluster=cluster.cluster_id,
                               link=(cluster.cluster_id, remote_cluster_id)))
        link.health.move_to(LinkState.UP)
        return link

    async def reopen(self, cluster: Cluster, old: OutboundLink, why: str) -> bool:
        """Handshake ``old`` again (its far daemon restarted, or forgot the link):
        a new link under the same id and health replaces it, with fresh
        ``FarCaches``, so that nothing resolved from the old far daemon is
        used again. Left down if the far daemon cannot be linked now; the
        monitor tries again at its next heartbeat."""
        health = old.health
        health.move_to(LinkState.CONNECTING, why)
        peer = self._peer_factory(old.remote_peer_address)
        try:
            async with timeout(self._connect_timeout_s * 2):
                new = await self._open_link(cluster, old.remote_cluster_id, peer,
                                            self._connect_timeout_s)
        except (LLMException, asyncio.TimeoutError) as exc:
            health.move_to(LinkState.DOWN, f"{why}; linking again failed: "
                           f"{exc or 'timed out'}")
            return False
        if cluster.closed or cluster.links.get(old.remote_cluster_id) is not old:
            await self.close(new, notify=True)  # unlinked or replaced meanwhile
            return True
        new.health = health
        cluster.links[old.remote_cluster_id] = new
        await old.transport.close()
        logger.info("link %s: linked again to daemon %s (was %s); caches it had resolved "
                    "are resolved afresh", new.link_id, new.remote_daemon_id,
                    old.remote_daemon_id)
        health.move_to(LinkState.UP)
        return True

    async def _link_with_retries(self, cluster: Cluster, remote_cluster_id: int, address: str,
                                 timeout_s: float) -> OutboundLink:
        """Link in up to ``link_attempts`` tries, all within the call's timeout and
        ``link_total_s``: a prefill instance that is still starting answers the
        first tries with LLM_LINK_FAILED (nothing listens, or its cluster is not
        initialized yet), and engines set a retry count for that."""
        settings = cluster.settings
        budget_s = min(timeout_s, settings.link_total_s) if settings.link_total_s else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        peer = self._peer_factory(address)
        attempt = 1
        while True:
            left_s = deadline - loop.time()
            try:
                async with timeout(left_s):
                    return await self._open_link(cluster, remote_cluster_id, peer, left_s)
            except asyncio.TimeoutError:
                raise LLMException(f"linking to {address} timed out after {budget_s:.3f} s "
                                   f"({attempt} of {settings.link_attempts} attempts)",
                                   status_code=LLMStatusCode.LLM_LINK_FAILED) from None
            except LLMException as exc:
                if (exc.status_code != LLMStatusCode.LLM_LINK_FAILED
                        or attempt == settings.link_attempts
                        or deadline - loop.time() <= LINK_RETRY_PAUSE_S):
                    raise
                logger.info("linking cluster %d to %d at %s failed (attempt %d of %d), "
                            "retrying: %s", cluster.cluster_id, remote_cluster_id, address,
                            attempt, settings.link_attempts, exc,
                            extra=keys(cluster=cluster.cluster_id,
                                       link=(cluster.cluster_id, remote_cluster_id),
                                       status=exc.status_code.name))
            attempt += 1
            await asyncio.sleep(LINK_RETRY_PAUSE_S)

    async def _open_link(self, cluster: Cluster, remote_cluster_id: int, peer: PeerApi,
                         timeout_s: float) -> OutboundLink:
        hello = await peer.hello(self._daemon_id, cluster.cluster_id, remote_cluster_id,
                                 self._connect_timeout_s, self._backend)
        same_daemon = hello.daemon_id == self._daemon_id  # the address is ours
        far: FarCaches = (DaemonCaches(self._daemon, remote_cluster_id, hello.token) if same_daemon
                          else PeerCaches(peer, hello.token))
        remote = self._daemon.clusters.get(remote_cluster_id) if same_daemon else None
        ends = LinkEnds(cluster.cluster_id, cluster.settings.device_id, remote_cluster_id,
                        remote.settings.device_id if remote is not None else None)
        try:
            transport = await open_transport(self._kit, ends, hello, peer, same_daemon, timeout_s)
        except BaseException:
            await far.tell_unlinked(self._connect_timeout_s)
            raise
        return OutboundLink(cluster.cluster_id, remote_cluster_id, peer.address,
                            hello.daemon_id, hello.token, transport, far,
                            lease_s=hello.lease_ms / 1000,
                            last_heard=asyncio.get_running_loop().time())

    async def unlink(self, cluster: Cluster, remote_cluster_id: int, force: bool) -> None:
        link = cluster.links.pop(remote_cluster_id, None)
        if link is None:
            raise LLMException(f"not linked to cluster {remote_cluster_id}",
                               status_code=LLMStatusCode.LLM_UNLINK_FAILED)
        if not await self.close(link, notify=not force):
            left_s = self._lease_left_s(link)
            then = (f"it is told again in the background until its lease of the link ends "
                    f"(within {left_s:.0f} s), when it drops the link anyway" if left_s > 0 else
                    "its lease of the link has run out, so it drops the link untold")
            raise LLMException(f"cluster {remote_cluster_id} could not be told of the unlink; "
                               f"{then}",
                               status_code=LLMStatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED)

    async def close(self, link: OutboundLink, notify: bool) -> bool:
        """Close the link here and, with ``notify``, tell the far daemon; an Unlink it
        did not hear is retried in the background while its lease lasts."""
        link.health.move_to(LinkState.CLOSED)
        await link.transport.close()
        if not notify:
            return True
        if await link.far.tell_unlinked(self._connect_timeout_s):
            return True
        if self._lease_left_s(link) > 0:
            self._in_background(self._retry_unlink(link))
        return False

    def _lease_left_s(self, link: OutboundLink) -> float:
        if not link.lease_s:
            return 0.0
        return max(0.0, link.last_heard + link.lease_s - asyncio.get_running_loop().time())

    async def _retry_unlink(self, link: OutboundLink) -> None:
        loop = asyncio.get_running_loop()
        ends = link.last_heard + link.lease_s
        while loop.time() < ends:
            await asyncio.sleep(min(UNLINK_RETRY_PAUSE_S, max(0.0, ends - loop.time())))
            if loop.time() >= ends:
                break
            if await link.far.tell_unlinked(min(self._connect_timeout_s, ends - loop.time())):
                logger.info("link %s: the far daemon was told of the unlink", link.link_id)
                return
        logger.info("link %s: the far daemon was never told of the unlink; its lease has "
                    "ended, so it dropped the link itself", link.link_id)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close_all(self) -> None:
        """Stop retrying Unlinks (the daemon stops)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

