"""Peer.Calls: the per-transfer peer calls multiplexed on one stream.

A raw gRPC client plays the other daemon: it links with Peer.Hello, then
resolves and releases a keyed cache on the stream, checking that results
come back matched by call id, errors carry the unary call's LLMStatusCode,
and a keyed pull through two real daemons still drops the key.
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
from hixl_client._proto.hixl.v1 import common_pb2, peer_pb2, peer_pb2_grpc
from hixl_service.peer_api import PROTOCOL_VERSION
from hixl_service.testing import DaemonProcess, start_daemon

from .conftest import Pair, make_pair, options

pytestmark = pytest.mark.asyncio

DESC = CacheDesc(2, [1, 4096], DataType.DT_UINT8)


class StreamPeer:
    """The Calls stream of a daemon, driven by hand."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stub = peer_pb2_grpc.PeerStub(channel)
        self.stream = self.stub.Calls()

    async def send(self, call: peer_pb2.PeerCall) -> None:
        await self.stream.write(call)

    async def results(self, count: int) -> dict[int, peer_pb2.PeerCallResult]:
        found = {}
        for _ in range(count):
            result = await asyncio.wait_for(self.stream.read(), 10)
            found[result.call_id] = result
        return found


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


async def test_calls_resolve_and_release_on_one_stream(prefill_daemon: DaemonProcess,
                                                       prompt: LLMDataDist) -> None:
    for req_id in range(1, 21):
        await prompt.cache_manager.allocate_cache(DESC, [CacheKey(prompt.cluster_id, req_id)])
    async with grpc.aio.insecure_channel(prefill_daemon.peer_address) as channel:
        peer = StreamPeer(channel)
        hello = await peer.stub.Hello(peer_pb2.HelloRequest(
            protocol_version=PROTOCOL_VERSION, daemon_id="test-peer", version="test",
            src_cluster_id=10**9, dst_cluster_id=prompt.cluster_id), timeout=10)
        token = hello.link_token

        # Twenty resolves in flight at once come back matched by call id.
        for req_id in range(1, 21):
            await peer.send(peer_pb2.PeerCall(call_id=100 + req_id, timeout_ms=5000, resolve_cache=(
                peer_pb2.ResolveCacheRequest(link_token=token, ref=common_pb2.CacheRef(
                    key=_key(prompt.cluster_id, req_id))))))
        results = await peer.results(20)
        assert sorted(results) == list(range(101, 121))
        assert all(r.WhichOneof("result") == "resolve_cache" for r in results.values()), results
        assert len({r.resolve_cache.cache_id for r in results.values()}) == 20

        # A release drops the key: a resolve sent after it on the stream misses.
        await peer.send(peer_pb2.PeerCall(call_id=1, release_key=peer_pb2.ReleaseKeyRequest(
            link_token=token, key=_key(0, 5))))
        await peer.send(peer_pb2.PeerCall(call_id=2, resolve_cache=peer_pb2.ResolveCacheRequest(
            link_token=token, ref=common_pb2.CacheRef(key=_key(prompt.cluster_id, 5)))))
        after = await peer.results(2)
        assert after[1].WhichOneof("result") == "release_key"
        assert after[2].error.llm_status == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST

        # Errors carry the unary call's status: a wrong token, no method at all.
        await peer.send(peer_pb2.PeerCall(call_id=3, resolve_cache=peer_pb2.ResolveCacheRequest(
            link_token=token + 1, ref=common_pb2.CacheRef(key=_key(prompt.cluster_id, 6)))))
        await peer.send(peer_pb2.PeerCall(call_id=4))
        errors = await peer.results(2)
        assert errors[3].error.llm_status == LLMStatusCode.LLM_NOT_YET_LINK
        assert errors[4].error.llm_status == LLMStatusCode.LLM_PARAM_INVALID
        await peer.stream.done_writing()
        assert await peer.stream.read() is grpc.aio.EOF
        await peer.stub.Unlink(peer_pb2.UnlinkRequest(link_token=token), timeout=10)


async def test_keyed_pulls_release_through_the_stream(pair: Pair) -> None:
    prompt, decoder = pair.prompt, pair.decoder
    dst = await decoder.cache_manager.allocate_cache(DESC)
    for req_id in range(1, 6):
        key = CacheKey(prompt.cluster_id, req_id=req_id)
        await prompt.cache_manager.allocate_cache(DESC, [key])
        await decoder.cache_manager.pull_cache(key, dst)
        with pytest.raises(LLMException) as again:  # the pull dropped the key
            await decoder.cache_manager.pull_cache(key, dst)
        assert again.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST


async def test_open_streams_do_not_hold_a_stopping_daemon(
        next_cluster_id: Callable[[], int]) -> None:
    # A long grace period: a stop that waited for the peer's idle stream would take it all.
    async with start_daemon(server__grace_period_s=60) as prefill, start_daemon() as decode:
        pair = await make_pair(prefill, decode, next_cluster_id)
        key = CacheKey(pair.prompt.cluster_id, req_id=1)
        await pair.prompt.cache_manager.allocate_cache(DESC, [key])
        dst = await pair.decoder.cache_manager.allocate_cache(DESC)
        await pair.decoder.cache_manager.pull_cache(key, dst)  # opens decode's stream to prefill
        await pair.prompt.finalize()
        started = time.monotonic()
        assert await asyncio.to_thread(prefill.stop, 30.0) == 0
        assert time.monotonic() - started < 20.0
        with pytest.raises(LLMException) as gone:  # the stream ended; a new one finds nobody
            await pair.decoder.cache_manager.pull_cache(CacheKey(pair.prompt.cluster_id, 2), dst)
        assert gone.value.status_code in (LLMStatusCode.LLM_LINK_FAILED,
                                          LLMStatusCode.LLM_NOT_YET_LINK)
        await pair.decoder.finalize()
