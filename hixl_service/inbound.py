"""Inbound links: the peer side of links other daemons (or this one) opened.

A Hello authorizes a token for one of this daemon's clusters at the data
server; the peer calls of a transfer (resolving caches and addresses,
releasing keys, and the calls a link's transport makes: ``transport_call``)
name their link by that token.

Each link from another daemon is held on a lease (``links.lease_s``): the
linking daemon's heartbeats renew it, and ``reap`` drops a link whose lease
ran out (a linker killed or partitioned away), as an Unlink would.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
from collections.abc import Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import hixl_native

from hixl_wire.status import LLMException, LLMStatusCode

from .caches import Caches, peer_writable
from .cluster import Cluster
from .link_health import LinkState
from .links import InboundLink
from .log_keys import keys
from .notifies import Notification, check_notification
from .peer_api import (
    PROTOCOL_VERSION,
    CacheRefSpec,
    Lease,
    PeerHello,
    ResolvedCache,
)
from .regions import Regions
from .registry import KeySpec
from .rpc_errors import CallRefused
from .stats import DaemonStats
from .transports.base import PeerScope, PlainInbound
from .transports.factory import PEER_HANDLERS, TransportKit, check_peer_calls, inbound_side
from .trust import HelloFacts, Trust

logger = logging.getLogger(__name__)

# Tokens of links this daemon's clusters dropped themselves, remembered so
# that the linking daemon's next heartbeat learns it was deliberate (and
# does not link again by itself); the oldest are forgotten first.
DROPPED_REMEMBERED = 4096


@dataclass
class PeerLaneInfo:
    """The peer lane as the admin status shows it."""

    port: int = 0  # set once it listens; 0: no peer lane
    calls: int = 0  # calls it accepted


@dataclass
class DaemonFacts:
    """What a Hello reply tells the linking daemon about this one."""

    daemon_id: str
    version: str
    data_host: str
    backend: str
    peer_lane: PeerLaneInfo = field(default_factory=PeerLaneInfo)


@dataclass(frozen=True)
class LeaseSettings:
    """The owner's side of ``[links]``."""

    lease_s: float = 10.0
    down_after_s: float = 5.0
    # A renewal later than this is late (degraded): the linker renews at
    # least thrice a lease.
    late_after_s: float = 4.5


