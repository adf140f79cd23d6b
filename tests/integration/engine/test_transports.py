"""Engine-level transfers over every transport, with faults injected by
FaultTransport around the real one (in-process daemons, real sockets)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service import prepared
from hixl_service.link_health import LinkState
from hixl_service.server import Daemon
from hixl_service.servicer_admin import snapshot
from hixl_service.transfers import pull
from hixl_service.transports.fault import FaultRule
from hixl_wire._proto.hixl.v1.client_pb2 import CHECKSUM_DEFAULT as DEFAULT

from .conftest import InProcessDaemon, cache, fill, pull_spec, start_options, view

pytestmark = pytest.mark.asyncio(loop_scope="session")

Pair = tuple[InProcessDaemon, InProcessDaemon]


def landed(src, dst, src_slot: int, dst_slot: int) -> bool:  # type: ignore[no-untyped-def]
    return all(np.array_equal(view(src, t, src_slot), view(dst, t, dst_slot)) for t in (0, 1))


async def _linked(daemons: Pair, next_cluster_id, sync_timeout_ms: int = 1000):  # type: ignore[no-untyped-def]
    prefill, decode = daemons
    source, target = next_cluster_id(), next_cluster_id()
    owner = await prefill.cluster(source)
    puller = await decode.cluster(target, sync_timeout_ms)
    link = await decode.engine.outbound.link(puller, source, prefill.peer_address, 3.0)
    src, dst = cache(prefill.engine, owner), cache(decode.engine, puller)
    fill(src, seed=source)
    return puller, link, src, dst, decode.faults[-1]


async def test_a_tcp_pull_goes_through_the_links_transport(daemons: Pair,
                                                           next_cluster_id) -> None:
    puller, link, src, dst, fault = await _linked(daemons, next_cluster_id)
    outcome = await pull(puller, pull_spec(link.remote_cluster_id, src, dst, 1, 2))
    assert outcome.transport == link.transport.name == "tcp"
    assert outcome.bytes == 2 * 4096
    assert landed(src, dst, 1, 2)
    assert fault.requests == 1


async def test_a_repeat_starts_the_prepared_transfer_between_other_slots(
        daemons: Pair, next_cluster_id) -> None:
    puller, link, src, dst, fault = await _linked(daemons, next_cluster_id)
    spec = pull_spec(link.remote_cluster_id, src, dst, 0, 0)
    handle = prepared.repeat_handle(puller, spec, await pull(puller, spec), DEFAULT)
    repeat = puller.repeats.get(handle, push=False)
    outcome = await prepared.again(puller, repeat, 3, 1, checksum=False)
    assert outcome.bytes == 2 * 4096 and landed(src, dst, 3, 1)
    assert puller.repeats.repeated == 1
    assert fault.requests == 2  # the repeat moved over the same transport


async def test_a_repeat_whose_checksum_now_resolves_otherwise_runs_the_full_call(
        daemons: Pair, next_cluster_id) -> None:
    """The shape keeps the Checksum the call asked for; after the daemon's own
    setting changed (a reload), a repeat of a call that asked for the default
    moves as the full call would now, and its next repeats reuse that."""
    puller, link, src, dst, _ = await _linked(daemons, next_cluster_id)
    spec = pull_spec(link.remote_cluster_id, src, dst, 0, 0)
    handle = prepared.repeat_handle(puller, spec, await pull(puller, spec), DEFAULT)
    repeat = puller.repeats.get(handle, push=False)
    await prepared.again(puller, repeat, 2, 2, checksum=True)
    assert puller.repeats.repeated == 0 and landed(src, dst, 2, 2)
    assert repeat.found is not None and repeat.found.checksum
    await prepared.again(puller, repeat, 1, 3, checksum=True)
    assert puller.repeats.repeated == 1 and landed(src, dst, 1, 3)


async def test_a_failed_request_fails_its_pull_and_the_next_pull_moves(
        daemons: Pair, next_cluster_id) -> None:
    puller, link, src, dst, fault = await _linked(daemons, next_cluster_id)
    fault.add(FaultRule("fail", status=LLMStatusCode.LLM_LINK_FAILED))
    with pytest.raises(LLMException) as failed:
        await pull(puller, pull_spec(link.remote_cluster_id, src, dst, 0, 0))
    assert failed.value.status_code == LLMStatusCode.LLM_LINK_FAILED
    assert not landed(src, dst, 0, 0)
    await pull(puller, pull_spec(link.remote_cluster_id, src, dst, 0, 0))
    assert landed(src, dst, 0, 0)


async def test_a_dropped_request_ends_at_the_deadline_with_a_timeout(
        daemons: Pair, next_cluster_id) -> None:
    puller, link, src, dst, fault = await _linked(daemons, next_cluster_id, sync_timeout_ms=200)
    fault.add(FaultRule("drop"))
    with pytest.raises(LLMException) as dropped:
        await pull(puller, pull_spec(link.remote_cluster_id, src, dst, 0, 0))
    assert dropped.value.status_code == LLMStatusCode.LLM_TIMEOUT


async def test_a_refused_remembered_region_is_resolved_again(daemons: Pair,
                                                             next_cluster_id) -> None:
    puller, link, src, dst, fault = await _linked(daemons, next_cluster_id)
    await pull(puller, pull_spec(link.remote_cluster_id, src, dst, 0, 0))  # remembers the resolve
    fault.add(FaultRule("refuse"))
    await pull(puller, pull_spec(link.remote_cluster_id, src, dst, 2, 3))
    assert landed(src, dst, 2, 3)
    assert fault.requests == 3  # the first pull, the refused try, the fresh one


async def test_a_refused_repeat_runs_the_full_call(daemons: Pair, next_cluster_id) -> None:
    puller, link, src, dst, fault = await _linked(daemons, next_cluster_id)
    spec = pull_spec(link.remote_cluster_id, src, dst, 0, 0)
    handle = prepared.repeat_handle(puller, spec, await pull(puller, spec), DEFAULT)
    repeat = puller.repeats.get(handle, push=False)
    fault.add(FaultRule("refuse"))
    await prepared.again(puller, repeat, 1, 2, checksum=False)
    assert landed(src, dst, 1, 2)
    assert puller.repeats.repeated == 0  # the full call moved it
    assert repeat.found is not None  # and prepared the shape again


async def test_corruption_reaches_the_landed_bytes(daemons: Pair, next_cluster_id) -> None:
    puller, link, src, dst, fault = await _linked(daemons, next_cluster_id)
    fault.add(FaultRule("corrupt", direction="read"))
    await pull(puller, pull_spec(link.remote_cluster_id, src, dst, 0, 0))
    differing = sum(int((view(src, t, 0) != view(dst, t, 0)).sum()) for t in (0, 1))
    assert differing == 1


async def test_a_severed_link_reports_dead_and_fails_its_transfers(daemons: Pair,
                                                                   next_cluster_id) -> None:
    puller, link, src, dst, fault = await _linked(daemons, next_cluster_id)
    spec = pull_spec(link.remote_cluster_id, src, dst, 0, 0)
    handle = prepared.repeat_handle(puller, spec, await pull(puller, spec), DEFAULT)
    fault.sever()
    status = snapshot(daemons[1].engine, "host", daemons[1].peer_address)
    (shown,) = [s for s in status.links if s.local_cluster_id == puller.cluster_id]
    assert shown.transport == "tcp" and not shown.alive
    for attempt in (pull(puller, spec),
                    prepared.again(puller, puller.repeats.get(handle, push=False), 1, 1,
                                   checksum=False)):
        with pytest.raises(LLMException) as failed:
            await attempt
        assert failed.value.status_code == LLMStatusCode.LLM_LINK_FAILED


async def test_a_severed_link_is_degraded_then_up_again_once_healed(
        daemons: Pair, next_cluster_id) -> None:
    puller, link, src, dst, fault = await _linked(daemons, next_cluster_id)
    spec = pull_spec(link.remote_cluster_id, src, dst, 0, 0)
    loop = asyncio.get_running_loop()

    async def reaches(state: LinkState) -> None:
        deadline = loop.time() + 30  # heartbeats run every second here
        while link.health.state is not state:
            assert loop.time() < deadline, f"the link never became {state.value}"
            await asyncio.sleep(0.05)

    assert link.health.state is LinkState.UP
    fault.sever()
    await reaches(LinkState.DEGRADED)  # the far daemon answers; its streams are gone
    assert "0 of 4 data streams connected" in link.health.last_error
    status = snapshot(daemons[1].engine, "host", daemons[1].peer_address)
    (shown,) = [s for s in status.links if s.local_cluster_id == puller.cluster_id]
    assert (shown.health.state, shown.health.streams_up, shown.health.streams) == (
        "degraded", 0, 4)
    with pytest.raises(LLMException):
        await pull(puller, spec)
    fault.heal()
    await reaches(LinkState.UP)
    await pull(puller, spec)
    assert landed(src, dst, 0, 0)


async def test_a_link_inside_one_daemon_copies(daemons: Pair, next_cluster_id) -> None:
    prefill, _ = daemons
    source, target = next_cluster_id(), next_cluster_id()
    owner, puller = await prefill.cluster(source), await prefill.cluster(target)
    link = await prefill.engine.outbound.link(puller, source, prefill.peer_address, 3.0)
    assert link.transport.name == "local"
    src, dst = cache(prefill.engine, owner), cache(prefill.engine, puller)
    fill(src, seed=source)
    spec = pull_spec(source, src, dst, 3, 0)
    outcome = await pull(puller, spec)
    assert outcome.transport == "local" and landed(src, dst, 3, 0)
    handle = prepared.repeat_handle(puller, spec, outcome, DEFAULT)
    await prepared.again(puller, puller.repeats.get(handle, push=False), 2, 1,
                         checksum=False)
    assert landed(src, dst, 2, 1) and puller.repeats.repeated == 1
    prefill.faults[-1].add(FaultRule("fail", status=LLMStatusCode.LLM_FAILED))
    with pytest.raises(LLMException) as failed:
        await pull(puller, spec)
    assert failed.value.status_code == LLMStatusCode.LLM_FAILED


async def test_a_second_daemon_cannot_take_a_served_peer_port(daemons: Pair,
                                                              tmp_path) -> None:  # type: ignore[no-untyped-def]
    taken = int(daemons[0].peer_address.rsplit(":", 1)[1])
    config = start_options(tmp_path / "third")
    config = config.model_copy(update={"server": config.server.model_copy(
        update={"peer_port": taken})})
    (tmp_path / "third").mkdir()
    second = Daemon(config)
    with pytest.raises(Exception) as refused:
        await asyncio.wait_for(second.run(handle_signals=False), 30)
    assert str(taken) in str(refused.value)
