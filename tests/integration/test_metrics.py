"""/metrics of real daemons: scraped before and after known transfers, the
counters must have moved by exactly what those transfers did."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from hixl_client import CacheDesc, CacheKey, CacheKeyByIdAndIndex, DataType, LLMException
from hixl_service.testing import DaemonProcess
from hixl_wire._proto.hixl.v1 import client_pb2, client_pb2_grpc

from ._metrics_support import ascrape, value
from .conftest import Pair, daemon_process, daemon_status, make_pair

pytestmark = pytest.mark.asyncio

DESC = CacheDesc(2, [4, 8192], DataType.DT_UINT8)
SLOT_BYTES = 2 * 8192  # two tensors, one slot each
@pytest.fixture(scope="module")
def metered() -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    with daemon_process(metrics__listen="127.0.0.1:0") as prefill, \
            daemon_process(metrics__listen="127.0.0.1:0") as decode:
        yield prefill, decode


@pytest_asyncio.fixture
async def pair(metered: tuple[DaemonProcess, DaemonProcess],
               next_cluster_id: Callable[[], int]) -> AsyncIterator[Pair]:
    made = await make_pair(*metered, next_cluster_id)
    yield made
    await made.decoder.finalize()
    await made.prompt.finalize()


async def test_pull_counters_move_by_the_pulls(pair: Pair) -> None:
    decode = pair.decoder_daemon
    prompt_id = pair.prompt.cluster_id
    keys = [CacheKey(prompt_id, req_id=100 + i) for i in range(3)]
    src = await pair.prompt.cache_manager.allocate_cache(DESC)
    keyed = [await pair.prompt.cache_manager.allocate_cache(
        CacheDesc(2, [1, 8192], DataType.DT_UINT8), [key]) for key in keys]
    dst = await pair.decoder.cache_manager.allocate_cache(DESC)
    before = await ascrape(decode)

    for key in keys:  # three pulls by key: the full path
        await pair.decoder.cache_manager.pull_cache(key, dst, batch_index=1)
    for slot in range(4):  # four by id: the first full, the rest by repeat handle
        await pair.decoder.cache_manager.pull_cache(
            CacheKeyByIdAndIndex(prompt_id, src.cache_id, slot), dst, batch_index=slot)
    with pytest.raises(LLMException):  # a pull of a key nobody holds
        await pair.decoder.cache_manager.pull_cache(CacheKey(prompt_id, req_id=999), dst)
    after = await ascrape(decode)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    pulls = {"op": "pull_cache", "transport": "tcp"}
    assert delta("hixl_transfers_total", status="LLM_SUCCESS", **pulls) == 7
    assert delta("hixl_transfer_bytes_total", **pulls) == 7 * SLOT_BYTES
    for phase in ("control", "data", "total"):
        assert delta("hixl_transfer_duration_seconds_count", phase=phase, **pulls) == 7
        assert delta("hixl_transfer_duration_seconds_bucket", phase=phase, le="+Inf",
                     **pulls) == 7
    assert delta("hixl_transfer_duration_seconds_sum", phase="data", **pulls) > 0
    failed = {(labels, v - value(before, name, **dict(labels)))
              for (name, labels), v in after.items()
              if name == "hixl_transfers_total" and dict(labels)["status"] != "LLM_SUCCESS"}
    assert {(labels, d) for labels, d in failed if d} == {
        ((("op", "pull_cache"), ("status", "LLM_KV_CACHE_NOT_EXIST"), ("transport", "unknown")), 1)}
    # The prompt daemon moved nothing of its own (it served the reads natively).
    prompt_after = await ascrape(pair.prompt_daemon)
    assert value(prompt_after, "hixl_transfers_total", status="LLM_SUCCESS", **pulls) == 0

    # The state the scrape reads matches the Admin status.
    status = await daemon_status(decode.client_target)
    assert value(after, "hixl_up") == 1
    assert value(after, "hixl_sessions") == len(status.sessions)
    assert value(after, "hixl_clusters") == len(status.clusters)
    assert value(after, "hixl_links", direction="outbound", transport="tcp", state="up") == 1
    assert value(after, "hixl_caches") == len(status.caches)
    used = sum(p.used for p in status.pools if p.placement == "DEVICE")
    assert value(after, "hixl_pool_used_bytes", placement="DEVICE") == used
    # The three repeats went through the client's rings: the native lane ran them.
    assert delta("hixl_lane_calls_total", lane="transfer") == 5
    assert delta("hixl_lane_calls_total", lane="native") == 3
    assert value(after, "hixl_link_transitions_total", direction="outbound", state="up") >= 1
    assert value(prompt_after, "hixl_links", direction="inbound", transport="tcp",
                 state="up") == 1
    assert value(after, "process_resident_memory_bytes") > 0
    # The Admin status counts the same transfers.
    counted = {(t.op, t.transport, t.status): (t.calls, t.bytes) for t in status.transfers}
    assert counted[("pull_cache", "tcp", "LLM_SUCCESS")] == (
        value(after, "hixl_transfers_total", status="LLM_SUCCESS", **pulls),
        value(after, "hixl_transfer_bytes_total", **pulls))

    for cache in (src, *keyed):
        await pair.prompt.cache_manager.deallocate_cache(cache)
    await pair.decoder.cache_manager.deallocate_cache(dst)


async def test_push_and_copy_counters(pair: Pair) -> None:
    decode = pair.decoder_daemon
    src = await pair.decoder.cache_manager.allocate_cache(DESC)
    other = await pair.decoder.cache_manager.allocate_cache(DESC)
    before = await ascrape(decode)
    await pair.decoder.cache_manager.copy_cache(other, src, 0, 1)
    after = await ascrape(decode)
    copies = {"op": "copy_cache", "transport": "copy"}
    assert value(after, "hixl_transfers_total", status="LLM_SUCCESS", **copies) - value(
        before, "hixl_transfers_total", status="LLM_SUCCESS", **copies) == 1
    assert value(after, "hixl_transfer_bytes_total", **copies) - value(
        before, "hixl_transfer_bytes_total", **copies) == SLOT_BYTES
    for cache in (src, other):
        await pair.decoder.cache_manager.deallocate_cache(cache)


async def test_metrics_are_off_by_default(pair: Pair) -> None:
    with daemon_process() as plain:
        assert "metrics_address" not in plain.ready
        status = await daemon_status(plain.client_target)
        assert status.metrics_address == ""
    status = await daemon_status(pair.decoder_daemon.client_target)
    assert status.metrics_address == pair.decoder_daemon.ready["metrics_address"]


async def test_metrics_off_loopback_is_refused() -> None:
    daemon = daemon_process(metrics__listen="0.0.0.0:0")
    with pytest.raises(RuntimeError, match="exited with code 2") as refused:
        daemon.start()
    assert "metrics.allow_remote" in str(refused.value)
    daemon.close()


async def test_the_grafana_dashboard_asks_for_metrics_the_daemon_serves(pair: Pair) -> None:
    dashboard = json.loads((Path(__file__).parents[2] / "deploy" / "grafana" /
                            "hixl.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    asked = {name for expr in exprs for name in re.findall(r"\b((?:hixl|process)_[a-z_]+)\b",
                                                            expr)}
    url = f"http://{pair.decoder_daemon.ready['metrics_address']}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    served = set(re.findall(r"(?m)^# TYPE (\S+) ", text))
    missing = {name for name in asked
               if name not in served and re.sub(r"_(bucket|sum|count)$", "", name) not in served}
    assert asked and not missing, missing
    assert {"hixl_transfers_total", "hixl_transfer_bytes_total",
            "hixl_transfer_duration_seconds_bucket", "hixl_links",
            "hixl_pool_used_bytes"} <= asked


async def test_refusals_are_counted_by_reason(pair: Pair) -> None:
    decode = pair.decoder_daemon
    before = await ascrape(decode)
    async with grpc.aio.insecure_channel(decode.client_target) as channel:
        stub = client_pb2_grpc.ClientStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # no session metadata
            await stub.PullCache(client_pb2.PullCacheRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    after = await ascrape(decode)
    assert value(after, "hixl_refusals_total", reason="no_session") - value(
        before, "hixl_refusals_total", reason="no_session") == 1
    failed = {"op": "pull_cache", "transport": "unknown", "status": "LLM_FAILED"}
    assert value(after, "hixl_transfers_total", **failed) - value(
        before, "hixl_transfers_total", **failed) == 1
    status = await daemon_status(decode.client_target)
    assert status.refusals["no_session"] == value(after, "hixl_refusals_total",
                                                  reason="no_session")


async def test_metrics_off_loopback_with_allow_remote_start_warned() -> None:
    with daemon_process(metrics={"listen": "0.0.0.0:0", "allow_remote": True}) as daemon:
        assert daemon.ready["metrics_address"].startswith("0.0.0.0:")
        assert "metrics.allow_remote" in daemon.log_tail(20000)
        port = daemon.ready["metrics_address"].rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}/metrics"
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(url, timeout=10).read().decode())
        assert "hixl_up 1.0" in text