class InboundLinks:
    """Every inbound link of the daemon, by token."""

    def __init__(self, daemon: DaemonFacts, clusters: Mapping[int, Cluster],
                 data_server: hixl_native.DataServer, regions: Regions, caches: Caches,
                 kit: TransportKit, trust: Trust, stats: DaemonStats | None = None,
                 leases: LeaseSettings | None = None) -> None:
        self._daemon = daemon
        self._stats = stats if stats is not None else DaemonStats()
        self._trust = trust
        self._clusters = clusters
        self._data_server = data_server
        self._regions = regions
        self._caches = caches
        self._kit = kit
        self._links: dict[int, InboundLink] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.leases = leases if leases is not None else LeaseSettings()
        self._dropped: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._last_reap = 0.0  # loop.time() of the last reap round
        # Set by the drain: heartbeats are answered LEASE_STOPPING from then on.
        self.stopping = False

    def all(self) -> list[InboundLink]:
        return list(self._links.values())

    def to_cluster(self, cluster_id: int) -> list[InboundLink]:
        return [link for link in self._links.values() if link.dst_cluster_id == cluster_id]

    def accept_link(self, protocol_version: int, src_daemon_id: str, src_cluster_id: int,
                    dst_cluster_id: int, backend: str = "host", identity: str = "",
                    facts: HelloFacts | None = None, proof: bytes = b"",
                    listener_of: int | None = None,
                    peer_calls: Collection[str] = ()) -> PeerHello:
        """Peer side of a link: check who links, then authorize a token and a key for
        one of our clusters at the data server.

        ``identity`` is the caller's (``Trust.identity_of``); in token mode
        ``facts`` and ``proof`` are the Hello's answer to its challenge.
        ``listener_of``: the Hello came to that cluster's own listener
        (``cluster_listeners``), so it must name that cluster; checked after
        the proof and allowed_peers, so a caller that may not link learns
        nothing more there than on the daemon's port. ``peer_calls``: the
        Peer calls the caller serves (``factory.check_peer_calls``: those the
        links' transport needs)."""
        trust = self._trust
        if trust.mode == "token":
            if facts is None:
                raise CallRefused("this daemon requires token authentication (security.mode = "
                                  "\"token\")", LLMStatusCode.LLM_LINK_FAILED,
                                  grpc.StatusCode.UNAUTHENTICATED, reason="token_required")
            trust.check_hello(facts, proof)
        if protocol_version != PROTOCOL_VERSION:
            raise LLMException(f"peer protocol {protocol_version} is not {PROTOCOL_VERSION}",
                               status_code=LLMStatusCode.LLM_LINK_FAILED)
        if backend != self._daemon.backend:
            mine = self._daemon
            raise LLMException(f"daemon {src_daemon_id} runs the {backend!r} backend and daemon "
                               f"{mine.daemon_id} the {mine.backend!r} one; link daemons "
                               f"of one backend", status_code=LLMStatusCode.LLM_LINK_FAILED)
        check_peer_calls(self._kit, src_daemon_id, peer_calls)
        may_write = trust.permission(identity, dst_cluster_id)
        if listener_of is not None and dst_cluster_id != listener_of:
            raise LLMException(f"this address is the listen_ip_info of cluster {listener_of}, "
                               f"not of cluster {dst_cluster_id}: link with that cluster's "
                               f"id, or to its own address",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        cluster = self._clusters.get(dst_cluster_id)
        if cluster is None:
            raise LLMException(f"cluster {dst_cluster_id} is not initialized on daemon "
                               f"{self._daemon.daemon_id}",
                               status_code=LLMStatusCode.LLM_LINK_FAILED)
        self._check_limits(identity)
        token = secrets.randbits(64) or 1
        while token in self._links:
            token = secrets.randbits(64) or 1
        grant = trust.grant(facts, token, may_write)
        same_daemon = src_daemon_id == self._daemon.daemon_id
        side = inbound_side(self._kit, same_daemon, cluster.settings.device_id, dst_cluster_id)
        lease_s = 0.0 if same_daemon else self.leases.lease_s
        inbound = InboundLink(token, src_daemon_id, src_cluster_id, dst_cluster_id, side,
                              identity, grant.may_write, lease_s,
                              asyncio.get_running_loop().time())
        self._links[token] = inbound
        self._data_server.authorize(token, dst_cluster_id, grant.key, grant.may_write)
        stats = self._stats
        inbound.health.on_change = lambda state: stats.link_state("inbound", state.value)
        logger.info("link %s: cluster %d of daemon %s (%s) linked to cluster %d%s",
                    inbound.link_id, src_cluster_id, src_daemon_id, identity or "?",
                    dst_cluster_id, "" if grant.may_write else ", read only",
                    extra=keys(cluster=dst_cluster_id, link=(src_cluster_id, dst_cluster_id)))
        inbound.health.move_to(LinkState.UP)
        return PeerHello(self._daemon.daemon_id, self._daemon.version, self._daemon.data_host,
                         self._data_server.port, token, self._daemon.backend,
                         self._daemon.peer_lane.port, link_key=grant.reply_key,
                         server_proof=grant.server_proof, lease_ms=int(lease_s * 1000))

    def _check_limits(self, identity: str) -> None:
        limits = self._trust.limits
        if len(self._links) >= limits.max_inbound_links:
            raise CallRefused(f"this daemon holds limits.max_inbound_links = "
                              f"{limits.max_inbound_links} inbound links; unlink some first",
                              LLMStatusCode.LLM_LINK_FAILED, grpc.StatusCode.RESOURCE_EXHAUSTED,
                              reason="max_inbound_links")
        held = sum(1 for link in self._links.values() if link.identity == identity)
        if held >= limits.max_links_per_peer:
            raise CallRefused(f"peer {identity!r} holds limits.max_links_per_peer = "
                              f"{limits.max_links_per_peer} inbound links of this daemon; "
                              f"unlink some first", LLMStatusCode.LLM_LINK_FAILED,
                              grpc.StatusCode.RESOURCE_EXHAUSTED, reason="max_links_per_peer")

    def drop_inbound_link(self, token: int) -> None:
        """The linking daemon's Unlink."""
        if token not in self._links:
            raise LLMException("unknown link", status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        self.drop_inbound(token, "unlinked by the linking cluster")

    def has_inbound(self, token: int) -> bool:
        return token in self._links

    def dst_cluster_of(self, token: int) -> int | None:
        """The cluster an inbound link reaches; None for an unknown token."""
        inbound = self._links.get(token)
        return inbound.dst_cluster_id if inbound is not None else None

    # -- leases -------------------------------------------------------------

    def renew(self, daemon_id: str, tokens: Sequence[int]) -> list[Lease]:
        """A heartbeat of daemon ``daemon_id``: renew the lease of each of its links
        named in ``tokens``; what became of each."""
        if len(tokens) > self._trust.limits.max_inbound_links:
            raise LLMException(f"a heartbeat names {len(tokens)} links; this daemon holds at "
                               f"most {self._trust.limits.max_inbound_links}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        now = asyncio.get_running_loop().time()
        answers = []
        for token in tokens:
            inbound = self._links.get(token)
            if inbound is not None and inbound.src_daemon_id != daemon_id:
                inbound = None  # another daemon's link: not this caller's to keep
            if inbound is None:
                answers.append(Lease.DROPPED if token in self._dropped else Lease.UNKNOWN)
                continue
            inbound.renewed_at = now
            if self.stopping:
                inbound.told_stopping = True
                answers.append(Lease.STOPPING)
                continue
            inbound.health.move_to(LinkState.UP)
            answers.append(Lease.RENEWED)
        return answers

    def untold_of_stop(self) -> int:
        """Inbound links with a lease whose linker has not heard yet that this daemon
        drains (the drain waits for them, ``wait_told_of_stop``)."""
        return sum(1 for inbound in self._links.values()
                   if inbound.lease_s and not inbound.told_stopping)

    async def wait_told_of_stop(self, bound_s: float) -> bool:
        """Wait, at most ``bound_s``, until every linker's heartbeat was answered
        ``LEASE_STOPPING``; whether they all were. Linkers renew at least thrice a
        lease, so a third of the lease (plus their call) bounds the wait."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound_s
        while self.untold_of_stop():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def lease_left_s(self, inbound: InboundLink) -> float:
        """Seconds until ``inbound``'s lease ends unrenewed (0: no lease)."""
        if not inbound.lease_s:
            return 0.0
        age = asyncio.get_running_loop().time() - inbound.renewed_at
        return max(0.0, inbound.lease_s - age)

    def reap(self) -> None:
        """Drop every link whose lease ran out; show late ones as degraded or down."""
        now = asyncio.get_running_loop().time()
        settings = self.leases
        previous, self._last_reap = self._last_reap, now
        stalled_s = now - previous
        if previous and stalled_s > settings.late_after_s:
            # This daemon itself did not run (SIGSTOP, a hung host): its peers'
            # renewals could not be heard, so every lease starts again.
            logger.info("this daemon did not run for %.1f s; the leases of its inbound links "
                        "start again", stalled_s)
            for inbound in self._links.values():
                inbound.renewed_at = now
        for inbound in list(self._links.values()):
            if not inbound.lease_s:
                continue
            age = now - inbound.renewed_at
            silent = (f"no heartbeat from daemon {inbound.src_daemon_id} for {age:.1f} s")
            if age >= inbound.lease_s:
                self.drop_inbound(inbound.token, f"lease ended: {silent}")
            elif age >= settings.down_after_s:
                inbound.health.move_to(LinkState.DOWN, silent)
            elif age >= settings.late_after_s:
                inbound.health.move_to(LinkState.DEGRADED, silent)

    def drop_from(self, cluster_id: int, src_cluster_id: int) -> bool:
        """The owner's own unlink: drop the inbound links of ``src_cluster_id`` to
        ``cluster_id``; False when there is none. The linking daemon's next
        heartbeat learns that the link was dropped on purpose."""
        tokens = [link.token for link in self._links.values()
                  if link.dst_cluster_id == cluster_id and link.src_cluster_id == src_cluster_id]
        for token in tokens:
            self._dropped[token] = None
            while len(self._dropped) > DROPPED_REMEMBERED:
                self._dropped.popitem(last=False)
            self.drop_inbound(token, f"dropped by cluster {cluster_id} itself")
        return bool(tokens)

    def drop_inbound(self, token: int, why: str = "") -> None:
        """Revoke an inbound link's token and close what its transport kept here."""
        inbound = self._links.pop(token, None)
        self._data_server.revoke(token)
        if inbound is not None:
            if why.startswith("lease ended"):
                logger.warning("link %s: %s; dropped (token revoked)", inbound.link_id, why)
            inbound.health.move_to(LinkState.CLOSED, why)
        if inbound is not None and not isinstance(inbound.side, PlainInbound):
            # Waits for a running batch (bounded by its deadline): in the background.
            self._in_background(inbound.side.close())

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _cluster_of(self, token: int) -> Cluster:
        inbound = self._links.get(token)
        cluster = self._clusters.get(inbound.dst_cluster_id) if inbound is not None else None
        if cluster is None:
            raise LLMException("this daemon holds no such link (unlinked, dropped, or its "
                               "lease ended); the linking daemon links again by itself "
                               "unless this side dropped it",
                               status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        return cluster

    def resolve_for_peer(self, token: int, ref: CacheRefSpec) -> ResolvedCache:
        """Peer side of a pull: describe the cache a linked cluster asks for."""
        cluster = self._cluster_of(token)
        if ref.cluster_id != cluster.cluster_id:
            raise LLMException(f"the link reaches cluster {cluster.cluster_id}, "
                               f"not {ref.cluster_id}",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        entry, batch_index = cluster.lookup(ref)
        return ResolvedCache(entry.cache_id, entry.region_id,
                             tuple(o - entry.extent_offset for o in entry.tensor_offsets),
                             entry.tensor_size, entry.batch_size, batch_index, entry.blocks,
                             entry.writable)

    async def release_for_peer(self, token: int, key: KeySpec,
                               tensor_indices: list[int]) -> None:
        """Peer side of a completed pull by key: account it, maybe free the cache."""
        cluster = self._cluster_of(token)
        await self._caches.free(cluster.registry.record_pull(key, tensor_indices))

    def notify_for_peer(self, token: int, name: str, message: bytes) -> None:
        """Peer side of SendNotify: queue it for the linked cluster's client, as
        sent by the link's own source cluster."""
        cluster = self._cluster_of(token)
        check_notification(name, message)
        inbound = self._links[token]
        cluster.inbox.put(Notification(inbound.src_cluster_id, name, message))

    def resolve_addresses_for_peer(self, token: int, addresses: list[int],
                                   length: int) -> list[tuple[int, int, bool]]:
        """Peer side of a TransferConfig: (region, offset, writable) per address."""
        cluster = self._cluster_of(token)
        found = [cluster.find_address(a, length) for a in addresses]
        return [(entry.region_id, offset, peer_writable(cluster, entry.writable))
                for entry, offset in found]

    async def transport_call(self, method: str, token: int, request: Any) -> Any:
        """Peer side of a call the link's transport makes (``method``, one of
        ``factory.PEER_HANDLERS``): its inbound side answers ``request``."""
        handler = PEER_HANDLERS[method]
        return await handler(PeerScope(self._links.get(token), self._regions), request)

    async def close(self) -> None:
        """Revoke every inbound link and wait for what their transports kept here."""
        for token in list(self._links):
            self.drop_inbound(token)
        await asyncio.gather(*self._background, return_exceptions=True)
