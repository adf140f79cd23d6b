"""The options engine connectors set are accepted, and the admin status lists them."""

from __future__ import annotations

import pytest

from hixl_client import LLMConfig, LLMDataDist, LLMException, LLMRole, LLMStatusCode
from hixl_service.testing import DaemonProcess, unused_port

from .conftest import daemon_status, options

pytestmark = pytest.mark.asyncio


def _connector_options() -> dict[str, str]:
    """What vLLM-Ascend's and MindIE's connectors set, beside the pool."""
    config = LLMConfig()
    config.device_id = 0
    config.listen_ip_info = f"127.0.0.1:{unused_port()}"
    config.local_comm_res = ""
    config.transfer_backend = "hixl"
    config.link_total_time = 30
    config.link_retry_count = 3
    config.sync_kv_timeout = 5000
    config.ge_options = {"ge.exec.rankTableFile": "/nonexistent/ranktable.json",
                         "ge.flowGraphMemMaxSize": "2147483648"}
    opts = dict(config.generate_options())
    opts.update(options(pool_bytes=2**20))
    return opts


async def test_connector_options_are_accepted_and_listed(prefill_daemon: DaemonProcess,
                                                         next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    dd = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=prefill_daemon.client_target)
    await dd.init(_connector_options())
    try:
        status = await daemon_status(prefill_daemon.client_target)
        [cluster] = [c for c in status.clusters if c.cluster_id == dd.cluster_id]
        listed = dict(cluster.options)
        assert listed["llm.TransferBackend"] == "hixl"
        assert listed["llm.LocalCommRes"] == ""
        assert listed["llm.LinkTotalTime"] == "30" and listed["llm.LinkRetryCount"] == "3"
        # unknown engine options pass through untouched
        assert listed["ge.exec.rankTableFile"] == "/nonexistent/ranktable.json"
        assert listed["ge.flowGraphMemMaxSize"] == "2147483648"
    finally:
        await dd.finalize()


async def test_another_transfer_backend_is_refused(prefill_daemon: DaemonProcess,
                                                   next_cluster_id) -> None:  # type: ignore[no-untyped-def]
    opts = _connector_options()
    opts["llm.TransferBackend"] = "mooncake"
    dd = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=prefill_daemon.client_target)
    with pytest.raises(LLMException, match="mooncake") as raised:
        await dd.init(opts)
    assert raised.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    assert not dd.is_initialized
