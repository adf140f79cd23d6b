"""A cluster's own peer listener at its listen_ip_info, as engine connectors link.

Real daemons on 127.0.0.1: a cluster initialized with ``listen_ip_info``
gets a Peer listener there, and another daemon links to that address (not
to the daemon's peer port) and moves bytes over it. The listener goes with
the cluster: finalize, the client's death and a failed init leave the port
free. Token and mtls daemons serve it with their own handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from hixl_client import (
    BlocksCacheKey,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LLMConfig,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
)
from hixl_service.testing import DaemonProcess, unused_port
from hixl_service.testing_credentials import (
    CertificateAuthority,
    mtls_settings,
    token_settings,
    write_token,
)

from .conftest import cluster_info, daemon_process, daemon_status, options

pytestmark = pytest.mark.asyncio

RNG = np.random.default_rng(20)
LARGEST = 2**64 - 1
# 10.1.2.3:26000 packed into one integer, as engine connectors do.
PACKED = 0x0A010203 << 32 | 26000
SETTLE_S = 30.0  # bounded waits for what a daemon does after a client is gone


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind ``host:port`` now (as the daemon would)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
        return True


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        probe.settimeout(5)
        return probe.connect_ex((host, int(port))) == 0


def listen_options(address: str, **option_args: Any) -> dict[str, str]:
    """A cluster's options with listen_ip_info, as the connectors set it."""
    opts = options(pool_bytes=8 * 2**20, **option_args)
    config = LLMConfig()
    config.listen_ip_info = address
    opts.update(config.generate_options())
    return opts


def fill(cache: Any) -> None:
    for i in range(cache.cache_desc.num_tensors):
        view = np.frombuffer(cache.tensor_view(i), dtype=np.uint8)
        view[:] = RNG.integers(0, 256, view.size, dtype=np.uint8)


def blocks_of(cache: Any, tensor: int) -> np.ndarray:
    return np.frombuffer(cache.tensor_view(tensor), dtype=np.uint8).reshape(
        cache.cache_desc.shape[0], -1)


async def cluster_status(daemon: DaemonProcess, cluster_id: int) -> Any:
    status = await daemon_status(daemon.client_target)
    found = [c for c in status.clusters if c.cluster_id == cluster_id]
    return found[0] if found else None


