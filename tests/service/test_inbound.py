"""inbound: accepting links (each refusal with its status), the peer calls a link's
token names (resolves, releases, notifications, addresses), leases renewed by
heartbeats and reaped when they end, and dropping links (the data server revokes
their tokens). Real caches and regions; the data server is tests/service/fakes.py's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from hixl_service.config import LimitsConfig, SecurityConfig
from hixl_service.inbound import InboundLinks
from hixl_service.link_health import LinkState
from hixl_service.notifies import Notification
from hixl_service.peer_api import PROTOCOL_VERSION, BlocksRef, IdRef, KeyRef, Lease
from hixl_service.peer_client import PEER_CALLS
from hixl_service.registry import KeySpec
from hixl_service.rpc_errors import CallRefused
from hixl_service.trust import Trust
from hixl_wire.status import LLMException, LLMStatusCode

from .fakes import InMemoryDaemon, Network

pytestmark = pytest.mark.asyncio(loop_scope="session")

OWN = 2


@pytest_asyncio.fixture
async def daemon() -> AsyncIterator[InMemoryDaemon]:
    daemon = InMemoryDaemon(Network())
    await daemon.cluster(OWN)
    try:
        yield daemon
    finally:
        await daemon.close()


def _accept(inbound: InboundLinks, src_cluster_id: int = 1, dst_cluster_id: int = OWN,
            daemon_id: str = "linker", **extra: object) -> int:
    return inbound.accept_link(PROTOCOL_VERSION, daemon_id, src_cluster_id, dst_cluster_id,
                               peer_calls=PEER_CALLS, **extra).token  # type: ignore[arg-type]


async def test_a_link_is_authorized_at_the_data_server_for_its_cluster(
        daemon: InMemoryDaemon) -> None:
    hello = daemon.inbound.accept_link(PROTOCOL_VERSION, "linker", 1, OWN, identity="peer-a",
                                       peer_calls=PEER_CALLS)
    assert hello.daemon_id == daemon.daemon_id and hello.token
    assert hello.data_port == daemon.data_server.port and hello.lease_ms == 10_000
    assert len(hello.link_key) > 0 and daemon.data_server.authorized(hello.token)
    [link] = daemon.inbound.all()
    assert (link.token, link.src_cluster_id, link.dst_cluster_id, link.identity) == \
        (hello.token, 1, OWN, "peer-a")
    assert link.health.state is LinkState.UP and link.may_write
    assert daemon.inbound.dst_cluster_of(hello.token) == OWN
    assert daemon.inbound.to_cluster(OWN) == [link] and daemon.inbound.to_cluster(9) == []
    # A link from a cluster of this daemon keeps no lease.
    local = daemon.inbound.accept_link(PROTOCOL_VERSION, daemon.daemon_id, 3, OWN,
                                       peer_calls=PEER_CALLS)
    assert local.lease_ms == 0 and local.token != hello.token


@pytest.mark.parametrize(("case", "status", "words"), [
    ("protocol", LLMStatusCode.LLM_LINK_FAILED, "peer protocol"),
    ("backend", LLMStatusCode.LLM_LINK_FAILED, "backend"),
    ("no cluster", LLMStatusCode.LLM_LINK_FAILED, "not initialized"),
    ("another listener", LLMStatusCode.LLM_PARAM_INVALID, "listen_ip_info"),
])
async def test_a_hello_that_cannot_link_is_refused(daemon: InMemoryDaemon, case: str,
                                                   status: LLMStatusCode, words: str) -> None:
    inbound = daemon.inbound
    version, backend, cluster, listener = PROTOCOL_VERSION, "host", OWN, None
    if case == "protocol":
        version += 1
    elif case == "backend":
        backend = "hccl"
    elif case == "no cluster":
        cluster = 9
    else:
        listener = 5
    with pytest.raises(LLMException) as refused:
        inbound.accept_link(version, "linker", 1, cluster, backend, listener_of=listener,
                            peer_calls=PEER_CALLS)
    assert refused.value.status_code == status and words in str(refused.value)
    assert inbound.all() == []


async def test_links_beyond_the_limits_are_refused_as_resource_exhausted() -> None:
    trust = Trust(SecurityConfig(), LimitsConfig(max_inbound_links=3, max_links_per_peer=2))
    daemon = InMemoryDaemon(Network(), trust=trust)
    try:
        await daemon.cluster(OWN)
        _accept(daemon.inbound, 1, identity="a")
        _accept(daemon.inbound, 2, identity="a")
        with pytest.raises(CallRefused) as per_peer:
            _accept(daemon.inbound, 3, identity="a")
        assert per_peer.value.reason == "max_links_per_peer"
        _accept(daemon.inbound, 3, identity="b")
        with pytest.raises(CallRefused) as overall:
            _accept(daemon.inbound, 4, identity="c")
        for refusal in (per_peer.value, overall.value):
            assert refusal.status_code == LLMStatusCode.LLM_LINK_FAILED
            assert refusal.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert overall.value.reason == "max_inbound_links" and len(daemon.inbound.all()) == 3
    finally:
        await daemon.close()


async def test_a_resolve_describes_the_cache_inside_its_region(daemon: InMemoryDaemon) -> None:
    cluster = daemon.clusters[OWN]
    key = KeySpec(7, 0)
    entry = daemon.cache(cluster, keys=[KeySpec(6, 0), key])
    blocks = daemon.cache(cluster, blocks=True, blocks_model_id=3)
    token = _accept(daemon.inbound)
    found = daemon.inbound.resolve_for_peer(token, IdRef(OWN, entry.cache_id, 3))
    assert (found.cache_id, found.region_id, found.batch_index) == \
        (entry.cache_id, entry.region_id, 3)
    assert found.tensor_offsets[0] == entry.tensor_offsets[0] - entry.extent_offset
    assert (found.tensor_size, found.batch_size, found.blocks) == (1024, 4, False)
    assert daemon.inbound.resolve_for_peer(token, KeyRef(OWN, key)).batch_index == 1
    assert daemon.inbound.resolve_for_peer(token, BlocksRef(OWN, 3)).cache_id == blocks.cache_id
    with pytest.raises(LLMException) as other:
        daemon.inbound.resolve_for_peer(token, IdRef(5, entry.cache_id, 0))
    assert other.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    with pytest.raises(LLMException) as missing:
        daemon.inbound.resolve_for_peer(token, IdRef(OWN, 99, 0))
    assert missing.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    with pytest.raises(LLMException) as unknown:
        daemon.inbound.resolve_for_peer(token + 1, IdRef(OWN, entry.cache_id, 0))
    assert unknown.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK


async def test_releases_of_every_tensor_free_a_cache_only_its_key_held(
        daemon: InMemoryDaemon) -> None:
    cluster = daemon.clusters[OWN]
    key = KeySpec(8, 0)
    entry = daemon.cache(cluster, keys=[key])
    await daemon.caches.deallocate(cluster, entry.cache_id, blocks=False)
    pool = cluster.pools[next(iter(cluster.pools))]
    used = pool.allocator.used_bytes
    token = _accept(daemon.inbound)
    await daemon.inbound.release_for_peer(token, key, [0])
    assert cluster.registry.lookup_key(key).cache is entry  # tensor 1 not yet pulled
    await daemon.inbound.release_for_peer(token, key, [1])
    assert entry.gone and pool.allocator.used_bytes < used
    assert not daemon.data_server.has_region(entry.region_id)


async def test_a_notification_is_queued_as_sent_by_the_links_source_cluster(
        daemon: InMemoryDaemon) -> None:
    token = _accept(daemon.inbound, src_cluster_id=4)
    daemon.inbound.notify_for_peer(token, "ready", b"slot 3")
    assert await daemon.clusters[OWN].inbox.take() == [Notification(4, "ready", b"slot 3")]
    with pytest.raises(LLMException) as unknown:
        daemon.inbound.notify_for_peer(token + 1, "ready", b"")
    assert unknown.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK


async def test_addresses_resolve_to_regions_of_the_clients_mapping(
        daemon: InMemoryDaemon) -> None:
    cluster = daemon.clusters[OWN]
    entry = daemon.cache(cluster)
    entry.memory.client_base = base = 0x7F00_0000_0000
    token = _accept(daemon.inbound)
    start = base + entry.extent_offset
    assert daemon.inbound.resolve_addresses_for_peer(token, [start + 64], 128) == \
        [(entry.region_id, 64, True)]
    with pytest.raises(LLMException) as outside:
        daemon.inbound.resolve_addresses_for_peer(token, [start + entry.extent_size], 1)
    assert outside.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


async def test_heartbeats_renew_their_own_links_and_learn_the_others_fate(
        daemon: InMemoryDaemon) -> None:
    inbound = daemon.inbound
    mine, theirs = _accept(inbound, 1), _accept(inbound, 3, daemon_id="other")
    dropped = _accept(inbound, 4)
    assert inbound.drop_from(OWN, 4)
    link = next(link for link in inbound.all() if link.token == mine)
    link.renewed_at -= 3
    assert inbound.renew("linker", [mine, theirs, dropped, 12345]) == \
        [Lease.RENEWED, Lease.UNKNOWN, Lease.DROPPED, Lease.UNKNOWN]
    assert inbound.lease_left_s(link) > 9.5
    inbound.stopping = True
    assert inbound.untold_of_stop() == 2
    assert not await inbound.wait_told_of_stop(0)
    assert inbound.renew("linker", [mine]) == [Lease.STOPPING] and link.told_stopping
    assert inbound.renew("other", [theirs]) == [Lease.STOPPING]
    assert await inbound.wait_told_of_stop(0)


async def test_a_heartbeat_naming_more_links_than_allowed_is_refused() -> None:
    trust = Trust(SecurityConfig(), LimitsConfig(max_inbound_links=2))
    daemon = InMemoryDaemon(Network(), trust=trust)
    try:
        with pytest.raises(LLMException) as refused:
            daemon.inbound.renew("linker", [1, 2, 3])
        assert refused.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    finally:
        await daemon.close()


async def test_the_reaper_shows_late_links_and_drops_those_whose_lease_ended(
        daemon: InMemoryDaemon) -> None:
    inbound = daemon.inbound
    tokens = [_accept(inbound, src) for src in (1, 3, 4, 5)]
    local = _accept(inbound, 6, daemon_id=daemon.daemon_id)  # no lease: never reaped
    now = asyncio.get_running_loop().time()
    links = {link.token: link for link in inbound.all()}
    for token, age in zip(tokens, (0.0, 4.6, 5.5, 10.5), strict=True):
        links[token].renewed_at = now - age
    inbound.reap()
    assert [links[t].health.state for t in tokens] == \
        [LinkState.UP, LinkState.DEGRADED, LinkState.DOWN, LinkState.CLOSED]
    assert not inbound.has_inbound(tokens[3]) and not daemon.data_server.authorized(tokens[3])
    assert "lease ended" in links[tokens[3]].health.last_error
    assert inbound.has_inbound(local)
    assert inbound.renew("linker", [tokens[3]]) == [Lease.UNKNOWN]  # not dropped on purpose


async def test_a_daemon_that_did_not_run_starts_every_lease_again(
        daemon: InMemoryDaemon) -> None:
    inbound = daemon.inbound
    token = _accept(inbound)
    inbound.reap()  # the last round, "long ago":
    inbound._last_reap -= 20
    [link] = inbound.all()
    link.renewed_at -= 20
    inbound.reap()
    assert inbound.has_inbound(token) and link.health.state is LinkState.UP


async def test_unlinks_revoke_the_token_and_unknown_ones_are_refused(
        daemon: InMemoryDaemon) -> None:
    inbound = daemon.inbound
    token = _accept(inbound)
    inbound.drop_inbound_link(token)
    assert not inbound.has_inbound(token) and not daemon.data_server.authorized(token)
    with pytest.raises(LLMException) as unknown:
        inbound.drop_inbound_link(token)
    assert unknown.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK
    assert not inbound.drop_from(OWN, 1)
    others = [_accept(inbound, src) for src in (1, 3)]
    await inbound.close()
    assert inbound.all() == [] and not any(daemon.data_server.authorized(t) for t in others)
