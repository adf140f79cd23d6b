"""Issue 30, defect 5: A3 rank tables (version 1.2 with super-pod fields) from
aclrtGetSocName and aclrtGetDeviceInfo, under the CANN double (whose SoC a test
chooses with HIXL_DOUBLE_SOC)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hixl_service.ascend.backend import AscendBackend
from hixl_service.ascend.comms import RankInfo, rank_table
from tests.ascend._rank1 import Rank1

ascend = pytest.importorskip("hixl_native._ascend")

MIB = 1 << 20
A3 = "Ascend910_9391"
FEATURE_NOT_SUPPORT = 207000  # ACL_ERROR_RT_FEATURE_NOT_SUPPORT


def test_soc_and_super_pod_ids(runtime: ascend.AscendRuntime,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert "soc_info" in runtime.features
    device = runtime.set_device(1)
    assert ascend.soc_name() == "Ascend910B1"  # the double's default
    with pytest.raises(ascend.AclError) as caught:  # no super pod off A3
        ascend.super_pod_ids(device)
    assert caught.value.code == FEATURE_NOT_SUPPORT
    monkeypatch.setenv("HIXL_DOUBLE_SOC", A3)
    monkeypatch.setenv("HIXL_DOUBLE_SUPER_DEVICE_BASE", "16")
    monkeypatch.setenv("HIXL_DOUBLE_SUPER_POD_ID", "3")
    assert ascend.soc_name() == A3
    assert ascend.super_pod_ids(device) == (17, 3)


def test_backend_describes_a3_ranks(runtime: ascend.AscendRuntime,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    devices = {0: runtime.set_device(0)}
    monkeypatch.setenv("HIXL_DOUBLE_SOC", A3)
    a3 = AscendBackend(runtime, devices, 1 << 30).rank_info(0)
    assert (a3.soc, a3.super_device_id, a3.super_pod_id, a3.super_pod) == (A3, 0, 0, True)
    monkeypatch.setenv("HIXL_DOUBLE_SOC", "Ascend910B3")
    a2 = AscendBackend(runtime, devices, 1 << 30).rank_info(0)
    assert (a2.soc, a2.super_device_id, a2.super_pod) == ("Ascend910B3", None, False)


def test_a3_communicator_from_a_version_1_2_table(runtime: ascend.AscendRuntime,
                                                  double_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ranks build from the 1.2 table hixl writes; the double, as hcomm's
    topoinfo_ranktableConcise.cc, refuses a 1.2 table without the super-pod fields."""
    monkeypatch.setenv("HIXL_DOUBLE_SOC", A3)
    device = runtime.set_device(0)
    backend = AscendBackend(runtime, {0: device}, 1 << 30)
    mine = backend.rank_info(0)
    peer_rank = RankInfo(mine.host_ip, 1, "", A3, 1, 0)
    table = rank_table(mine, peer_rank)
    assert json.loads(table)["version"] == "1.2"
    bare = json.loads(table)
    del bare["super_pod_list"]
    with pytest.raises(ascend.HcclError, match="super_pod_list") as caught:
        ascend.comm_from_rank_table(device, json.dumps(bare), 0, buffer_mb=1, name="a3-bare")
    assert caught.value.code == 1  # HCCL_E_PARA
    with Rank1(double_dir, rank_table=table, HIXL_DOUBLE_SOC=A3) as peer, \
            device.malloc(2 * MIB) as buf, device.create_stream() as stream:
        comm = ascend.comm_from_rank_table(device, table, 0, buffer_mb=1, name="rank1-test")
        with comm:
            peer.wait_ready()
            peer.link_up(comm, stream)
            buf.write(0, bytes(range(256)) * 16)
            comm.send(buf, 0, 4096, 1, stream)
            assert peer.ask("recv 0 4096") == "ok"
            stream.synchronize(timeout_ms=10_000)
            assert peer.ask("sync 10000") == "ok"
