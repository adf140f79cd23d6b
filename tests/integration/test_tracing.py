"""OpenTelemetry (the tracing extra): a client span's trace continues in its
daemon and in the peer daemon that daemon calls, over the lanes and gRPC."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hixl_client import (
    CacheDesc,
    CacheKeyByIdAndIndex,
    DataType,
    LayerSynchronizer,
    LLMStatusCode,
    TransferWithCacheKeyConfig,
    _tracing,
)
from hixl_service.testing import DaemonProcess

from .conftest import Pair, daemon_process, make_pair

pytestmark = pytest.mark.asyncio

DESC = CacheDesc(4, [2, 4096], DataType.DT_UINT8)
CLIENT_SPANS = InMemorySpanExporter()


class Ready(LayerSynchronizer):
    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        return True


def _client_provider() -> None:
    # The process-global provider is the application's to set; this test
    # process is the application.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(CLIENT_SPANS))
    trace.set_tracer_provider(provider)


def traced_daemon(tmp: Path, name: str) -> DaemonProcess:
    return daemon_process(tracing={"enabled": True, "exporter": "console",
                                   "console_file": str(tmp / f"{name}.spans")})


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, DaemonProcess,
                                                                        DaemonProcess]]:
    tmp = tmp_path_factory.mktemp("spans")
    with traced_daemon(tmp, "prefill") as prefill, traced_daemon(tmp, "decode") as decode:
        yield tmp, prefill, decode


@pytest_asyncio.fixture
async def pair(traced: tuple[Path, DaemonProcess, DaemonProcess],
               next_cluster_id: Callable[[], int],
               monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pair]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        _client_provider()
    # What HIXL_TRACING=1 sets at import (test_env_switch checks that part).
    monkeypatch.setattr(_tracing, "ENABLED", True)
    made = await make_pair(traced[1], traced[2], next_cluster_id, remote_accessible=True)
    yield made
    monkeypatch.setattr(_tracing, "ENABLED", False)
    await made.decoder.finalize()
    await made.prompt.finalize()


async def daemon_spans(path: Path, trace_ids: set[str], want: int) -> list[dict[str, Any]]:
    """The spans of ``trace_ids`` a daemon exported, once ``want`` are there
    (the exporter batches; bounded wait)."""
    deadline = time.monotonic() + 30
    while True:
        spans = [json.loads(line) for line in path.read_text().splitlines()] \
            if path.exists() else []
        mine = [s for s in spans if s["context"]["trace_id"] in trace_ids]
        if len(mine) >= want or time.monotonic() > deadline:
            return mine
        await asyncio.sleep(0.2)


def hex_id(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


async def test_pull_push_and_layers_continue_the_client_trace(
        pair: Pair, traced: tuple[Path, DaemonProcess, DaemonProcess]) -> None:
    tmp = traced[0]
    CLIENT_SPANS.clear()
    prompt_id = pair.prompt.cluster_id
    remote = await pair.prompt.cache_manager.allocate_cache(DESC)
    dst = await pair.decoder.cache_manager.allocate_cache(DESC)
    by_id = CacheKeyByIdAndIndex(prompt_id, remote.cache_id, 1)
    await pair.decoder.cache_manager.pull_cache(by_id, dst)  # resolves on the prompt daemon
    await pair.decoder.cache_manager.pull_cache(by_id, dst)  # by repeat handle
    await pair.decoder.cache_manager.push_cache(by_id, dst, 0)
    task = pair.decoder.cache_manager.transfer_cache_async(
        dst, Ready(), [TransferWithCacheKeyConfig(by_id, range(2), range(2))])
    assert await task.synchronize(10_000) == LLMStatusCode.LLM_SUCCESS

    client = {span.name: span for span in CLIENT_SPANS.get_finished_spans()}
    assert {"hixl.PullCache", "hixl.RepeatPull", "hixl.PushCache",
            "hixl.TransferCache"} <= set(client)
    ids = {hex_id(span.context.trace_id, 32) for span in client.values()}
    decode_spans = await daemon_spans(tmp / "decode.spans", ids, 6)
    prefill_spans = await daemon_spans(tmp / "prefill.spans", ids, 1)

    def server_of(client_name: str, spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        span = client[client_name]
        return [s for s in spans if s["context"]["trace_id"] == hex_id(
            span.context.trace_id, 32) and s["parent_id"] == hex_id(span.context.span_id, 16)]

    # Each client span has the daemon's server span as its child.
    for name in ("PullCache", "RepeatPull", "PushCache", "TransferCache"):
        (served,) = server_of(f"hixl.{name}", decode_spans)
        assert served["name"] == f"hixl.daemon.{name}" and served["kind"] == "SpanKind.SERVER"
    # The first pull resolved the cache on the prompt daemon: a peer call in
    # the same trace, a child of the daemon's span.
    pull_trace = hex_id(client["hixl.PullCache"].context.trace_id, 32)
    (daemon_pull,) = [s for s in decode_spans if s["name"] == "hixl.daemon.PullCache"]
    peer = [s for s in prefill_spans if s["context"]["trace_id"] == pull_trace]
    assert [s["name"] for s in peer] == ["hixl.peer.ResolveCache"]
    assert {s["parent_id"] for s in peer} == {daemon_pull["context"]["span_id"]}
    # The layer-wise task: one child span per layer written.
    (task_span,) = [s for s in decode_spans if s["name"] == "hixl.daemon.TransferCache"]
    layers = [s for s in decode_spans if s["name"] == "hixl.daemon.layer"
              and s["parent_id"] == task_span["context"]["span_id"]]
    assert sorted(s["attributes"]["layer"] for s in layers) == [0, 1]


async def test_env_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_tracing.TRACING_ENV, "1")
    assert _tracing._wanted()
    monkeypatch.setenv(_tracing.TRACING_ENV, "0")
    assert not _tracing._wanted()
    monkeypatch.delenv(_tracing.TRACING_ENV)
    assert not _tracing._wanted()
