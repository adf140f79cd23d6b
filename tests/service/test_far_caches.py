"""far_caches: a link finds the far cluster's caches over the Peer API (PeerCaches,
remembering answers by cache id and blocks key, never by key) or in this daemon's
registry (DaemonCaches), and tells the owner of pulls, notifications and unlinks
(the far daemon is tests/service/fakes.py's, answering with its real InboundLinks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from hixl_service.far_caches import DaemonCaches, PeerCaches
from hixl_service.notifies import Notification
from hixl_service.peer_api import PROTOCOL_VERSION, BlocksRef, IdRef, KeyRef
from hixl_service.peer_client import PEER_CALLS
from hixl_service.registry import KeySpec
from hixl_wire.status import LLMException, LLMStatusCode

from .fakes import FAR, NEAR, FakePeer, InMemoryDaemon, Network

pytestmark = pytest.mark.asyncio(loop_scope="session")



@pytest_asyncio.fixture
async def far() -> AsyncIterator[InMemoryDaemon]:
    daemon = InMemoryDaemon(Network())
    await daemon.cluster(FAR)
    try:
        yield daemon
    finally:
        await daemon.close()


def _peer_caches(far: InMemoryDaemon) -> tuple[PeerCaches, FakePeer, int]:
    token = far.inbound.accept_link(PROTOCOL_VERSION, "linker", NEAR, FAR,
                                    peer_calls=PEER_CALLS).token
    peer = far.network.peer(far.address)
    return PeerCaches(peer, token), peer, token


async def test_answers_by_id_and_blocks_key_are_remembered_by_key_never(
        far: InMemoryDaemon) -> None:
    caches, peer, _ = _peer_caches(far)
    cluster = far.clusters[FAR]
    key = KeySpec(3, 0)
    entry = far.cache(cluster, keys=[KeySpec(2, 0), key])
    far.cache(cluster, blocks=True, blocks_model_id=5)
    first = await caches.find(IdRef(FAR, entry.cache_id, 2), 1.0, 1.0)
    again = await caches.find(IdRef(FAR, entry.cache_id, 3), 1.0, 1.0)
    assert not first.cached and again.cached and peer.count("resolve") == 1
    assert (first.batch_index, again.batch_index) == (2, 3)  # the ref's slot, not the answer's
    assert again.place.region_id == entry.region_id and first.layout == again.layout
    assert caches.still_current(entry.cache_id, again)
    fresh = await caches.find(IdRef(FAR, entry.cache_id, 0), 1.0, 1.0, fresh=True)
    assert not fresh.cached and peer.count("resolve") == 2
    assert not caches.still_current(entry.cache_id, again)  # replaced by the fresh answer
    assert caches.still_current(entry.cache_id, fresh)
    by_key = [await caches.find(KeyRef(FAR, key), 1.0, 1.0) for _ in range(2)]
    assert [found.batch_index for found in by_key] == [1, 1] and peer.count("resolve") == 4
    await caches.find(BlocksRef(FAR, 5), 1.0, 1.0)
    assert (await caches.find(BlocksRef(FAR, 5), 1.0, 1.0)).cached
    caches.forget(BlocksRef(FAR, 5))
    assert not (await caches.find(BlocksRef(FAR, 5), 1.0, 1.0)).cached
    assert peer.count("resolve") == 6
    known = caches.known()
    assert known is not None and known.cached


async def test_the_far_daemons_refusal_keeps_its_status(far: InMemoryDaemon) -> None:
    caches, peer, _ = _peer_caches(far)
    with pytest.raises(LLMException) as missing:
        await caches.find(IdRef(FAR, 42, 0), 1.0, 1.0)
    assert missing.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    assert caches.known() is None  # nothing remembered from a failure
    unlinked = PeerCaches(peer, 12345)
    with pytest.raises(LLMException) as unknown:
        await unlinked.find(IdRef(FAR, 1, 0), 1.0, 1.0)
    assert unknown.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK


async def test_a_silent_peer_ends_a_find_at_the_wait(far: InMemoryDaemon) -> None:
    caches, peer, _ = _peer_caches(far)
    entry = far.cache(far.clusters[FAR])
    peer.silent.add("resolve")
    with pytest.raises(asyncio.TimeoutError):
        await caches.find(IdRef(FAR, entry.cache_id, 0), 0.02, 5.0)
    assert caches.known() is None


async def test_a_release_tells_the_owner_and_a_failed_one_does_not_raise(
        far: InMemoryDaemon) -> None:
    caches, peer, _ = _peer_caches(far)
    cluster = far.clusters[FAR]
    key, kept = KeySpec(4, 0), KeySpec(5, 0)
    far.cache(cluster, keys=[key, kept])
    await caches.release_key(KeyRef(FAR, key), [])
    with pytest.raises(LLMException):
        cluster.registry.lookup_key(key)
    peer.down = True
    await caches.release_key(KeyRef(FAR, kept), [])  # logged: the bytes had arrived
    assert cluster.registry.lookup_key(kept).batch_index == 1


async def test_notifications_addresses_and_unlinks_go_to_the_far_daemon(
        far: InMemoryDaemon) -> None:
    caches, peer, token = _peer_caches(far)
    cluster = far.clusters[FAR]
    entry = far.cache(cluster)
    entry.memory.client_base = base = 1 << 40
    # The far daemon names the sender by the link, whatever the caller says.
    await caches.notify(99, "done", b"x", 1.0)
    assert await cluster.inbox.take() == [Notification(NEAR, "done", b"x")]
    [(place, offset, writable)] = await caches.find_addresses(
        [base + entry.extent_offset + 128], 64, 1.0)
    assert (place.region_id, offset, writable) == (entry.region_id, 128, True)
    assert caches.peer is peer and caches.reachable()
    peer.down = True
    assert not await caches.tell_unlinked(1.0)
    assert far.inbound.has_inbound(token)
    peer.down = False
    assert await caches.tell_unlinked(1.0)
    assert not far.inbound.has_inbound(token)


async def _local(far: InMemoryDaemon) -> tuple[DaemonCaches, int]:
    """The far daemon's own link from a cluster of its own to FAR."""
    await far.cluster(NEAR)
    token = far.inbound.accept_link(PROTOCOL_VERSION, far.daemon_id, NEAR, FAR,
                                    peer_calls=PEER_CALLS).token
    return DaemonCaches(far.engine, FAR, token), token


