"""The [ascend] network and communicator settings: validated at load and at
start, exported to HCCL's environment, and the rank table a link builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hixl_service.ascend.comms import (
    CommSpec,
    RankInfo,
    apply_environment,
    check_network,
    hccn_addresses,
    host_address,
    rank_table,
)
from hixl_service.config import AscendConfig, ConfigError, load_config


def ascend(**env: str) -> AscendConfig:
    return load_config(None, {f"HIXL_ASCEND__{k.upper()}": v for k, v in env.items()}).ascend


def test_defaults_leave_hccl_its_own_choices() -> None:
    cfg = ascend()
    assert (cfg.comm_init, cfg.hccl_buffer_mb) == ("rank_table", 200)
    environ: dict[str, str] = {}
    assert apply_environment(cfg, environ) == {"HCCL_BUFFSIZE": "200"}
    assert environ == {"HCCL_BUFFSIZE": "200"}


def test_settings_become_hccl_environment() -> None:
    cfg = ascend(if_ip="127.0.0.1", base_port="50000", connect_timeout_s="300",
                 hccl_buffer_mb="64", comm_init="root_info")
    environ = {"HCCL_IF_IP": "10.9.9.9", "PATH": "/bin"}
    apply_environment(cfg, environ)
    assert environ == {"HCCL_IF_IP": "127.0.0.1", "HCCL_IF_BASE_PORT": "50000",
                       "HCCL_CONNECT_TIMEOUT": "300", "HCCL_BUFFSIZE": "64", "PATH": "/bin"}
    named = ascend(socket_ifname="lo")
    assert apply_environment(named, {})["HCCL_SOCKET_IFNAME"] == "lo"


@pytest.mark.parametrize(("key", "value", "why"), [
    ("if_ip", "not-an-ip", "if_ip"),
    ("base_port", "80", "base_port"),
    ("base_port", "65530", "base_port"),
    ("connect_timeout_s", "5", "connect_timeout_s"),
    ("hccl_buffer_mb", "0", "hccl_buffer_mb"),
    ("comm_init", "magic", "comm_init"),
    ("socket_ifname", "eth0;rm", "socket_ifname"),
    ("device_ips", '{"0": "300.1.1.1"}', "device_ips"),
])
def test_bad_settings_fail_at_load(key: str, value: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ascend(**{key: value})
    assert f"ascend.{why}" in str(caught.value)


def test_if_ip_and_ifname_exclude_each_other() -> None:
    with pytest.raises(ConfigError, match="not both"):
        ascend(if_ip="127.0.0.1", socket_ifname="lo")


def test_start_checks_the_host() -> None:
    check_network(ascend(if_ip="127.0.0.1", base_port="60000"))
    check_network(ascend(socket_ifname="lo"))
    with pytest.raises(ValueError, match="not an address of this host"):
        check_network(ascend(if_ip="192.0.2.77"))  # TEST-NET-1, never local
    with pytest.raises(ValueError, match="no interface"):
        check_network(ascend(socket_ifname="=hixlnosuchif0"))


def test_rank_tables() -> None:
    """Version 1.0 off A3; an unknown device_ip is left out (issue 30), never written as ""."""
    same_host = json.loads(rank_table(RankInfo("10.0.0.1", 0, "192.168.1.10"),
                                      RankInfo("10.0.0.1", 3, "")))
    assert same_host == {
        "version": "1.0", "server_count": "1", "status": "completed",
        "server_list": [{"server_id": "10.0.0.1", "device": [
            {"device_id": "0", "device_ip": "192.168.1.10", "rank_id": "0"},
            {"device_id": "3", "rank_id": "1"}]}]}
    two_hosts = json.loads(rank_table(RankInfo("10.0.0.1", 0, ""), RankInfo("10.0.0.2", 0, "")))
    assert two_hosts["server_count"] == "2"
    assert [s["device"][0]["rank_id"] for s in two_hosts["server_list"]] == ["0", "1"]
    with pytest.raises(ValueError):
        RankInfo("host", 0, "").check()
    with pytest.raises(ValueError, match="super_device_id"):
        RankInfo("10.0.0.1", 0, "", A3, -1, 0).check()


A3 = "Ascend910_9391"


def test_a3_rank_tables_are_version_1_2() -> None:
    """hixl rank_table_generator_v2.cc / hcomm topoinfo_ranktableConcise.cc: on
    Ascend910_93xx each device has its super_device_id, and super_pod_list names
    each pod's servers."""
    table = json.loads(rank_table(RankInfo("10.0.0.1", 0, "192.168.1.10", A3, 8, 1),
                                  RankInfo("10.0.0.2", 2, "", A3, 26, 1)))
    assert table == {
        "version": "1.2", "server_count": "2", "status": "completed",
        "server_list": [
            {"server_id": "10.0.0.1", "device": [
                {"device_id": "0", "device_ip": "192.168.1.10", "rank_id": "0",
                 "super_device_id": "8"}]},
            {"server_id": "10.0.0.2", "device": [
                {"device_id": "2", "rank_id": "1", "super_device_id": "26"}]}],
        "super_pod_list": [{"super_pod_id": "1", "server_list": [
            {"server_id": "10.0.0.1"}, {"server_id": "10.0.0.2"}]}]}
    one_host = json.loads(rank_table(RankInfo("10.0.0.1", 0, "", A3, 0, 0),
                                     RankInfo("10.0.0.1", 1, "", A3, 1, 0)))
    assert one_host["super_pod_list"] == [{"super_pod_id": "0",
                                           "server_list": [{"server_id": "10.0.0.1"}]}]


