"""The daemon's hccl backend under bad input and failures, against the CANN double.

Every case ends with a clear start-up error or a clear `LLMException` within
the configured timeouts, never a hang, and where the daemon keeps running a
later transfer proves that it still serves. Faults are armed in a daemon
through ``HIXL_DOUBLE_FAULTS`` (read once, at its start), so a daemon carrying
one is started for its test alone; the fault-free daemons are shared by the
module.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hixl_client import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LayerSynchronizer,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    TransferWithCacheKeyConfig,
)
from hixl_service.testing import DaemonProcess

from ..integration.conftest import daemon_status
from .daemons import TensorIO, cluster_info, daemon_process, options

if TYPE_CHECKING:
    from hixl_native._ascend import AscendRuntime

MIB = 1 << 20
POOL = 4 * MIB  # per cluster
DEVICE_BUDGET = 24 * MIB  # ascend.device_pool_max_bytes of the shared daemons
SYNC_MS = 1500  # sync_kv_timeout of the transfers here
SLACK_S = 10.0  # a failure must be reported well within this
DESC = CacheDesc(2, [1, 4096], DataType.DT_FLOAT16)  # 2 tensors of 8 KiB (one slot), on device
S = LLMStatusCode
io = TensorIO()


# -- daemons ---------------------------------------------------------------------


def hccl_daemon(double_dir: Path, faults: str = "", mem_bytes: int = 0, one_sided: bool = True,
                **overrides: Any) -> DaemonProcess:
    """An hccl daemon (not started), with faults armed and a device size if given;
    without ``one_sided`` its CANN answers the one-sided API with HCCL_E_NOT_SUPPORT."""
    env = {"HIXL_DOUBLE_FAULTS": faults} if faults else {}
    if not one_sided:
        env["HIXL_DOUBLE_ONE_SIDED"] = "0"
    if mem_bytes:
        env["HIXL_DOUBLE_DEVICE_MEM_BYTES"] = str(mem_bytes)
    settings: dict[str, Any] = {"ascend__device_pool_max_bytes": DEVICE_BUDGET}
    settings.update(overrides)
    return daemon_process("hccl", double_dir, env=env, **settings)


@pytest.fixture(scope="module")
def prefill(double_dir: Path) -> Iterator[DaemonProcess]:
    """A fault-free hccl daemon for prompt clusters, serving device 0 only."""
    with hccl_daemon(double_dir, ascend__devices=[0]) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def decode(double_dir: Path) -> Iterator[DaemonProcess]:
    """A fault-free hccl daemon for decoder clusters (the linking side), on device 1."""
    with hccl_daemon(double_dir, ascend__devices=[1]) as daemon:
        yield daemon


def start_failure(daemon: DaemonProcess) -> str:
    """Start a daemon that must refuse to start; return its log."""
    try:
        with pytest.raises(RuntimeError, match="exited with code 2") as info:
            daemon.start(timeout=10)
        assert daemon.returncode == 2
        return str(info.value)
    finally:
        daemon.close()


async def logged(daemon: DaemonProcess, text: str, within_s: float = 5.0) -> None:
    """Wait until the daemon's log holds ``text`` (it may log after the peer saw a failure)."""
    deadline = time.monotonic() + within_s
    while text not in daemon.log_tail(20_000):
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{daemon.log_tail()}"
        await asyncio.sleep(0.05)


# -- clusters and caches ---------------------------------------------------------


async def cluster(daemon: DaemonProcess, role: LLMRole, cluster_id: int, device_id: int = 0,
                  **option_args: Any) -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id, daemon=daemon.client_target)
    await datadist.init(options(device_id, POOL, sync_kv_timeout=SYNC_MS, **option_args))
    return datadist


