"""Mixed versions (issue 30): the Peer calls hccl links need (HcclReserve,
HcclTeardown, HcclDestroy) came without a new protocol version, so each daemon
names the Peer calls it serves in Hello, and an hccl daemon refuses a link with
one that lacks any of them, either way round, naming what is missing, rather
than failing later inside the link's set-up with no clear cause."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from hixl_client import LLMDataDist, LLMRole, LLMStatusCode
from hixl_service.peer_client import PEER_CALLS
from hixl_service.servicer_peer import PeerServicer
from hixl_service.testing import DaemonProcess
from hixl_service.transports.base import check_peer_calls
from hixl_service.transports.factory import PEER_LANE_METHODS, TransportKit
from hixl_service.transports.factory import check_peer_calls as check_for_kit
from hixl_service.transports.hccl import HcclTransport
from hixl_service.transports.tcp import TcpTransport
from hixl_wire._proto.hixl.v1 import peer_pb2, peer_pb2_grpc
from hixl_wire.status import STATUS_METADATA_KEY, LLMException

from .daemons import cluster_info, daemon_process, options

MISSING = "lacks the Peer calls HcclReserve, HcclTeardown, HcclDestroy that hccl links need"
_ids = itertools.count(9300)


def test_an_hccl_link_needs_every_call_and_a_host_link_none() -> None:
    hccl = HcclTransport.name, HcclTransport.peer_calls
    check_peer_calls(TcpTransport.name, TcpTransport.peer_calls, "old", ())
    check_peer_calls(*hccl, "new", PEER_CALLS)
    with pytest.raises(LLMException, match=f"daemon old {MISSING}") as refused:
        check_peer_calls(*hccl, "old", ())
    assert refused.value.status_code == LLMStatusCode.LLM_LINK_FAILED
    # a daemon between the two: HcclReserve and HcclTeardown, not HcclDestroy
    with pytest.raises(LLMException, match="lacks the Peer call HcclDestroy that"):
        check_peer_calls(*hccl, "mid", ("Hello", "HcclReserve", "HcclTeardown"))


def test_the_factory_asks_the_transport_of_the_daemons_links() -> None:
    host = TransportKit(copier=None, dispatcher=None)  # type: ignore[arg-type]
    check_for_kit(host, "old", ())  # a host daemon's links need nothing more
    hccl = TransportKit(copier=None, dispatcher=None, ascend=object())  # type: ignore[arg-type]
    with pytest.raises(LLMException, match=f"daemon old {MISSING}"):
        check_for_kit(hccl, "old", ())
    check_for_kit(hccl, "new", PEER_CALLS)


def test_this_daemon_serves_every_call_it_names() -> None:
    assert set(HcclTransport.peer_calls) <= set(PEER_CALLS)
    for call in PEER_CALLS:  # each overrides the generated stub (UNIMPLEMENTED)
        assert getattr(PeerServicer, call) is not getattr(peer_pb2_grpc.PeerServicer, call), call


def test_the_peer_lane_carries_the_transports_calls_at_their_wire_kinds() -> None:
    kinds = {name: method.kind for name, method in PEER_LANE_METHODS.items()}
    assert kinds == {"ResolveCache": 1, "ReleaseKey": 2, "HcclPost": 3, "HcclRegion": 4,
                     "Notify": 5}


@pytest.fixture(scope="module")
def daemon(double_dir: Path, runtime: object) -> Iterator[DaemonProcess]:
    with daemon_process("hccl", double_dir) as started:
        yield started


def _hello(dst: int, calls: tuple[str, ...]) -> peer_pb2.HelloRequest:
    return peer_pb2.HelloRequest(protocol_version=1, daemon_id="older", version="0",
                                 src_cluster_id=99, dst_cluster_id=dst, backend="hccl",
                                 peer_calls=calls)


@pytest.mark.asyncio
async def test_the_linked_daemon_refuses_a_peer_without_the_calls(daemon: DaemonProcess) -> None:
    cluster = LLMDataDist(LLMRole.PROMPT, next(_ids), daemon=daemon.client_target)
    await cluster.init(options(device_id=0))
    try:
        async with grpc.aio.insecure_channel(daemon.peer_address) as channel:
            peer = peer_pb2_grpc.PeerStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await peer.Hello(_hello(cluster.cluster_id, ()), timeout=10)
            assert f"daemon older {MISSING}" in (refused.value.details() or "")
            status = dict(refused.value.trailing_metadata() or ()).get(STATUS_METADATA_KEY)
            assert status == str(int(LLMStatusCode.LLM_LINK_FAILED))
            # naming them, it links (and unlinks)
            reply = await peer.Hello(_hello(cluster.cluster_id, PEER_CALLS), timeout=10)
            assert set(HcclTransport.peer_calls) <= set(reply.peer_calls)
            await peer.Unlink(peer_pb2.UnlinkRequest(link_token=reply.link_token), timeout=10)
    finally:
        await cluster.finalize()


class _OlderDaemon(peer_pb2_grpc.PeerServicer):
    """An hccl daemon from before issue 30's Peer calls: it accepts the Hello and
    names no calls; every call it lacks answers UNIMPLEMENTED."""

    def __init__(self) -> None:
        self.unlinked: list[int] = []
        self.hccl_calls = 0

    async def Hello(self, request: peer_pb2.HelloRequest,
                    context: grpc.aio.ServicerContext[object, object]) -> peer_pb2.HelloReply:
        return peer_pb2.HelloReply(protocol_version=request.protocol_version,
                                   daemon_id="older", version="0", data_host="127.0.0.1",
                                   data_port=1, link_token=77, backend="hccl")

    async def Unlink(self, request: peer_pb2.UnlinkRequest,
                     context: grpc.aio.ServicerContext[object, object]) -> peer_pb2.UnlinkReply:
        self.unlinked.append(request.link_token)
        return peer_pb2.UnlinkReply()

    async def HcclRankInfo(self, request: peer_pb2.HcclRankInfoRequest,
                           context: grpc.aio.ServicerContext[object, object]) -> peer_pb2.HcclRank:
        self.hccl_calls += 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, "not reached")
        raise AssertionError


@pytest_asyncio.fixture
async def older() -> AsyncIterator[tuple[_OlderDaemon, str]]:
    servicer = _OlderDaemon()
    server = grpc.aio.server()
    peer_pb2_grpc.add_PeerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@pytest.mark.asyncio
async def test_the_linking_daemon_refuses_a_peer_without_the_calls(
        daemon: DaemonProcess, older: tuple[_OlderDaemon, str],
        caplog: pytest.LogCaptureFixture) -> None:
    servicer, address = older
    cluster = LLMDataDist(LLMRole.DECODER, next(_ids), daemon=daemon.client_target)
    await cluster.init(options(device_id=1))
    try:
        with caplog.at_level(logging.WARNING, logger="hixl_client"):
            status, results = await cluster.link_clusters([cluster_info(5, address)],
                                                          timeout=5000)
        assert results == [LLMStatusCode.LLM_LINK_FAILED], (status, results)
        assert f"daemon older {MISSING}" in caplog.text
        # refused before the link's set-up began, and the far end told at once
        assert servicer.hccl_calls == 0
        assert servicer.unlinked == [77]
    finally:
        await cluster.finalize()