def test_a3_with_anything_else_is_version_1_0() -> None:
    """HIXL takes the lower version of the two ranks' (rank_table_generator.cc)."""
    for other in (RankInfo("10.0.0.1", 1, "", "Ascend910B2"),
                  RankInfo("10.0.0.1", 1, "", A3)):  # A3 without its super-pod ids
        table = json.loads(rank_table(RankInfo("10.0.0.1", 0, "", A3, 0, 0), other))
        assert table["version"] == "1.0" and "super_pod_list" not in table
        assert all("super_device_id" not in d for d in table["server_list"][0]["device"])


def test_910b_across_hosts_needs_device_ips() -> None:
    """Atlas A2 reaches another host through the device NICs: refused at once, not
    after HCCL_CONNECT_TIMEOUT."""
    with pytest.raises(ValueError, match="device NIC address"):
        rank_table(RankInfo("10.0.0.1", 0, "192.168.1.10", "Ascend910B1"),
                   RankInfo("10.0.0.2", 0, "", "Ascend910B1"))
    rank_table(RankInfo("10.0.0.1", 0, "", "Ascend910B1"),
               RankInfo("10.0.0.1", 1, "", "Ascend910B1"))  # one host: HCCS
    rank_table(RankInfo("10.0.0.1", 0, "192.168.1.10", "Ascend910B1"),
               RankInfo("10.0.0.2", 0, "192.168.1.11", "Ascend910B1"))


def test_comm_specs_a_peer_may_send() -> None:
    CommSpec(rank_table="{}", buffer_mb=1, name="n").check(4108)
    CommSpec(root_info=bytes(4108)).check(4108)
    for bad in (CommSpec(), CommSpec(root_info=b"x", rank_table="{}"),
                CommSpec(root_info=b"short"), CommSpec(rank_table="{}", buffer_mb=0),
                CommSpec(rank_table="{}", name="n" * 200)):
        with pytest.raises(ValueError):
            bad.check(4108)
    assert CommSpec(rank_table="{}", buffer_mb=3).device_bytes == 6 << 20


def test_hccn_conf_and_host_names(tmp_path: Path) -> None:
    conf = tmp_path / "hccn.conf"
    conf.write_text("address_0=192.168.100.1\nnetmask_0=255.255.255.0\naddress_7=192.168.100.8\n")
    assert hccn_addresses(conf) == {0: "192.168.100.1", 7: "192.168.100.8"}
    assert hccn_addresses(tmp_path / "missing") == {}
    assert host_address("127.0.0.1") == "127.0.0.1"
    assert host_address("0.0.0.0") == "127.0.0.1"
    assert host_address("localhost") == "127.0.0.1"
