"""Issue 30's small rules, without a device: the wait after an abort, the order of a
channel's tear-down, host kernels that cannot lend memory to ACL, rank-table fields."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.ascend.backend import check_host_kernel
from hixl_service.ascend.comms import CommSpec, RankInfo, rank_table

hccl = pytest.importorskip("hixl_service.transports.hccl_channel")


class _Recorder:
    """Stands in for the shim objects a channel holds; records the calls made."""

    def __init__(self, calls: list[str], pending: bool = False) -> None:
        self.calls = calls
        self.pending = pending
        self.closed = False
        self.device = type("Dev", (), {"id": 0})()

    def abort(self) -> None:
        self.calls.append("abort")

    def destroy(self, *args: Any) -> None:
        self.calls.append("destroy")
        self.closed = True


class _Memory:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def unbind(self, binding: object) -> None:
        self.calls.append("unbind")


def test_teardown_waits_after_an_abort_then_unbinds_then_destroys(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """HIXL's comm_channel.cc: aicpu may still unfold aborted tasks, so a short wait
    comes between the abort and the unbind; HCCL refuses to destroy a communicator
    with memory bound, so the unbind comes before the destroy."""
    calls: list[str] = []
    monkeypatch.setattr(hccl.time, "sleep", lambda s: calls.append(f"sleep {s}"))
    released: list[int] = []
    settings = type("S", (), {"release": lambda self, d, n: released.append(n)})()
    comm = _Recorder(calls)
    channel = hccl.Channel(comm, _Recorder(calls, pending=True), 7, settings)
    channel.binding = object()
    channel._memory = _Memory(calls)
    channel.destroy()
    channel.destroy()  # idempotent
    assert calls == ["abort", f"sleep {hccl.ABORT_SETTLE_S}", "unbind", "destroy", "destroy"]
    assert released == [7] and channel.closed


def test_no_wait_when_nothing_was_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(hccl.time, "sleep", lambda s: calls.append("sleep"))
    settings = type("S", (), {"release": lambda self, d, n: None})()
    channel = hccl.Channel(_Recorder(calls), _Recorder(calls), 1, settings)
    channel.destroy()
    assert "sleep" not in calls and "abort" not in calls


@pytest.mark.parametrize("release", ["5.10.0-136.12.0.86.oe2203sp1.aarch64", "4.19.90", "5.4"])
def test_kernels_up_to_5_10_refuse_host_memory(release: str) -> None:
    with pytest.raises(LLMException, match="above 5.10") as refused:
        check_host_kernel(release)
    assert refused.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED


@pytest.mark.parametrize("release", ["5.15.0-91-generic", "6.8.0", "5.11", "not-linux"])
def test_later_kernels_lend_host_memory(release: str) -> None:
    check_host_kernel(release)


def test_an_unknown_device_ip_is_left_out_of_the_rank_table() -> None:
    table = json.loads(rank_table(RankInfo("10.0.0.1", 0, ""), RankInfo("10.0.0.2", 3, "1.2.3.4")))
    first, second = (server["device"][0] for server in table["server_list"])
    assert "device_ip" not in first and second["device_ip"] == "1.2.3.4"


def test_a_rank_table_communicator_needs_a_name() -> None:
    """hcomm op_base.cc: HcclCommInitClusterInfoMemConfig answers HCCL_E_PARA without one."""
    with pytest.raises(ValueError, match="needs a name"):
        CommSpec(rank_table="{}", name="").check(4108)
    CommSpec(rank_table="{}", name="hixl-1").check(4108)
