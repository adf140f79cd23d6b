"""Outbound links: opening a cluster's links to others and closing them.

The far daemon's Hello says where the far cluster lives; the link's
``FarCaches`` and ``Transport`` follow from that, the transport through the
one factory (``transports.factory``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hixl_client.status import LLMException, LLMStatusCode
from hixl_wire.compat import timeout

from .cluster import Cluster
from .far_caches import Daemon, DaemonCaches, PeerCaches
from .links import FarCaches, OutboundLink
from .log_keys import keys
from .peer_api import PeerApi
from .stats import DaemonStats
from .transports.factory import LinkEnds, TransportKit, open_transport

logger = logging.getLogger(__name__)

# Between two attempts at one link (LLM-DataDist's link_retry_count).
LINK_RETRY_PAUSE_S = 0.2


class OutboundLinks:
    """Opens and closes the links of this daemon's clusters."""

    def __init__(self, daemon_id: str, backend: str, daemon: Daemon, kit: TransportKit,
                 peer_factory: Callable[[str], PeerApi], connect_timeout_s: float,
                 stats: DaemonStats | None = None) -> None:
        self._daemon_id = daemon_id
        self._stats = stats if stats is not None else DaemonStats()
        self._backend = backend
        self._daemon = daemon
        self._kit = kit
        self._peer_factory = peer_factory
        self._connect_timeout_s = connect_timeout_s

    async def link(self, cluster: Cluster, remote_cluster_id: int, address: str,
                   timeout_s: float) -> OutboundLink:
        """Open a link from ``cluster`` to a cluster of the daemon at ``address``."""
        if remote_cluster_id == cluster.cluster_id:
            raise LLMException("a cluster cannot link to itself",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        if remote_cluster_id in cluster.links:
            raise LLMException(f"already linked to cluster {remote_cluster_id}",
                               status_code=LLMStatusCode.LLM_ALREADY_LINK)
        link = await self._link_with_retries(cluster, remote_cluster_id, address, timeout_s)
        if cluster.closed or remote_cluster_id in cluster.links:
            await self.close(link, notify=True)
            raise LLMException(f"already linked to cluster {remote_cluster_id}",
                               status_code=LLMStatusCode.LLM_ALREADY_LINK)
        cluster.links[remote_cluster_id] = link
        self._stats.link_state("outbound", "up")
        logger.info("cluster %d linked to cluster %d at %s over %s", cluster.cluster_id,
                    remote_cluster_id, address, link.transport.name,
                    extra=keys(session=cluster.session_id, cluster=cluster.cluster_id,
                               link=(cluster.cluster_id, remote_cluster_id)))
        return link

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
                            hello.daemon_id, hello.token, transport, far)

    async def unlink(self, cluster: Cluster, remote_cluster_id: int, force: bool) -> None:
        link = cluster.links.pop(remote_cluster_id, None)
        if link is None:
            raise LLMException(f"not linked to cluster {remote_cluster_id}",
                               status_code=LLMStatusCode.LLM_UNLINK_FAILED)
        if not await self.close(link, notify=not force):
            raise LLMException(f"cluster {remote_cluster_id} could not be told of the unlink; "
                               f"unlink on its side too",
                               status_code=LLMStatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED)

    async def close(self, link: OutboundLink, notify: bool) -> bool:
        self._stats.link_state("outbound", "closed")
        await link.transport.close()
        return await link.far.tell_unlinked(self._connect_timeout_s) if notify else True