async def wait_until_free(port: int, daemon: DaemonProcess, cluster_id: int) -> None:
    """Bounded: the cluster gone from the daemon and its port free again."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        status = await daemon_status(daemon.client_target)
        gone = all(c.cluster_id != cluster_id for c in status.clusters)
        if gone and port_is_free(port):
            return
        assert time.monotonic() < deadline, f"port {port} or cluster {cluster_id} still held"
        await asyncio.sleep(0.05)


async def pull_and_push_blocks(prompt: LLMDataDist, decoder: LLMDataDist) -> None:
    """pull_blocks by BlocksCacheKey with a fragmented table, then push_blocks: byte-exact."""
    desc = CacheDesc(2, [16, 4096], DataType.DT_UINT8)
    key = BlocksCacheKey(prompt.cluster_id, model_id=1)
    remote = await prompt.cache_manager.allocate_blocks_cache(desc, key)
    local = await decoder.cache_manager.allocate_blocks_cache(
        desc, BlocksCacheKey(decoder.cluster_id, model_id=1))
    fill(remote)
    fill(local)
    src_blocks, dst_blocks = [9, 2, 14, 3, 7], [0, 11, 5, 6, 15]
    await decoder.cache_manager.pull_blocks(key, local, src_blocks, dst_blocks)
    for tensor in range(2):
        np.testing.assert_array_equal(blocks_of(local, tensor)[dst_blocks],
                                      blocks_of(remote, tensor)[src_blocks])
    fill(local)
    await decoder.cache_manager.push_blocks(key, local, [1, 4], [12, 0])
    for tensor in range(2):
        np.testing.assert_array_equal(blocks_of(remote, tensor)[[12, 0]],
                                      blocks_of(local, tensor)[[1, 4]])
    await decoder.cache_manager.deallocate_blocks_cache(local)
    await prompt.cache_manager.deallocate_blocks_cache(remote)


async def pull_by_id(prompt: LLMDataDist, decoder: LLMDataDist) -> None:
    desc = CacheDesc(2, [1, 64 * 1024], DataType.DT_UINT8)
    src = await prompt.cache_manager.allocate_cache(desc)
    fill(src)
    dst = await decoder.cache_manager.allocate_cache(desc)
    await decoder.cache_manager.pull_cache(
        CacheKeyByIdAndIndex(prompt.cluster_id, src.cache_id, 0), dst)
    for tensor in range(2):
        np.testing.assert_array_equal(blocks_of(dst, tensor), blocks_of(src, tensor))
    await decoder.cache_manager.deallocate_cache(dst)
    await prompt.cache_manager.deallocate_cache(src)


async def test_link_to_listen_ip_info_moves_bytes_and_closes_with_the_cluster(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess) -> None:
    port = unused_port()
    address = f"127.0.0.1:{port}"
    prompt = LLMDataDist(LLMRole.PROMPT, LARGEST, daemon=prefill_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, PACKED, daemon=decode_daemon.client_target)
    await decoder.init(options(pool_bytes=8 * 2**20, remote_accessible=True))
    try:
        await prompt.init(listen_options(address, remote_accessible=True))
        try:
            assert listening(address)
            listed = await cluster_status(prefill_daemon, LARGEST)
            assert (listed.listen_address, listed.listen_shared) == (address, False)
            assert address != prefill_daemon.peer_address

            status, results = await decoder.link_clusters([cluster_info(LARGEST, address)],
                                                          timeout=5000)
            assert status == LLMStatusCode.LLM_SUCCESS, results
            assert decoder.link_transports == {LARGEST: "tcp"}
            links = [link for link in (await daemon_status(decode_daemon.client_target)).links
                     if link.local_cluster_id == PACKED]
            assert [(link.remote_cluster_id, link.remote_peer_address) for link in links] == [
                (LARGEST, address)]
            await pull_by_id(prompt, decoder)
            await pull_and_push_blocks(prompt, decoder)

            status, results = await decoder.unlink_clusters([cluster_info(LARGEST, address)],
                                                            timeout=5000)
            assert status == LLMStatusCode.LLM_SUCCESS, results
            inbound = [link for link in (await daemon_status(prefill_daemon.client_target)).links
                       if link.local_cluster_id == LARGEST]
            assert inbound == []
        finally:
            await prompt.finalize()
        # finalize closed the listener: the port is free, and a new init takes it again
        assert port_is_free(port)
        await prompt.init(listen_options(address, remote_accessible=True))
        try:
            status, results = await decoder.link_clusters([cluster_info(LARGEST, address)],
                                                          timeout=5000)
            assert status == LLMStatusCode.LLM_SUCCESS, results
            await pull_by_id(prompt, decoder)
        finally:
            await prompt.finalize()
        assert port_is_free(port)
    finally:
        await decoder.finalize()


async def test_a_link_inside_one_daemon_through_the_listener(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    address = f"127.0.0.1:{unused_port()}"
    prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                          daemon=prefill_daemon.client_target)
    await prompt.init(listen_options(address, remote_accessible=True))
    await decoder.init(options(pool_bytes=8 * 2**20, remote_accessible=True))
    try:
        status, results = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, results
        assert decoder.link_transports == {prompt.cluster_id: "local"}
        await pull_and_push_blocks(prompt, decoder)
    finally:
        await decoder.finalize()
        await prompt.finalize()


async def test_the_daemons_own_peer_address_is_shared(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    """listen_ip_info naming the daemon's peer port: reached there, as before."""
    prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode_daemon.client_target)
    await prompt.init(listen_options(prefill_daemon.peer_address))
    await decoder.init(options(pool_bytes=8 * 2**20))
    try:
        listed = await cluster_status(prefill_daemon, prompt.cluster_id)
        assert (listed.listen_address, listed.listen_shared) == (prefill_daemon.peer_address,
                                                                 True)
        status, results = await decoder.link_clusters(
            [cluster_info(prompt.cluster_id, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, results
        desc = CacheDesc(1, [1, 4096], DataType.DT_UINT8)
        src = await prompt.cache_manager.allocate_cache(
            desc, [CacheKey(prompt.cluster_id, req_id=1)])
        fill(src)
        dst = await decoder.cache_manager.allocate_cache(desc)
        await decoder.cache_manager.pull_cache(CacheKey(prompt.cluster_id, req_id=1), dst)
        np.testing.assert_array_equal(blocks_of(dst, 0), blocks_of(src, 0))
    finally:
        await decoder.finalize()
        await prompt.finalize()
    assert listening(prefill_daemon.peer_address)  # the daemon's port stays


async def test_a_listener_serves_only_its_cluster(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    address = f"127.0.0.1:{unused_port()}"
    prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    other = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=decode_daemon.client_target)
    await prompt.init(listen_options(address))
    await other.init(options(pool_bytes=2**20))
    await decoder.init(options(pool_bytes=2**20))
    try:
        # The other cluster lives on the same daemon, but not at this address.
        status, results = await decoder.link_clusters([cluster_info(other.cluster_id, address)],
                                                      timeout=5000)
        assert results == [LLMStatusCode.LLM_PARAM_INVALID], results
        # ... and is reached on the daemon's port, as before.
        status, results = await decoder.link_clusters(
            [cluster_info(other.cluster_id, prefill_daemon.peer_address)], timeout=5000)
        assert status == LLMStatusCode.LLM_SUCCESS, results
    finally:
        await decoder.finalize()
        await other.finalize()
        await prompt.finalize()


async def test_a_taken_port_fails_init_and_leaves_nothing(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        address = f"127.0.0.1:{squatter.getsockname()[1]}"
        cluster_id = next_cluster_id()
        dd = LLMDataDist(LLMRole.PROMPT, cluster_id, daemon=prefill_daemon.client_target)
        with pytest.raises(LLMException, match="already in use") as raised:
            await dd.init(listen_options(address))
        assert raised.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
        assert address in str(raised.value)
        assert not dd.is_initialized
    status = await daemon_status(prefill_daemon.client_target)
    assert all(c.cluster_id != cluster_id for c in status.clusters)
    assert all(p.cluster_id != cluster_id for p in status.pools)
    # The id and the address are free for a clean init.
    await dd.init(listen_options(address))
    try:
        # Two clusters cannot listen at one address.
        second = LLMDataDist(LLMRole.PROMPT, next_cluster_id(),
                             daemon=prefill_daemon.client_target)
        with pytest.raises(LLMException, match="already in use"):
            await second.init(listen_options(address))
        # Nor at the daemon's data port.
        data = LLMDataDist(LLMRole.PROMPT, next_cluster_id(),
                           daemon=prefill_daemon.client_target)
        with pytest.raises(LLMException, match="already in use"):
            await data.init(listen_options(prefill_daemon.data_address))
    finally:
        await dd.finalize()


@pytest.mark.parametrize(("listen_ip_info", "message"), [
    ("127.0.0.1:0", "1..65535"),
    ("127.0.0.1:65536", "1..65535"),
    ("198.51.100.7:{port}", "not an address of this host"),
    ("0.0.0.0:{port}", "wildcard"),
    ("localhost:{port}", "not an IP address"),
])
async def test_bad_listen_ip_info_is_refused_at_init(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int],
        listen_ip_info: str, message: str) -> None:
    dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    with pytest.raises(LLMException, match=message) as raised:
        await dd.init(listen_options(listen_ip_info.format(port=unused_port())))
    assert raised.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    status = await daemon_status(prefill_daemon.client_target)
    assert all(c.cluster_id != dd.cluster_id for c in status.clusters)


CLIENT_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    from hixl_client import LLMConfig, LLMDataDist, LLMRole

    async def main():
        config = LLMConfig()
        config.enable_cache_manager = True
        config.mem_pool_cfg = json.dumps({"memory_size": 2**20})
        config.listen_ip_info = sys.argv[3]
        dd = LLMDataDist(LLMRole.PROMPT, int(sys.argv[2]), daemon=sys.argv[1])
        await dd.init(config.generate_options())
        print("ready", flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
""")


async def test_a_killed_client_closes_its_listener(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    port = unused_port()
    cluster_id = next_cluster_id()
    with subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, prefill_daemon.client_target,
                           str(cluster_id), f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as client:
        assert client.stdout is not None and client.stderr is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(client.stdout.readline), SETTLE_S)
            assert line.strip() == b"ready", client.stderr.read()
            assert not port_is_free(port)
        finally:
            client.kill()
            client.wait()
    await wait_until_free(port, prefill_daemon, cluster_id)


async def test_a_stopping_daemon_closes_the_listeners(
        next_cluster_id: Callable[[], int]) -> None:
    port = unused_port()
    with daemon_process() as daemon:
        dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=daemon.client_target)
        await dd.init(listen_options(f"127.0.0.1:{port}"))
        assert not port_is_free(port)
        assert await asyncio.to_thread(daemon.stop) == 0
    assert port_is_free(port)


def non_loopback_address() -> str | None:
    """An address of this host off loopback, if it has one."""
    for probe_target in ("192.0.2.1", "10.255.255.255", "198.51.100.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            with contextlib.suppress(OSError):
                probe.connect((probe_target, 9))
                host = str(probe.getsockname()[0])
                if not host.startswith("127.") and host != "0.0.0.0":
                    return host
    return None


async def test_an_unauthenticated_listener_off_loopback_needs_insecure(
        prefill_daemon: DaemonProcess, next_cluster_id: Callable[[], int]) -> None:
    host = non_loopback_address()
    if host is None:
        pytest.skip("this host has no address off loopback")
    address = f"{host}:{unused_port()}"
    dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=prefill_daemon.client_target)
    with pytest.raises(LLMException, match="security.insecure") as raised:
        await dd.init(listen_options(address))
    assert raised.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    assert address in str(raised.value)
    with daemon_process(security__insecure=True) as insecure:
        dd = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=insecure.client_target)
        await dd.init(listen_options(address))
        try:
            assert listening(address)
        finally:
            await dd.finalize()


# -- token and mtls through the listener --------------------------------------------

DECODE_ID = "spiffe://hixl.test/decode"
PREFILL_ID = "spiffe://hixl.test/prefill"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority(tmp_path_factory.mktemp("listen-ca"))


@pytest.fixture(scope="module", params=["token", "mtls"])
def secured(request: pytest.FixtureRequest, ca: CertificateAuthority,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, ...]]:
    """An owner and a linker that authenticate each other, and a linker that does not."""
    if request.param == "token":
        token = write_token(tmp_path_factory.mktemp("listen-token") / "secret")
        owner, linker = token_settings(token), token_settings(token)
        stranger = token_settings(write_token(tmp_path_factory.mktemp("other") / "secret"))
    else:
        owner = mtls_settings(ca.issue("listen-prefill", spiffe=PREFILL_ID))
        linker = mtls_settings(ca.issue("listen-decode", spiffe=DECODE_ID))
        stranger_ca = CertificateAuthority(tmp_path_factory.mktemp("stranger-ca"))
        stranger = mtls_settings(stranger_ca.issue("stranger"))
    with daemon_process(security=owner) as a, daemon_process(security=linker) as b, \
            daemon_process(security=stranger) as c, daemon_process() as d:
        yield a, b, c, d


async def test_token_and_mtls_through_the_listener(
        secured: tuple[DaemonProcess, ...], next_cluster_id: Callable[[], int]) -> None:
    owner, linker, stranger, plain = secured
    address = f"127.0.0.1:{unused_port()}"
    prompt = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=owner.client_target)
    await prompt.init(listen_options(address, remote_accessible=True))
    try:
        # Linkers without the secret or the CA, or with no credentials at all, are refused.
        for refused in (stranger, plain):
            outsider = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                                   daemon=refused.client_target)
            await outsider.init(options(pool_bytes=2**20))
            try:
                status, results = await outsider.link_clusters(
                    [cluster_info(prompt.cluster_id, address)], timeout=5000)
                assert results == [LLMStatusCode.LLM_LINK_FAILED], (refused, results)
            finally:
                await outsider.finalize()
        inbound = [link for link in (await daemon_status(owner.client_target)).links
                   if link.local_cluster_id == prompt.cluster_id]
        assert inbound == []

        decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=linker.client_target)
        await decoder.init(options(pool_bytes=8 * 2**20, remote_accessible=True))
        try:
            status, results = await decoder.link_clusters(
                [cluster_info(prompt.cluster_id, address)], timeout=5000)
            assert status == LLMStatusCode.LLM_SUCCESS, results
            await pull_and_push_blocks(prompt, decoder)
        finally:
            await decoder.finalize()
    finally:
        await prompt.finalize()


async def test_allowed_peers_hold_at_the_listener(
        ca: CertificateAuthority, next_cluster_id: Callable[[], int]) -> None:
    """mtls: an identity outside allowed_peers is refused there; a read-only one reads."""
    prompt_id = next_cluster_id()
    allowed = [{"identity": DECODE_ID, "clusters": [prompt_id], "write": False}]
    owner_settings = mtls_settings(ca.issue("listen-owner", spiffe=PREFILL_ID),
                                   allowed_peers=allowed)
    address = f"127.0.0.1:{unused_port()}"
    with daemon_process(security=owner_settings) as owner, \
            daemon_process(security=mtls_settings(ca.issue("listen-reader", spiffe=DECODE_ID))
                           ) as reader, \
            daemon_process(security=mtls_settings(ca.issue("listen-other",
                                                           spiffe="spiffe://hixl.test/x"))
                           ) as other:
        prompt = LLMDataDist(LLMRole.PROMPT, prompt_id, daemon=owner.client_target)
        await prompt.init(listen_options(address, remote_accessible=True))
        try:
            outsider = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=other.client_target)
            await outsider.init(options(pool_bytes=2**20))
            try:
                _, results = await outsider.link_clusters([cluster_info(prompt_id, address)],
                                                          timeout=5000)
                assert results == [LLMStatusCode.LLM_LINK_FAILED]
            finally:
                await outsider.finalize()
            decoder = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                                  daemon=reader.client_target)
            await decoder.init(options(pool_bytes=8 * 2**20, remote_accessible=True))
            try:
                status, results = await decoder.link_clusters(
                    [cluster_info(prompt_id, address)], timeout=5000)
                assert status == LLMStatusCode.LLM_SUCCESS, results
                await pull_by_id(prompt, decoder)
                desc = CacheDesc(2, [4, 4096], DataType.DT_UINT8)
                key = BlocksCacheKey(prompt_id, model_id=2)
                remote = await prompt.cache_manager.allocate_blocks_cache(desc, key)
                fill(remote)
                before = [blocks_of(remote, i).copy() for i in range(2)]
                local = await decoder.cache_manager.allocate_blocks_cache(desc)
                fill(local)
                with pytest.raises(LLMException):
                    await decoder.cache_manager.push_blocks(key, local, [0, 1], [2, 3])
                for i in range(2):
                    np.testing.assert_array_equal(blocks_of(remote, i), before[i])
            finally:
                await decoder.finalize()
        finally:
            await prompt.finalize()


# -- the blocking facade -------------------------------------------------------------

FACADE_PRELUDE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from hixl_client.sync import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo,
                                  LLMConfig, LLMDataDist, LLMRole, LLMStatusCode, set_daemon)

    DESC = CacheDesc(2, [32, 2048], DataType.DT_UINT8)

    def options(listen=None):
        config = LLMConfig()
        config.enable_cache_manager = True
        config.mem_pool_cfg = json.dumps({"memory_size": 8 * 2**20})
        if listen:
            config.listen_ip_info = listen
        return config.generate_options()

    def pattern(tensor):
        block = np.arange(32, dtype=np.uint64)[:, None] * 131 + np.arange(2048)
        return ((block * (tensor + 3)) % 251).astype(np.uint8)
""")

# argv: daemon, cluster id, listen_ip_info
FACADE_PREFILL = FACADE_PRELUDE + textwrap.dedent("""
    set_daemon(sys.argv[1])
    dd = LLMDataDist(LLMRole.PROMPT, int(sys.argv[2]))
    dd.init(options(sys.argv[3]))
    cache = dd.cache_manager.allocate_blocks_cache(DESC, BlocksCacheKey(dd.cluster_id, 0))
    for tensor in range(2):
        cache.numpy(tensor)[...] = pattern(tensor)
    print("ready", flush=True)
    sys.stdin.readline()
    dd.finalize()
    print("finalized", flush=True)
""")

# argv: daemon, cluster id, the prefill's cluster id, its listen_ip_info
FACADE_DECODE = FACADE_PRELUDE + textwrap.dedent("""
    set_daemon(sys.argv[1])
    prefill = int(sys.argv[3])
    dd = LLMDataDist(LLMRole.DECODER, int(sys.argv[2]))
    dd.init(options())
    host, port = sys.argv[4].rsplit(":", 1)
    info = LLMClusterInfo()
    info.remote_cluster_id = prefill
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(host, int(port))
    status, per_cluster = dd.link_clusters([info], timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS, per_cluster
    dst = dd.cache_manager.allocate_blocks_cache(DESC)
    src_blocks, dst_blocks = [30, 1, 17, 4, 22, 9], [3, 28, 0, 14, 7, 19]
    dd.cache_manager.pull_blocks(BlocksCacheKey(prefill, 0), dst, src_blocks, dst_blocks,
                                 src_layer_range=range(1), dst_layer_range=range(1))
    for tensor in range(2):
        assert (dst.numpy(tensor)[dst_blocks] == pattern(tensor)[src_blocks]).all(), tensor
    status, per_cluster = dd.unlink_clusters([info], timeout=5000, force=True)
    assert status == LLMStatusCode.LLM_SUCCESS, per_cluster
    dd.finalize()
    print("pulled", flush=True)
""")


async def test_the_blocking_facade_links_to_listen_ip_info(
        prefill_daemon: DaemonProcess, decode_daemon: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    port = unused_port()
    address = f"127.0.0.1:{port}"
    prefill_id, decode_id = next_cluster_id(), next_cluster_id()
    with subprocess.Popen([sys.executable, "-c", FACADE_PREFILL, prefill_daemon.client_target,
                           str(prefill_id), address], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as prefill:
        assert prefill.stdin is not None and prefill.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(prefill.stdout.readline), SETTLE_S)
            assert line.strip() == b"ready", prefill.communicate(timeout=SETTLE_S)
            decode = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-c", FACADE_DECODE,
                                 decode_daemon.client_target, str(decode_id), str(prefill_id),
                                 address], capture_output=True, timeout=SETTLE_S)
            assert decode.returncode == 0, decode.stderr.decode()
            assert decode.stdout.strip() == b"pulled"
            out, err = await asyncio.to_thread(prefill.communicate, b"\n", SETTLE_S)
            assert prefill.returncode == 0, err.decode()
            assert out.strip().endswith(b"finalized")
        finally:
            if prefill.poll() is None:
                prefill.kill()
    assert port_is_free(port)
