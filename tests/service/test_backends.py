"""The backend factory (``backends.open_backend``): the one place that turns
``pool.backend`` into the pools, the copier and the transport kit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from hixl_service.ascend.backend import BackendUnavailable
from hixl_service.backends import open_backend
from hixl_service.completions import CompletionDispatcher
from hixl_service.config import load_config
from hixl_service.memory.base import PoolSpec
from hixl_wire.types import Placement


@pytest_asyncio.fixture
async def dispatcher() -> AsyncIterator[CompletionDispatcher]:
    completions = CompletionDispatcher(asyncio.get_running_loop())
    yield completions
    completions.close()


@pytest.mark.asyncio
async def test_the_host_backend_puts_every_pool_in_host_memory(
        dispatcher: CompletionDispatcher) -> None:
    cfg = load_config(None, {"HIXL_POOL__MAX_BYTES": "8MiB", "HIXL_POOL__POPULATE": "false",
                             "HIXL_TRANSFER__STREAMS_PER_LINK": "3"})
    backend = await open_backend(cfg, dispatcher, "127.0.0.1")
    try:
        assert (backend.name, backend.ascend) == ("host", None)
        kit = backend.kit  # what links are built from: the same copier and completions
        assert (kit.copier, kit.dispatcher, kit.ascend) == (backend.copier, dispatcher, None)
        assert (kit.streams_per_link, kit.connect_timeout_s) == (
            3, cfg.transfer.connect_timeout_s)
        pools = backend.pools
        assert pools.budget_bytes == 8 << 20
        for placement in (Placement.HOST, Placement.DEVICE):
            pool = await pools.create(1, placement, PoolSpec(1 << 20))
            assert not pool.on_device
            assert pools.reserved_bytes == 1 << 20  # within pool.max_bytes, both kinds
            await pools.destroy(pool)
    finally:
        backend.copier.close()


@pytest.mark.asyncio
async def test_an_hccl_backend_without_cann_refuses_the_start(
        dispatcher: CompletionDispatcher, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCL_BUFFSIZE", "0")  # opening exports it: put back afterwards
    cfg = load_config(None, {"HIXL_POOL__BACKEND": "hccl",
                             "HIXL_ASCEND__CANN_PATH": str(tmp_path)})
    with pytest.raises(BackendUnavailable):  # never a silent fallback to host memory
        await open_backend(cfg, dispatcher, "127.0.0.1")