async def test_a_local_far_cache_is_the_owners_entry_while_it_lives(far: InMemoryDaemon) -> None:
    caches, _token = await _local(far)
    owner = far.clusters[FAR]
    entry = far.cache(owner)
    found = await caches.find(IdRef(FAR, entry.cache_id, 2), 1.0, 1.0)
    assert found.origin is entry and found.place.memory is entry.memory
    assert found.batch_index == 2 and not found.cached
    assert caches.still_current(entry.cache_id, found) and caches.peer is None
    known = caches.known()
    assert known is not None and known.origin is entry
    await far.caches.deallocate(owner, entry.cache_id, blocks=False)
    assert not caches.still_current(entry.cache_id, found)
    with pytest.raises(LLMException) as missing:
        await caches.find(IdRef(FAR, entry.cache_id, 0), 1.0, 1.0)
    assert missing.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST


async def test_a_local_owner_hears_of_pulls_notifications_and_the_unlink(
        far: InMemoryDaemon) -> None:
    caches, token = await _local(far)
    owner = far.clusters[FAR]
    key = KeySpec(6, 0)
    entry = far.cache(owner, keys=[key])
    entry.memory.client_base = base = 1 << 41
    await caches.release_key(KeyRef(FAR, key), [0, 1])
    with pytest.raises(LLMException):
        owner.registry.lookup_key(key)
    await caches.notify(NEAR, "ready", b"", 1.0)
    assert await owner.inbox.take() == [Notification(NEAR, "ready", b"")]
    [(place, offset, writable)] = await caches.find_addresses(
        [base + entry.extent_offset + 64], 8, 1.0)
    assert place.memory is entry.memory and offset == entry.extent_offset + 64 and writable
    assert caches.reachable()
    assert await caches.tell_unlinked(1.0)
    assert not far.inbound.has_inbound(token) and not caches.reachable()
    with pytest.raises(LLMException) as gone:
        await caches.find(IdRef(FAR, entry.cache_id, 0), 1.0, 1.0)
    assert gone.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK
