"""An attacker with no credentials against real daemons, speaking the raw protocols.

This process holds no secret and no certificate the victims trust (except
where a test plays the honest peer first, to have something to replay). It
calls the Peer service through bare gRPC stubs and speaks the native data
plane's frames by hand (``tests.native._native_support``), as the issue's
attacker did: every door it knocked on is now shut, with a clear refusal.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest
import pytest_asyncio

from hixl_client import CacheDesc, CacheKey, DataType, LLMDataDist, LLMRole, LLMStatusCode
from hixl_client.keys import PLACEHOLDER_ID
from hixl_service.config import LimitsConfig, SecurityConfig
from hixl_service.testing import DaemonProcess
from hixl_service.testing_credentials import (
    CertificateAuthority,
    mtls_settings,
    token_settings,
    write_token,
)
from hixl_service.trust import HelloFacts, Trust, new_client_nonce
from hixl_wire._proto.hixl.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    peer_pb2,
    peer_pb2_grpc,
)
from hixl_wire.defaults import SESSION_METADATA_KEY
from hixl_wire.status import STATUS_METADATA_KEY
from tests.native._native_support import OP_READ, RawClient, recv_exact

from .conftest import daemon_process, options

pytestmark = pytest.mark.asyncio

hn = pytest.importorskip("hixl_native")


def llm_status(err: grpc.aio.AioRpcError) -> int:
    for key, value in err.trailing_metadata() or ():
        if key == STATUS_METADATA_KEY:
            return int(value)
    return -1


async def refused(call: Any, code: grpc.StatusCode, needle: str = "") -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call
    err = failed.value
    assert err.code() == code, err
    assert needle in (err.details() or ""), err.details()
    return err


def hello(dst: int, **fields: Any) -> peer_pb2.HelloRequest:
    return peer_pb2.HelloRequest(protocol_version=1, daemon_id="attacker", version="0",
                                 src_cluster_id=99, dst_cluster_id=dst, backend="host",
                                 **fields)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_token(tmp_path_factory.mktemp("secret") / "token")


@pytest.fixture(scope="module")
def victim(token_file: Path) -> Iterator[DaemonProcess]:
    with daemon_process(security=token_settings(token_file),
                        limits={"max_links_per_peer": 64}) as daemon:
        yield daemon


@pytest_asyncio.fixture
async def cache_owner(victim: DaemonProcess,
                      next_cluster_id: Callable[[], int]) -> AsyncIterator[tuple[LLMDataDist, Any]]:
    """A cluster of the victim holding a keyed 4 KiB cache of known bytes."""
    owner = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=victim.client_target)
    await owner.init(options(pool_bytes=2**20))
    cache = await owner.cache_manager.allocate_cache(
        CacheDesc(1, [1, 4096], DataType.DT_UINT8), [CacheKey(owner.cluster_id, req_id=1)])
    np.frombuffer(cache.tensor_view(0), np.uint8)[:] = 0x42
    yield owner, cache
    await owner.finalize()


async def test_hello_without_the_secret_is_refused(
        victim: DaemonProcess, cache_owner: tuple[LLMDataDist, Any]) -> None:
    owner, _ = cache_owner
    async with grpc.aio.insecure_channel(victim.peer_address) as channel:
        peer = peer_pb2_grpc.PeerStub(channel)
        err = await refused(peer.Hello(hello(owner.cluster_id), timeout=10),
                            grpc.StatusCode.UNAUTHENTICATED, "token authentication")
        assert llm_status(err) == LLMStatusCode.LLM_LINK_FAILED
        challenge = await peer.Challenge(peer_pb2.ChallengeRequest(), timeout=10)
        forged = hello(owner.cluster_id, challenge=challenge.nonce,
                       client_nonce=new_client_nonce(), proof=secrets.token_bytes(32))
        await refused(peer.Hello(forged, timeout=10), grpc.StatusCode.UNAUTHENTICATED,
                      "does not match")
        # a made-up challenge is refused too
        made_up = hello(owner.cluster_id, challenge=secrets.token_bytes(32),
                        client_nonce=new_client_nonce(), proof=secrets.token_bytes(32))
        await refused(peer.Hello(made_up, timeout=10), grpc.StatusCode.UNAUTHENTICATED,
                      "no open challenge")
        # without a link token nothing resolves
        ref = common_pb2.CacheRef(key=common_pb2.CacheKey(cluster_id=owner.cluster_id, req_id=1))
        await refused(peer.ResolveCache(peer_pb2.ResolveCacheRequest(link_token=1, ref=ref),
                                        timeout=10), grpc.StatusCode.FAILED_PRECONDITION)


async def test_a_replayed_hello_and_a_stolen_token_are_refused(
        victim: DaemonProcess, token_file: Path,
        cache_owner: tuple[LLMDataDist, Any]) -> None:
    owner, _ = cache_owner
    honest = Trust(SecurityConfig(mode="token", token_file=token_file), LimitsConfig())
    async with grpc.aio.insecure_channel(victim.peer_address) as channel:
        peer = peer_pb2_grpc.PeerStub(channel)
        # The honest peer links; the attacker records everything on the wire.
        challenge = await peer.Challenge(peer_pb2.ChallengeRequest(), timeout=10)
        facts = HelloFacts(challenge.nonce, new_client_nonce(), "honest", 98, owner.cluster_id)
        request = peer_pb2.HelloRequest(
            protocol_version=1, daemon_id="honest", version="0", src_cluster_id=98,
            dst_cluster_id=owner.cluster_id, backend="host", challenge=facts.challenge,
            client_nonce=facts.client_nonce, proof=honest.hello_proof(facts))
        reply = await peer.Hello(request, timeout=10)
        assert reply.link_key == b""  # token mode: the key never crosses the wire
        key = honest.accept_welcome(facts, reply.link_token, reply.server_proof)
        # Replaying the recorded Hello gets nothing.
        await refused(peer.Hello(request, timeout=10), grpc.StatusCode.UNAUTHENTICATED,
                      "no open challenge")
        ref = common_pb2.CacheRef(key=common_pb2.CacheKey(
            cluster_id=owner.cluster_id, req_id=1, prefix_id=PLACEHOLDER_ID))
        found = await peer.ResolveCache(
            peer_pb2.ResolveCacheRequest(link_token=reply.link_token, ref=ref), timeout=10)
        ranges = [(found.region_id, found.tensor_offsets[0], 4096)]
        # With the stolen token but not the key, the data plane refuses at connect...
        for proof in (None, secrets.token_bytes(32)):
            thief = RawClient(reply.data_port, reply.link_token, key=secrets.token_bytes(32))
            try:
                assert thief.welcome(proof) == hn.E_REFUSED
                assert thief.at_eof()
            finally:
                thief.close()
        # ...and replaying the honest connection's proof on a new connection too.
        first = RawClient(reply.data_port, reply.link_token, key=key)
        replay = RawClient(reply.data_port, reply.link_token)
        try:
            assert first.welcome() == hn.OK
            first.request(OP_READ, 1, ranges)
            assert first.reply() == (1, hn.OK)
            assert recv_exact(first.sock, 4096) == b"\x42" * 4096  # the honest peer reads
            assert replay.welcome(first.proof) == hn.E_REFUSED
        finally:
            first.close()
            replay.close()
        await peer.Unlink(peer_pb2.UnlinkRequest(link_token=reply.link_token), timeout=10)


async def test_admin_is_not_served_on_the_peer_port(victim: DaemonProcess) -> None:
    async with grpc.aio.insecure_channel(victim.peer_address) as channel:
        await refused(admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.GetStatusRequest(),
                                                                  timeout=10),
                      grpc.StatusCode.UNIMPLEMENTED)
    async with grpc.aio.insecure_channel(victim.client_target) as channel:
        status = await admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.GetStatusRequest(),
                                                                   timeout=10)
        assert status.daemon_id == victim.daemon_id


@pytest.mark.parametrize("session", [None, "0" * 32, "another-daemons-session"])
async def test_calls_without_a_valid_session_are_unauthenticated(
        victim: DaemonProcess, session: str | None) -> None:
    metadata = () if session is None else ((SESSION_METADATA_KEY, session),)
    async with grpc.aio.insecure_channel(victim.client_target) as channel:
        client = client_pb2_grpc.ClientStub(channel)
        err = await refused(client.Finalize(client_pb2.FinalizeRequest(), timeout=10,
                                            metadata=metadata),
                            grpc.StatusCode.UNAUTHENTICATED, "session")
        assert llm_status(err) == LLMStatusCode.LLM_FAILED


@pytest.mark.parametrize("limits,hit", [
    ({"max_inbound_links": 5, "max_links_per_peer": 100}, "limits.max_inbound_links = 5"),
    ({"max_inbound_links": 100, "max_links_per_peer": 5}, "limits.max_links_per_peer = 5"),
])
async def test_a_hello_flood_is_capped(next_cluster_id: Callable[[], int],
                                       limits: dict[str, int], hit: str) -> None:
    with daemon_process(limits=limits) as daemon:
        owner = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=daemon.client_target)
        await owner.init(options(pool_bytes=2**20))
        try:
            async with grpc.aio.insecure_channel(daemon.peer_address) as channel:
                peer = peer_pb2_grpc.PeerStub(channel)
                for _ in range(5):
                    await peer.Hello(hello(owner.cluster_id), timeout=10)
                for _ in range(20):
                    err = await refused(peer.Hello(hello(owner.cluster_id), timeout=10),
                                        grpc.StatusCode.RESOURCE_EXHAUSTED, hit)
                    assert llm_status(err) == LLMStatusCode.LLM_LINK_FAILED
        finally:
            await owner.finalize()


async def test_the_hello_rate_is_limited(next_cluster_id: Callable[[], int]) -> None:
    with daemon_process(limits={"hello_rate": 0.001, "hello_burst": 3}) as daemon:
        async with grpc.aio.insecure_channel(daemon.peer_address) as channel:
            peer = peer_pb2_grpc.PeerStub(channel)
            for _ in range(3):  # the burst: refused for the unknown cluster, but counted
                await refused(peer.Hello(hello(12345), timeout=10), grpc.StatusCode.UNAVAILABLE)
            err = await refused(peer.Hello(hello(12345), timeout=10),
                                grpc.StatusCode.RESOURCE_EXHAUSTED, "limits.hello_rate")
            assert llm_status(err) == LLMStatusCode.LLM_LINK_FAILED


async def test_data_connections_are_limited(next_cluster_id: Callable[[], int]) -> None:
    with daemon_process(limits={"max_data_connections": 2}) as owner_daemon, \
            daemon_process(transfer={"streams_per_link": 4}) as linking:
        owner = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=owner_daemon.client_target)
        source = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=linking.client_target)
        await owner.init(options(pool_bytes=2**20))
        await source.init(options(pool_bytes=2**20))
        try:
            from tests.clusters import cluster_info

            _, results = await source.link_clusters(
                [cluster_info(owner.cluster_id, owner_daemon.peer_address)], timeout=5000)
            assert results == [LLMStatusCode.LLM_LINK_FAILED]
            assert "limit of concurrent data connections" in linking.log_tail(20000)
        finally:
            await source.finalize()
            await owner.finalize()


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority(tmp_path_factory.mktemp("attacker-ca"))


async def test_an_mtls_peer_port_refuses_callers_without_a_trusted_certificate(
        ca: CertificateAuthority, tmp_path: Path) -> None:
    allowed = [{"identity": "spiffe://hixl.test/friend", "clusters": [], "write": True}]
    with daemon_process(security=mtls_settings(ca.issue("victim"), allowed_peers=allowed)
                        ) as daemon:
        plain = grpc.aio.insecure_channel(daemon.peer_address)
        async with plain:
            await refused(peer_pb2_grpc.PeerStub(plain).Hello(hello(1), timeout=5),
                          grpc.StatusCode.UNAVAILABLE)
        trusted_ca = ca.ca_path.read_bytes()
        anonymous = grpc.aio.secure_channel(daemon.peer_address,
                                            grpc.ssl_channel_credentials(trusted_ca))
        async with anonymous:
            await refused(peer_pb2_grpc.PeerStub(anonymous).Hello(hello(1), timeout=5),
                          grpc.StatusCode.UNAVAILABLE)
        stranger = CertificateAuthority(tmp_path / "stranger").issue("mallory")
        forged = grpc.aio.secure_channel(daemon.peer_address, grpc.ssl_channel_credentials(
            trusted_ca, stranger.key.read_bytes(), stranger.cert.read_bytes()))
        async with forged:
            await refused(peer_pb2_grpc.PeerStub(forged).Hello(hello(1), timeout=5),
                          grpc.StatusCode.UNAVAILABLE)
        outsider = ca.issue("outsider", spiffe="spiffe://hixl.test/outsider")
        known = grpc.aio.secure_channel(daemon.peer_address, grpc.ssl_channel_credentials(
            trusted_ca, outsider.key.read_bytes(), outsider.cert.read_bytes()))
        async with known:
            err = await refused(peer_pb2_grpc.PeerStub(known).Hello(hello(1), timeout=5),
                                grpc.StatusCode.PERMISSION_DENIED,
                                "'spiffe://hixl.test/outsider' is not in security.allowed_peers")
            assert llm_status(err) == LLMStatusCode.LLM_LINK_FAILED