@asynccontextmanager
async def linked(prompt_daemon: DaemonProcess, decoder_daemon: DaemonProcess,
                 ids: Callable[[], int], **option_args: Any
                 ) -> AsyncIterator[tuple[LLMDataDist, LLMDataDist]]:
    """A prompt cluster and a decoder cluster linked to it; both finalized on exit."""
    prompt = await cluster(prompt_daemon, LLMRole.PROMPT, ids(), 0, **option_args)
    try:
        decoder = await cluster(decoder_daemon, LLMRole.DECODER, ids(), 1, **option_args)
        try:
            status, results = await decoder.link_clusters(
                [cluster_info(prompt.cluster_id, prompt_daemon.peer_address)], timeout=5000)
            assert (status, results) == (S.LLM_SUCCESS, [S.LLM_SUCCESS])
            yield prompt, decoder
        finally:
            await decoder.finalize()
    finally:
        await prompt.finalize()


def fill(cache: Cache) -> list[bytes]:
    """Write distinct random bytes into every tensor of a device cache."""
    data = [os.urandom(cache.cache_desc.size) for _ in range(cache.cache_desc.num_tensors)]
    for index, chunk in enumerate(data):
        io.write(cache, index, chunk)
    return data


def contents(cache: Cache) -> list[bytes]:
    return [io.read(cache, index) for index in range(cache.cache_desc.num_tensors)]


async def source(prompt: LLMDataDist, req_id: int) -> tuple[CacheKey, list[bytes]]:
    """A filled device cache on the prompt side under a request key."""
    key = CacheKey(prompt.cluster_id, req_id=req_id)
    cache = await prompt.cache_manager.allocate_cache(DESC, [key])
    return key, fill(cache)


async def pull_ok(prompt: LLMDataDist, decoder: LLMDataDist, req_id: int) -> None:
    """A pull over the link moves the bytes exactly."""
    key, data = await source(prompt, req_id)
    dst = await decoder.cache_manager.allocate_cache(DESC)
    await decoder.cache_manager.pull_cache(key, dst)
    assert contents(dst) == data
    await decoder.cache_manager.deallocate_cache(dst)


async def failed_pull(decoder: LLMDataDist, key: CacheKey, dst: Cache) -> tuple[LLMException,
                                                                               float]:
    """The exception a pull that must fail raised, and the seconds it took."""
    started = time.monotonic()
    with pytest.raises(LLMException) as info:
        await decoder.cache_manager.pull_cache(key, dst)
    return info.value, time.monotonic() - started


async def no_cluster(daemon: DaemonProcess, cluster_id: int) -> None:
    """A failed init left nothing behind: no cluster, no pool, no session."""
    status = await daemon_status(daemon.client_target)
    assert cluster_id not in {c.cluster_id for c in status.clusters}
    assert cluster_id not in {p.cluster_id for p in status.pools}
    assert not status.sessions, status.sessions


async def outbound_link(daemon: DaemonProcess, local_cluster_id: int) -> Any:
    status = await daemon_status(daemon.client_target)
    (link,) = [link for link in status.links
               if link.local_cluster_id == local_cluster_id and link.direction == "outbound"]
    return link


# -- 1, 2: start-up ----------------------------------------------------------------


def test_cann_path_without_libraries_exits_2(double_dir: Path, tmp_path: Path) -> None:
    empty = tmp_path / "no-cann"
    empty.mkdir()
    log = start_failure(hccl_daemon(double_dir, ascend__cann_path=str(empty)))
    assert f"HCCL backend unavailable: {empty}" in log, log
    assert "libascendcl.so" in log, log


def test_missing_device_exits_2_naming_it(double_dir: Path) -> None:
    log = start_failure(hccl_daemon(double_dir, ascend__devices=[5]))
    assert "HCCL backend unavailable: ascend.devices names device(s) [5]" in log, log
    assert "has 2 (ids 0..1)" in log, log


# -- 3: a device the daemon does not serve --------------------------------------------


