"""outbound: linking a cluster to a far one (retried as LLM-DataDist's link options say,
within one budget), refusing a second link, replacing a down one, unlinking with
the far daemon told (again in the background while its lease lasts), and linking
again after the far daemon restarted (in-memory wire and far daemon:
tests/service/fakes.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from hixl_service import outbound
from hixl_service.far_caches import DaemonCaches, PeerCaches
from hixl_service.link_health import LinkState
from hixl_service.transports.base import Transport
from hixl_wire.status import LLMException, LLMStatusCode

from .fakes import FAR, NEAR, FakePeer, InMemoryDaemon, MemoryTransport, Network, use_memory_wire

pytestmark = pytest.mark.asyncio(loop_scope="session")



@pytest_asyncio.fixture
async def network(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Network]:
    use_memory_wire(monkeypatch)
    monkeypatch.setattr(outbound, "LINK_RETRY_PAUSE_S", 0.001)
    monkeypatch.setattr(outbound, "UNLINK_RETRY_PAUSE_S", 0.001)
    network = Network()
    try:
        yield network
    finally:
        for daemon in list(network.daemons.values()):
            await daemon.close()


async def _two(network: Network, **far_options: float) -> tuple[InMemoryDaemon, InMemoryDaemon]:
    near, far = InMemoryDaemon(network), InMemoryDaemon(network, **far_options)
    await far.cluster(FAR)
    return near, far


async def test_a_link_reaches_the_far_cluster_over_the_wire(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR)
    link = await near.link(cluster, far, FAR)
    assert cluster.links[FAR] is link and link.health.state is LinkState.UP
    assert link.remote_daemon_id == far.daemon_id and link.remote_peer_address == far.address
    assert isinstance(link.transport, MemoryTransport) and isinstance(link.far, PeerCaches)
    assert link.lease_s == 10.0 and link.last_heard > 0
    inbound = far.inbound.all()
    assert [(i.token, i.src_cluster_id, i.dst_cluster_id) for i in inbound] == \
        [(link.token, NEAR, FAR)]
    assert far.data_server.authorized(link.token)


async def test_a_link_within_the_daemon_copies_and_reads_its_registry(network: Network) -> None:
    near = InMemoryDaemon(network)
    cluster, other = await near.cluster(NEAR), await near.cluster(FAR)
    link = await near.link(cluster, near, FAR)
    assert link.transport.name == "local" and isinstance(link.far, DaemonCaches)
    assert near.inbound.all()[0].lease_s == 0  # no lease inside one daemon
    assert other.cluster_id in near.clusters


async def test_a_second_link_or_one_to_itself_is_refused(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR)
    with pytest.raises(LLMException) as itself:
        await near.outbound.link(cluster, NEAR, near.address, 1.0)
    assert itself.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    await near.link(cluster, far, FAR)
    with pytest.raises(LLMException) as again:
        await near.link(cluster, far, FAR)
    assert again.value.status_code == LLMStatusCode.LLM_ALREADY_LINK
    assert len(far.inbound.all()) == 1


async def test_a_down_link_is_replaced_by_a_new_one(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR)
    old = await near.link(cluster, far, FAR)
    old.health.move_to(LinkState.DOWN, "heartbeats failed")
    new = await near.link(cluster, far, FAR)
    assert cluster.links[FAR] is new and new.token != old.token
    assert old.health.state is LinkState.CLOSED
    assert isinstance(old.transport, MemoryTransport) and old.transport.closed
    peer = network.peer(far.address)
    assert peer.count("unlink") == 0  # the old one is not told: its lease ends it


async def test_a_far_cluster_not_yet_there_is_linked_on_a_later_attempt(
        network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR, link_attempts=3)
    peer = network.peer(far.address)
    peer.fail_next("hello", LLMStatusCode.LLM_LINK_FAILED, times=2)
    link = await near.link(cluster, far, FAR)
    assert peer.count("hello") == 3 and cluster.links[FAR] is link


async def test_linking_gives_up_after_the_attempts_it_may_make(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR, link_attempts=2)
    with pytest.raises(LLMException) as failed:
        await near.link(cluster, far, 3)  # no cluster 3 there
    assert failed.value.status_code == LLMStatusCode.LLM_LINK_FAILED
    assert "not initialized" in str(failed.value)
    assert network.peer(far.address).count("hello") == 2
    assert not cluster.links and not far.inbound.all()


async def test_only_link_failures_are_retried(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR, link_attempts=5)
    peer = network.peer(far.address)
    peer.fail_next("hello", LLMStatusCode.LLM_PARAM_INVALID)
    with pytest.raises(LLMException) as refused:
        await near.link(cluster, far, FAR)
    assert refused.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    assert peer.count("hello") == 1


async def test_a_silent_far_daemon_ends_linking_at_the_calls_timeout(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR, link_attempts=3)
    network.peer(far.address).silent.add("hello")
    with pytest.raises(LLMException) as late:
        await near.link(cluster, far, FAR, timeout_s=0.03)
    assert late.value.status_code == LLMStatusCode.LLM_LINK_FAILED
    assert "timed out" in str(late.value)


async def test_a_transport_that_cannot_open_unlinks_on_the_far_daemon(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR)

    def cannot_open(transport: Transport) -> Transport:
        raise LLMException("no data plane (test)", status_code=LLMStatusCode.LLM_LINK_FAILED)

    near.engine.kit.wrap = cannot_open
    with pytest.raises(LLMException) as failed:
        await near.link(cluster, far, FAR)
    assert failed.value.status_code == LLMStatusCode.LLM_LINK_FAILED
    assert network.peer(far.address).count("unlink") == 1 and not far.inbound.all()
    assert not cluster.links


async def test_an_unlink_tells_the_far_daemon_unless_forced(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR)
    link = await near.link(cluster, far, FAR)
    await near.outbound.unlink(cluster, FAR, force=False)
    assert not cluster.links and link.health.state is LinkState.CLOSED
    assert not far.inbound.has_inbound(link.token) and not far.data_server.authorized(link.token)
    with pytest.raises(LLMException) as unknown:
        await near.outbound.unlink(cluster, FAR, force=False)
    assert unknown.value.status_code == LLMStatusCode.LLM_UNLINK_FAILED
    forced = await near.link(cluster, far, FAR)
    await near.outbound.unlink(cluster, FAR, force=True)
    assert far.inbound.has_inbound(forced.token)  # its lease ends it there


async def test_an_unlink_the_far_daemon_missed_is_told_again_while_its_lease_lasts(
        network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR)
    link = await near.link(cluster, far, FAR)
    peer = network.peer(far.address)
    peer.down = True
    with pytest.raises(LLMException) as untold:
        await near.outbound.unlink(cluster, FAR, force=False)
    assert untold.value.status_code == LLMStatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED
    assert "told again in the background" in str(untold.value)
    assert far.inbound.has_inbound(link.token)
    peer.down = False
    await peer.wait_for_call("unlink", 2)
    assert not far.inbound.has_inbound(link.token)


async def test_without_a_lease_a_missed_unlink_is_not_retried(network: Network) -> None:
    near, far = await _two(network, lease_s=0.0)
    cluster = await near.cluster(NEAR)
    link = await near.link(cluster, far, FAR)
    assert link.lease_s == 0
    network.peer(far.address).down = True
    with pytest.raises(LLMException) as untold:
        await near.outbound.unlink(cluster, FAR, force=False)
    assert untold.value.status_code == LLMStatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED
    assert "drops the link untold" in str(untold.value)
    assert not near.outbound._background


async def test_a_restarted_far_daemon_is_linked_again_under_the_same_health(
        network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR)
    old = await near.link(cluster, far, FAR)
    old_peer = network.peer(far.address)
    # The far daemon restarts at the same address: a new daemon, the cluster again.
    await far.close()
    restarted = InMemoryDaemon(network)
    network.daemons[far.address] = network.daemons.pop(restarted.address)
    restarted.address = far.address
    await restarted.cluster(FAR)
    assert await near.outbound.reopen(cluster, old, "the far daemon restarted")
    new = cluster.links[FAR]
    assert new is not old and new.health is old.health and new.health.state is LinkState.UP
    assert new.remote_daemon_id == restarted.daemon_id and restarted.inbound.has_inbound(new.token)
    assert isinstance(old.transport, MemoryTransport) and old.transport.closed
    assert new.far is not old.far  # nothing resolved from the old daemon is used again
    assert network.peer(far.address) is not old_peer


async def test_linking_again_that_fails_leaves_the_link_down(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR)
    old = await near.link(cluster, far, FAR)
    network.peer(far.address).down = True
    assert not await near.outbound.reopen(cluster, old, "the far daemon restarted")
    assert cluster.links[FAR] is old and old.health.state is LinkState.DOWN
    assert "linking again failed" in old.health.last_error


async def test_a_link_unlinked_while_it_was_linked_again_is_closed(network: Network) -> None:
    near, far = await _two(network)
    cluster = await near.cluster(NEAR)
    old = await near.link(cluster, far, FAR)
    cluster.links.pop(FAR)  # unlinked meanwhile
    assert await near.outbound.reopen(cluster, old, "the far daemon restarted")
    assert FAR not in cluster.links
    peer: FakePeer = network.peer(far.address)
    assert peer.count("hello") == 2 and peer.count("unlink") == 1
    assert [i.token for i in far.inbound.all()] == [old.token]
