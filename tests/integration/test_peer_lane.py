"""The peer lane: the Peer calls of a transfer as framed messages over TCP.

A raw client plays the other daemon: it links with Peer.Hello (gRPC), which
announces the lane's port, then resolves and releases keyed caches on the
lane, checking that replies come back matched by call id, errors carry the
unary call's LLMStatusCode, and messages of one connection are handled in
order. Two real daemons then pull by key with the lane on and off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc.aio
import pytest
import pytest_asyncio

from hixl_client import (
    CacheDesc,
    CacheKey,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_client._manager_base import ref_to_proto
from hixl_service.peer_api import PROTOCOL_VERSION
from hixl_service.testing import DaemonProcess, start_daemon
from hixl_wire._proto.hixl.v1 import common_pb2, peer_pb2, peer_pb2_grpc
from hixl_wire.lane import PEER_METHODS, REPLY_OK

from .conftest import daemon_status, make_pair, options
from .raw_lane import RawLane

pytestmark = pytest.mark.asyncio

DESC = CacheDesc(2, [1, 4096], DataType.DT_UINT8)
RESOLVE, RELEASE = PEER_METHODS["ResolveCache"][0], PEER_METHODS["ReleaseKey"][0]


@pytest_asyncio.fixture
async def prompt(prefill_daemon: DaemonProcess,
                 next_cluster_id: Callable[[], int]) -> AsyncIterator[LLMDataDist]:
    llm = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    await llm.init(options())
    yield llm
    await llm.finalize()


def _key(cluster_id: int, req_id: int) -> common_pb2.CacheKey:
    """The wire form of CacheKey(cluster_id, req_id), as the client library sends it."""
    return ref_to_proto(CacheKey(cluster_id, req_id)).key


def _resolve(token: int, cluster_id: int, req_id: int) -> bytes:
    return peer_pb2.ResolveCacheRequest(link_token=token, ref=common_pb2.CacheRef(
        key=_key(cluster_id, req_id))).SerializeToString()


async def test_peer_lane_resolves_and_releases_in_order(prefill_daemon: DaemonProcess,
                                                        prompt: LLMDataDist) -> None:
    for req_id in range(1, 21):
        await prompt.cache_manager.allocate_cache(DESC, [CacheKey(prompt.cluster_id, req_id)])
    async with grpc.aio.insecure_channel(prefill_daemon.peer_address) as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        hello = await stub.Hello(peer_pb2.HelloRequest(
            protocol_version=PROTOCOL_VERSION, daemon_id="test-peer", version="test",
            src_cluster_id=10**9, dst_cluster_id=prompt.cluster_id), timeout=10)
        assert hello.lane_port > 0
        status = await daemon_status(prefill_daemon.client_target)
        assert status.peer_lane_address == f"{hello.data_host}:{hello.lane_port}"
        token = hello.link_token
        lane = await asyncio.to_thread(RawLane.tcp, hello.data_host, hello.lane_port)
        try:
            # Twenty resolves in flight at once come back matched by call id.
            for req_id in range(1, 21):
                lane.send(100 + req_id, RESOLVE, _resolve(token, prompt.cluster_id, req_id), 5000)
            replies = {}
            for _ in range(20):
                call_id, kind, body = await asyncio.to_thread(lane.receive)
                assert kind == REPLY_OK
                replies[call_id] = peer_pb2.ResolveCacheReply.FromString(body)
            assert sorted(replies) == list(range(101, 121))
            assert len({r.cache_id for r in replies.values()}) == 20

            # A release drops the key: a resolve sent after it on the lane misses.
            lane.send(1, RELEASE, peer_pb2.ReleaseKeyRequest(
                link_token=token, key=_key(0, 5)).SerializeToString())
            lane.send(2, RESOLVE, _resolve(token, prompt.cluster_id, 5))
            assert await asyncio.to_thread(lane.receive) == (1, REPLY_OK, b"")
            call_id, error = await asyncio.to_thread(lane.error)
            assert call_id == 2 and error.llm_status == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST

            # Errors carry the unary call's status: a wrong token, a method the lane lacks.
            lane.send(3, RESOLVE, _resolve(token + 1, prompt.cluster_id, 6))
            call_id, error = await asyncio.to_thread(lane.error)
            assert call_id == 3 and error.llm_status == LLMStatusCode.LLM_NOT_YET_LINK
            lane.send(4, 9)
            call_id, error = await asyncio.to_thread(lane.error)
            assert call_id == 4 and error.grpc_code == grpc.StatusCode.UNIMPLEMENTED.value[0]
        finally:
            lane.close()
        await stub.Unlink(peer_pb2.UnlinkRequest(link_token=token), timeout=10)


@pytest.mark.parametrize("peer_lane", [True, False])
async def test_keyed_pulls_drop_their_keys(peer_lane: bool,
                                           next_cluster_id: Callable[[], int]) -> None:
    async with start_daemon(server__peer_lane=peer_lane) as prefill, \
            start_daemon(server__peer_lane=peer_lane) as decode:
        pair = await make_pair(prefill, decode, next_cluster_id)
        assert bool((await daemon_status(prefill.client_target)).peer_lane_address) == peer_lane
        calls_before = (await daemon_status(prefill.client_target)).peer_lane_calls
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        for req_id in range(1, 6):
            key = CacheKey(pair.prompt.cluster_id, req_id=req_id)
            await pair.prompt.cache_manager.allocate_cache(DESC, [key])
            await pair.decoder.cache_manager.pull_cache(key, dst)
            with pytest.raises(LLMException) as again:  # the pull dropped the key
                await pair.decoder.cache_manager.pull_cache(key, dst)
            assert again.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
        # Each pull resolved and released on the lane; each refused one resolved there.
        calls = (await daemon_status(prefill.client_target)).peer_lane_calls - calls_before
        assert calls == (15 if peer_lane else 0)
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_a_lost_peer_fails_lane_calls_and_open_lanes_do_not_hold_a_stop(
        next_cluster_id: Callable[[], int]) -> None:
    # A long grace period: a stop that waited for the idle lane would take all of it.
    async with start_daemon(server__grace_period_s=60) as prefill, start_daemon() as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, sync_kv_timeout=3000)
        key = CacheKey(pair.prompt.cluster_id, req_id=1)
        await pair.prompt.cache_manager.allocate_cache(DESC, [key])
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        await pair.decoder.cache_manager.pull_cache(key, dst)  # opens decode's lane to prefill
        await pair.prompt.finalize()
        started = time.monotonic()
        assert await asyncio.to_thread(prefill.stop, 30.0) == 0
        assert time.monotonic() - started < 20.0
        with pytest.raises(LLMException) as gone:
            await pair.decoder.cache_manager.pull_cache(CacheKey(pair.prompt.cluster_id, 2), dst)
        assert gone.value.status_code in (LLMStatusCode.LLM_LINK_FAILED,
                                          LLMStatusCode.LLM_NOT_YET_LINK)
        await pair.decoder.finalize()