@pytest.mark.asyncio
async def test_cluster_on_a_device_not_served_is_refused(
        runtime: AscendRuntime, prefill: DaemonProcess, decode: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    # Device 1 exists (the double has 2), but this daemon opened device 0 only.
    cluster_id = next_cluster_id()
    datadist = LLMDataDist(LLMRole.PROMPT, cluster_id, daemon=prefill.client_target)
    with pytest.raises(LLMException, match=r"device 1 is not served by this daemon "
                                           r"\(ascend.devices = \[0\]\)") as info:
        await datadist.init(options(1, POOL))
    assert info.value.status_code == S.LLM_PARAM_INVALID
    await no_cluster(prefill, cluster_id)
    await pull_ok_on_fresh_pair(prefill, decode, next_cluster_id)


async def pull_ok_on_fresh_pair(prompt_daemon: DaemonProcess, decoder_daemon: DaemonProcess,
                                ids: Callable[[], int]) -> None:
    async with linked(prompt_daemon, decoder_daemon, ids) as (prompt, decoder):
        await pull_ok(prompt, decoder, 1)


# -- 4: device memory exhausted ------------------------------------------------------


@pytest.mark.asyncio
async def test_pools_and_caches_beyond_the_device_budget(
        runtime: AscendRuntime, prefill: DaemonProcess, decode: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    cluster_id = next_cluster_id()
    datadist = LLMDataDist(LLMRole.PROMPT, cluster_id, daemon=prefill.client_target)
    with pytest.raises(LLMException, match="device_pool_max_bytes") as info:
        await datadist.init(options(0, DEVICE_BUDGET + 2 * MIB))
    assert info.value.status_code == S.LLM_DEVICE_OUT_OF_MEMORY
    await no_cluster(prefill, cluster_id)
    async with linked(prefill, decode, next_cluster_id) as (prompt, decoder):
        too_big = CacheDesc(2, [POOL // 4], DataType.DT_INT32)  # two tensors of a whole pool
        with pytest.raises(LLMException, match="DEVICE pool of cluster .* cannot fit") as info:
            await prompt.cache_manager.allocate_cache(too_big)
        assert info.value.status_code == S.LLM_DEVICE_OUT_OF_MEMORY
        await pull_ok(prompt, decoder, 2)  # the pool and the daemons still serve


@pytest.mark.asyncio
async def test_acl_malloc_failures_are_device_out_of_memory(
        runtime: AscendRuntime, double_dir: Path, prefill: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    # The first aclrtMalloc fails by injection; then the double's devices hold
    # 8 MiB, less than the pool budget lets a cluster ask for.
    small = hccl_daemon(double_dir, faults="aclrtMalloc=fail:207001:1",
                        mem_bytes=8 * MIB)
    with small:
        for pool_bytes in (POOL, 16 * MIB):
            datadist = LLMDataDist(LLMRole.DECODER, next_cluster_id(),
                                   daemon=small.client_target)
            with pytest.raises(LLMException, match="ACL_ERROR_RT_MEMORY_ALLOCATION") as info:
                await datadist.init(options(1, pool_bytes))
            assert info.value.status_code == S.LLM_DEVICE_OUT_OF_MEMORY
            await no_cluster(small, datadist.cluster_id)
        await pull_ok_on_fresh_pair(prefill, small, next_cluster_id)  # it still serves


# -- 5, 6: HCCL failures mid-transfer -------------------------------------------------


LINK_ERROR = "ACL error 507056 (ACL_ERROR_RT_LINK_ERROR)"


@pytest.mark.asyncio
@pytest.mark.parametrize(("fault", "seen_by_decoder", "seen_by_prompt"), [
    # Two-sided (the prompt daemon's CANN refuses the one-sided API, so the link
    # falls back): the prompt side's batch fails on its stream: the decoder's half sees the peer go
    ("exec:HcclBatchSendRecv=fail:507056:1:1", "ACL_ERROR_RT_SUSPECT_REMOTE_ERROR", LINK_ERROR),
    # half the bytes move, then the link is cut
    ("exec:HcclBatchSendRecv=sever:507056:1:1", "ACL_ERROR_RT_SUSPECT_REMOTE_ERROR", LINK_ERROR),
    # HCCL refuses to queue the prompt side's batch: the decoder hears it in the reply
    ("HcclBatchSendRecv=fail:19:1:1", "HCCL error 19 (HCCL_E_NETWORK)", "HCCL_E_NETWORK"),
], ids=["stream-fail", "sever", "queue-fail"])
async def test_hccl_error_mid_transfer_fails_the_pull_and_the_link_recovers(
        runtime: AscendRuntime, double_dir: Path, decode: DaemonProcess, fault: str,
        seen_by_decoder: str, seen_by_prompt: str,
        next_cluster_id: Callable[[], int]) -> None:
    # The prompt daemon's first batch of a transfer (its sends of the pull) fails; the
    # skip of 1 lets the link's warm-up batch (its first operation) through.
    with hccl_daemon(double_dir, faults=fault, one_sided=False) as faulty:
        async with linked(faulty, decode, next_cluster_id) as (prompt, decoder):
            key, data = await source(prompt, 3)
            dst = await decoder.cache_manager.allocate_cache(DESC)
            error, elapsed = await failed_pull(decoder, key, dst)
            assert elapsed < SLACK_S
            message = str(error)
            assert error.status_code in (S.LLM_SUSPECT_REMOTE_ERROR, S.LLM_LINK_FAILED)
            assert "HCCL batch" in message and seen_by_decoder in message, message
            await logged(faulty, seen_by_prompt)  # the daemon that saw the error logs it
            link = await outbound_link(decode, decoder.cluster_id)
            assert (link.transport, link.alive) == ("hccl", False)  # communicator dropped
            await decoder.cache_manager.pull_cache(key, dst)  # the same link, rebuilt
            assert contents(dst) == data
            link = await outbound_link(decode, decoder.cluster_id)
            assert (link.transport, link.alive, link.data_path) == ("hccl", True, "two-sided")
            await pull_ok(prompt, decoder, 4)


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", [
    "exec:HcclBatchGet=fail:507056:1",  # the read fails on the linking side's stream
    "HcclBatchGet=fail:19:1",  # HCCL refuses to queue it
], ids=["stream-fail", "queue-fail"])
async def test_one_sided_error_fails_the_pull_and_the_link_recovers(
        runtime: AscendRuntime, double_dir: Path, prefill: DaemonProcess, fault: str,
        next_cluster_id: Callable[[], int]) -> None:
    # One-sided: only the linking (decoder) daemon queues anything, so it carries the fault.
    with hccl_daemon(double_dir, faults=fault, ascend__devices=[1]) as faulty:
        async with linked(prefill, faulty, next_cluster_id) as (prompt, decoder):
            link = await outbound_link(faulty, decoder.cluster_id)
            assert (link.data_path, link.alive) == ("one-sided", True)
            key, data = await source(prompt, 3)
            dst = await decoder.cache_manager.allocate_cache(DESC)
            error, elapsed = await failed_pull(decoder, key, dst)
            assert elapsed < SLACK_S
            assert "one-sided HCCL transfer" in str(error), error
            link = await outbound_link(faulty, decoder.cluster_id)
            assert (link.transport, link.alive) == ("hccl", False)  # communicator dropped
            await decoder.cache_manager.pull_cache(key, dst)  # rebuilt and prepared again
            assert contents(dst) == data
            link = await outbound_link(faulty, decoder.cluster_id)
            assert (link.alive, link.data_path) == (True, "one-sided")
            await pull_ok(prompt, decoder, 4)


@pytest.mark.asyncio
async def test_one_sided_read_that_never_completes_times_out(
        runtime: AscendRuntime, double_dir: Path, prefill: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    with hccl_daemon(double_dir, faults="exec:HcclBatchGet=hang:0:1",
                     ascend__devices=[1]) as stuck:
        async with linked(prefill, stuck, next_cluster_id) as (prompt, decoder):
            key, data = await source(prompt, 5)
            dst = await decoder.cache_manager.allocate_cache(DESC)
            error, elapsed = await failed_pull(decoder, key, dst)
            assert error.status_code == S.LLM_TIMEOUT, error
            assert SYNC_MS / 1000 * 0.9 < elapsed < SLACK_S, elapsed
            await decoder.cache_manager.pull_cache(key, dst)
            assert contents(dst) == data


@pytest.mark.asyncio
async def test_peer_that_never_posts_times_out_then_the_link_recovers(
        runtime: AscendRuntime, double_dir: Path, decode: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    # Two-sided: the prompt daemon's first batch never runs (until its communicator goes).
    with hccl_daemon(double_dir, faults="exec:HcclBatchSendRecv=hang:0:1:1",
                     one_sided=False) as stuck:
        async with linked(stuck, decode, next_cluster_id) as (prompt, decoder):
            key, data = await source(prompt, 5)
            dst = await decoder.cache_manager.allocate_cache(DESC)
            error, elapsed = await failed_pull(decoder, key, dst)
            assert error.status_code == S.LLM_TIMEOUT, error
            assert SYNC_MS / 1000 * 0.9 < elapsed < SLACK_S, elapsed
            assert "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT" in str(error), error
            await decoder.cache_manager.pull_cache(key, dst)
            assert contents(dst) == data
            await pull_ok(prompt, decoder, 6)


# -- 7: mixed backends -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_host_and_hccl_daemons_do_not_link(
        runtime: AscendRuntime, double_dir: Path, prefill: DaemonProcess, decode: DaemonProcess,
        next_cluster_id: Callable[[], int], caplog: pytest.LogCaptureFixture) -> None:
    with daemon_process("host", double_dir) as host:
        on_host = await cluster(host, LLMRole.DECODER, next_cluster_id())
        on_hccl = await cluster(prefill, LLMRole.PROMPT, next_cluster_id())
        try:
            for linking, target, daemon, ours, theirs in (
                    (on_host, on_hccl, prefill, "host", "hccl"),
                    (on_hccl, on_host, host, "hccl", "host")):
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="hixl_client.llm_datadist"):
                    status, results = await linking.link_clusters(
                        [cluster_info(target.cluster_id, daemon.peer_address)], timeout=3000)
                assert (status, results) == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED])
                assert linking.link_transports == {}
                # The API returns statuses only (as LLM-DataDist's); the reason is logged.
                message = caplog.text
                assert f"runs the '{ours}' backend" in message, message
                assert f"the '{theirs}' one; link daemons of one backend" in message, message
        finally:
            await on_hccl.finalize()
            await on_host.finalize()
    await pull_ok_on_fresh_pair(prefill, decode, next_cluster_id)


# -- 8: what the daemon and the client report ------------------------------------------


@pytest.mark.asyncio
async def test_status_reports_the_hccl_backend_and_transport(
        runtime: AscendRuntime, prefill: DaemonProcess, decode: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    async with linked(prefill, decode, next_cluster_id) as (prompt, decoder):
        assert decoder.link_transports == {prompt.cluster_id: "hccl"}
        status = await daemon_status(decode.client_target)
        assert status.backend == "hccl"
        link = await outbound_link(decode, decoder.cluster_id)
        assert (link.remote_cluster_id, link.transport, link.alive) == (
            prompt.cluster_id, "hccl", True)
        pools = [p for p in status.pools if p.cluster_id == decoder.cluster_id]
        assert [(p.placement, p.size) for p in pools] == [("DEVICE", POOL)]
        inbound = await daemon_status(prefill.client_target)
        assert inbound.backend == "hccl"
        (back,) = [link for link in inbound.links
                   if link.direction == "inbound" and link.remote_cluster_id == decoder.cluster_id]
        assert (back.transport, back.alive) == ("hccl", True)


@pytest.mark.asyncio
async def test_clusters_on_two_devices_of_one_daemon_do_not_link(
        runtime: AscendRuntime, double_dir: Path, next_cluster_id: Callable[[], int],
        caplog: pytest.LogCaptureFixture) -> None:
    with hccl_daemon(double_dir) as both:
        first = await cluster(both, LLMRole.PROMPT, next_cluster_id(), 0)
        second = await cluster(both, LLMRole.DECODER, next_cluster_id(), 1)
        try:
            with caplog.at_level(logging.WARNING, logger="hixl_client.llm_datadist"):
                status, _ = await second.link_clusters(
                    [cluster_info(first.cluster_id, both.peer_address)], timeout=3000)
            assert status == S.LLM_LINK_FAILED
            assert "share a daemon but not a device" in caplog.text
            assert not [link for link in (await daemon_status(both.client_target)).links]
        finally:
            await second.finalize()
            await first.finalize()


# -- 9: pushes and layer-wise transfers over HCCL -----------------------------------------


class Ready(LayerSynchronizer):
    """Every layer is ready at once."""

    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        return True


def rows(data: bytes, count: int) -> list[bytes]:
    size = len(data) // count
    return [data[i * size:(i + 1) * size] for i in range(count)]


@pytest.mark.asyncio
async def test_pushes_and_layerwise_transfers_over_hccl(
        runtime: AscendRuntime, prefill: DaemonProcess, decode: DaemonProcess,
        next_cluster_id: Callable[[], int]) -> None:
    # The linking side (on the decode daemon) sends into the other's caches.
    async with linked(prefill, decode, next_cluster_id,
                      remote_accessible=True) as (receiver, sender):
        assert sender.link_transports == {receiver.cluster_id: "hccl"}
        blocks = CacheDesc(2, [16, 512], DataType.DT_UINT8)
        model = BlocksCacheKey(receiver.cluster_id, 9)
        target = await receiver.cache_manager.allocate_blocks_cache(blocks, model)
        before = contents(target)
        src = await sender.cache_manager.allocate_blocks_cache(blocks)
        data = fill(src)
        src_blocks, dst_blocks = [0, 1, 2, 7], [10, 11, 3, 0]
        await sender.cache_manager.push_blocks(model, src, src_blocks, dst_blocks)
        got = contents(target)
        for tensor in range(2):
            expected = rows(before[tensor], 16)
            for s, d in zip(src_blocks, dst_blocks, strict=True):
                expected[d] = rows(data[tensor], 16)[s]
            assert rows(got[tensor], 16) == expected

        slots = CacheDesc(4, [2, 2048], DataType.DT_UINT8)  # 2 layers of K, V; 2 slots
        dst = await receiver.cache_manager.allocate_cache(slots)
        before = contents(dst)
        slot_src = await sender.cache_manager.allocate_cache(slots)
        data = fill(slot_src)
        await sender.cache_manager.push_cache(
            CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id, 1), slot_src, 0)
        got = contents(dst)
        for tensor in range(4):  # slot 0 of the source lands in slot 1
            assert rows(got[tensor], 2) == [rows(before[tensor], 2)[0],
                                            rows(data[tensor], 2)[0]]

        config = TransferWithCacheKeyConfig(
            CacheKeyByIdAndIndex(receiver.cluster_id, dst.cache_id, 0), range(1, 2), range(1),
            src_batch_index=1)
        task = sender.cache_manager.transfer_cache_async(slot_src, Ready(), [config])
        assert await task == [S.LLM_SUCCESS]
        final = contents(dst)
        for tensor in (0, 1):  # layer 1 of the source, slot 1 -> layer 0, slot 0
            assert rows(final[tensor], 2) == [rows(data[tensor + 2], 2)[1],
                                              rows(got[tensor], 2)[1]]
        assert final[2:] == got[2:]
