"""LLMConfig setters, defaults and emitted options; LLMClusterInfo and the ip helpers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hixl_client.config import LLMClusterInfo, LLMConfig, LlmConfig, int_to_ip, trans_str_ip
from hixl_client.status import LLMException, LLMStatusCode
from hixl_client.types import LLMRole


def test_alias() -> None:
    assert LlmConfig is LLMConfig


DEFAULTS: list[tuple[str, Any]] = [
    ("device_id", None),
    ("sync_kv_timeout", None),
    ("ge_options", {}),
    ("listen_ip_info", ""),
    ("deploy_res_path", ""),
    ("buf_pool_cfg", ""),
    ("output_max_size", None),
    ("mem_utilization", 0.95),
    ("cluster_info", ""),
    ("enable_switch_role", False),
    ("link_total_time", 0),
    ("link_retry_count", 1),
    ("enable_cache_manager", False),
    ("enable_remote_cache_accessible", False),
    ("mem_pool_cfg", ""),
    ("host_mem_pool_cfg", ""),
    ("rdma_traffic_class", None),
    ("rdma_service_level", None),
    ("local_comm_res", ""),
    ("transfer_backend", ""),
    ("global_resource_config", ""),
    ("options", {}),
]


@pytest.mark.parametrize(("prop", "value"), DEFAULTS)
def test_defaults(prop: str, value: Any) -> None:
    assert getattr(LLMConfig(), prop) == value


def test_default_options_only_memory_utilization() -> None:
    assert LLMConfig().generate_options() == {"llm.MemoryUtilization": "0.95"}


# (property, value set, options it adds besides llm.MemoryUtilization)
EMITTED: list[tuple[str, Any, dict[str, str]]] = [
    ("device_id", 0, {"ge.exec.deviceId": "0", "ge.session_device_id": "0"}),
    ("device_id", 3, {"ge.exec.deviceId": "3", "ge.session_device_id": "3"}),
    ("device_id", [0, 1], {"ge.exec.deviceId": "0;1", "ge.session_device_id": "0"}),
    ("device_id", (3, 4), {"ge.exec.deviceId": "3;4", "ge.session_device_id": "3"}),
    ("sync_kv_timeout", 1000, {"llm.SyncKvCacheWaitTime": "1000"}),
    ("sync_kv_timeout", "200", {"llm.SyncKvCacheWaitTime": "200"}),
    ("ge_options", {"ge.a": "1", "ge.b": ""}, {"ge.a": "1", "ge.b": ""}),
    ("listen_ip_info", "10.0.0.1:26000", {"llm.listenIpInfo": "10.0.0.1:26000"}),
    ("listen_ip_info", "", {}),
    ("deploy_res_path", "/x", {"llm.deployResPath": "/x"}),
    ("deploy_res_path", "", {}),
    ("buf_pool_cfg", "{}", {"llm.BufPoolCfg": "{}"}),
    ("buf_pool_cfg", "", {}),
    ("output_max_size", 64, {"llm.OutputMaxSize": "64"}),
    ("enable_switch_role", True, {"llm.EnableSwitchRole": "1"}),
    ("enable_switch_role", False, {}),
    ("link_total_time", 0, {"llm.LinkTotalTime": "0"}),
    ("link_total_time", 2**32 - 1, {"llm.LinkTotalTime": "4294967295"}),
    ("link_retry_count", 1, {"llm.LinkRetryCount": "1"}),
    ("link_retry_count", 100, {"llm.LinkRetryCount": "100"}),
    ("enable_cache_manager", True, {"llm.EnableCacheManager": "1"}),
    ("enable_cache_manager", False, {"llm.EnableCacheManager": "0"}),
    ("enable_remote_cache_accessible", True, {"llm.EnableRemoteCacheAccessible": "1"}),
    ("enable_remote_cache_accessible", False, {"llm.EnableRemoteCacheAccessible": "0"}),
    ("mem_pool_cfg", '{"memory_size": 1024}', {"llm.MemPoolConfig": '{"memory_size": 1024}'}),
    ("mem_pool_cfg", "", {}),
    ("host_mem_pool_cfg", '{"memory_size": 1}', {"llm.HostMemPoolConfig": '{"memory_size": 1}'}),
    ("host_mem_pool_cfg", "", {}),
    ("rdma_traffic_class", 132, {"llm.RdmaTrafficClass": "132"}),
    ("rdma_service_level", 100, {"llm.RdmaServiceLevel": "100"}),
    ("local_comm_res", "", {"llm.LocalCommRes": ""}),
    ("local_comm_res", '{"version": "1.3"}', {"llm.LocalCommRes": '{"version": "1.3"}'}),
    ("transfer_backend", "hixl", {"llm.TransferBackend": "hixl"}),
    ("transfer_backend", "", {"llm.TransferBackend": ""}),
    ("global_resource_config", "", {"llm.GlobalResourceConfig": ""}),
    (
        "global_resource_config",
        '{"comm_resource_config.listen_port": 26666}',
        {"llm.GlobalResourceConfig": '{"comm_resource_config.listen_port": 26666}'},
    ),
]


@pytest.mark.parametrize(("prop", "value", "expected"), EMITTED)
def test_emitted_options(prop: str, value: Any, expected: dict[str, str]) -> None:
    cfg = LLMConfig()
    setattr(cfg, prop, value)
    assert getattr(cfg, prop) == value
    assert cfg.generate_options() == {**expected, "llm.MemoryUtilization": "0.95"}


@pytest.mark.parametrize("value", [0.5, 0.0, 1.0])
def test_mem_utilization_valid(value: float) -> None:
    cfg = LLMConfig()
    cfg.mem_utilization = value
    assert cfg.mem_utilization == value
    assert cfg.generate_options()["llm.MemoryUtilization"] == str(value)


def test_cluster_info_converts_listen_ips() -> None:
    cfg = LLMConfig()
    cfg.cluster_info = json.dumps(
        {"cluster_id": 1, "listen_ip_info": [{"ip": "127.0.0.1", "port": 26000}]}
    )
    stored = json.loads(cfg.cluster_info)
    assert stored == {"cluster_id": 1, "listen_ip_info": [{"ip": 16777343, "port": 26000}]}
    assert cfg.generate_options()["llm.ClusterInfo"] == cfg.cluster_info


# (property, value, exception, message regex)
SETTER_BAD: list[tuple[str, Any, type[Exception], str]] = [
    ("device_id", "0", TypeError, r"^device_id only support"),
    ("device_id", None, TypeError, r"^device_id only support"),
    ("device_id", True, TypeError, r"^device_id only support"),
    ("device_id", 1.0, TypeError, r"^device_id only support"),
    ("device_id", [0, "1"], TypeError, r"^device_id inner type only support"),
    ("device_id", [0, True], TypeError, r"^device_id inner type only support"),
    ("device_id", -1, LLMException, r"device_id should be greater than or equal to zero"),
    ("device_id", [0, -1], LLMException, r"device_id should be greater than or equal to zero"),
    ("device_id", 2**31, ValueError, r"^device_id's value is out of range"),
    ("device_id", (0, 2**31), ValueError, r"^device_id's value is out of range"),
    ("device_id", [], LLMException, r"device_id should not be empty"),
    ("sync_kv_timeout", 1.5, TypeError, r"^sync_kv_timeout only support \['int', 'str'\]"),
    ("sync_kv_timeout", None, TypeError, r"^sync_kv_timeout only support"),
    ("sync_kv_timeout", True, TypeError, r"^sync_kv_timeout only support"),
    ("sync_kv_timeout", "abc", LLMException, r"sync_kv_timeout must be a digit string"),
    ("sync_kv_timeout", "-1", LLMException, r"sync_kv_timeout must be a digit string"),
    ("sync_kv_timeout", "1.5", LLMException, r"sync_kv_timeout must be a digit string"),
    ("sync_kv_timeout", "0", LLMException, r"sync_kv_timeout should be greater than zero"),
    ("sync_kv_timeout", 0, LLMException, r"sync_kv_timeout should be greater than zero"),
    ("sync_kv_timeout", -5, LLMException, r"sync_kv_timeout should be greater than zero"),
    ("sync_kv_timeout", 2**31, ValueError, r"^sync_kv_timeout's value is out of range"),
    ("sync_kv_timeout", "2147483648", ValueError, r"^sync_kv_timeout's value is out of range"),
    ("ge_options", None, TypeError, r"^ge_options only support \['dict'\]"),
    ("ge_options", [("a", "b")], TypeError, r"^ge_options only support"),
    ("ge_options", {1: "a"}, TypeError, r"^ge_options dict key only support \['str'\]"),
    ("ge_options", {"a": 1}, TypeError, r"^ge_options dict value only support \['str'\]"),
    ("listen_ip_info", 1, TypeError, r"^listen_ip_info only support \['str'\]"),
    ("deploy_res_path", b"x", TypeError, r"^deploy_res_path only support"),
    ("buf_pool_cfg", {}, TypeError, r"^buf_pool_cfg only support"),
    ("output_max_size", "1", TypeError, r"^output_max_size only support \['int'\]"),
    ("output_max_size", True, TypeError, r"^output_max_size only support"),
    ("mem_utilization", 1, TypeError, r"^mem_utilization only support \['float'\]"),
    ("mem_utilization", 0, TypeError, r"^mem_utilization only support"),
    ("mem_utilization", None, TypeError, r"^mem_utilization only support"),
    ("mem_utilization", "0.5", TypeError, r"^mem_utilization only support"),
    ("mem_utilization", 1.5, LLMException, r"mem_utilization must be in range \[0, 1\]"),
    ("mem_utilization", -0.1, LLMException, r"mem_utilization must be in range"),
    ("mem_utilization", float("nan"), LLMException, r"mem_utilization must be in range"),
    ("cluster_info", None, TypeError, r"^cluster_info only support \['str'\]"),
    ("cluster_info", {"a": 1}, TypeError, r"^cluster_info only support"),
    (
        "cluster_info",
        '{"listen_ip_info": [{"ip": "bad"}]}',
        RuntimeError,
        r"^Can not parse ip str:bad$",
    ),
    ("enable_switch_role", 1, TypeError, r"^enable_switch_role only support \['bool'\]"),
    ("link_total_time", "1", TypeError, r"^link_total_time only support \['int'\]"),
    ("link_total_time", None, TypeError, r"^link_total_time only support"),
    ("link_total_time", True, TypeError, r"^link_total_time only support"),
    (
        "link_total_time",
        -1,
        LLMException,
        r"link_total_time should be an integer in \[0, 2\^32-1\]",
    ),
    ("link_total_time", 2**32, LLMException, r"link_total_time should be"),
    ("link_retry_count", 1.0, TypeError, r"^link_retry_count only support"),
    ("link_retry_count", 0, LLMException, r"link_retry_count should be an integer in \[1, 100\]"),
    ("link_retry_count", 101, LLMException, r"link_retry_count should be"),
    ("enable_cache_manager", 1, TypeError, r"^enable_cache_manager only support \['bool'\]"),
    ("enable_cache_manager", "1", TypeError, r"^enable_cache_manager only support"),
    (
        "enable_remote_cache_accessible",
        0,
        TypeError,
        r"^enable_remote_cache_accessible only support",
    ),
    ("mem_pool_cfg", {"memory_size": 1}, TypeError, r"^mem_pool_cfg only support \['str'\]"),
    ("host_mem_pool_cfg", 1, TypeError, r"^host_mem_pool_cfg only support"),
    ("rdma_traffic_class", -1, ValueError, r"^rdma_traffic_class's value is out of range"),
    ("rdma_traffic_class", 2**32, ValueError, r"is not a uint32 value"),
    ("rdma_traffic_class", "1", TypeError, r"^rdma_traffic_class only support"),
    ("rdma_traffic_class", None, TypeError, r"^rdma_traffic_class only support"),
    ("rdma_service_level", True, TypeError, r"^rdma_service_level only support"),
    ("rdma_service_level", -1, ValueError, r"^rdma_service_level's value"),
    ("local_comm_res", 1, TypeError, r"^local_comm_res only support \['str'\]"),
    ("local_comm_res", {}, TypeError, r"^local_comm_res only support"),
    ("transfer_backend", 1, TypeError, r"^transfer_backend only support \['str'\]"),
    ("global_resource_config", 123, TypeError, r"^global_resource_config only support \['str'\]"),
    (
        "global_resource_config",
        {"key": "value"},
        TypeError,
        r"^global_resource_config only support",
    ),
    ("global_resource_config", [1, 2], TypeError, r"^global_resource_config only support"),
]


@pytest.mark.parametrize(("prop", "value", "exc", "pattern"), SETTER_BAD)
def test_setter_rejects(prop: str, value: Any, exc: type[Exception], pattern: str) -> None:
    cfg = LLMConfig()
    before = getattr(cfg, prop)
    with pytest.raises(exc, match=pattern) as info:
        setattr(cfg, prop, value)
    if isinstance(info.value, LLMException):
        assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
    assert getattr(cfg, prop) == before


def test_options_is_not_writable() -> None:
    with pytest.raises(AttributeError):
        LLMConfig().options = {}  # type: ignore[misc]


# ---- keys present only once set ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("prop", "value", "key"),
    [
        ("enable_remote_cache_accessible", False, "llm.EnableRemoteCacheAccessible"),
        ("enable_cache_manager", False, "llm.EnableCacheManager"),
        ("global_resource_config", "", "llm.GlobalResourceConfig"),
        ("local_comm_res", "", "llm.LocalCommRes"),
        ("transfer_backend", "", "llm.TransferBackend"),
        ("link_total_time", 0, "llm.LinkTotalTime"),
        ("link_retry_count", 1, "llm.LinkRetryCount"),
        ("rdma_traffic_class", 0, "llm.RdmaTrafficClass"),
        ("rdma_service_level", 0, "llm.RdmaServiceLevel"),
        ("sync_kv_timeout", 1000, "llm.SyncKvCacheWaitTime"),
    ],
)
def test_key_absent_until_set(prop: str, value: Any, key: str) -> None:
    cfg = LLMConfig()
    cfg.device_id = 0
    assert key not in cfg.generate_options()
    setattr(cfg, prop, value)
    assert key in cfg.generate_options()


@pytest.mark.parametrize(
    ("prop", "key"),
    [
        ("local_comm_res", "llm.LocalCommRes"),
        ("global_resource_config", "llm.GlobalResourceConfig"),
        ("enable_cache_manager", "llm.EnableCacheManager"),
        ("listen_ip_info", "llm.listenIpInfo"),
        ("output_max_size", "llm.OutputMaxSize"),
    ],
)
def test_none_unsets_but_emitted_keys_stay(prop: str, key: str) -> None:
    cfg = LLMConfig()
    setattr(cfg, prop, {"enable_cache_manager": True, "output_max_size": 8}.get(prop, "x"))
    opts = cfg.generate_options()
    assert key in opts
    setattr(cfg, prop, None)
    assert getattr(cfg, prop) == dict(DEFAULTS)[prop]
    assert key in cfg.generate_options()  # persistent dict: keys are never removed
    assert key not in LLMConfig().generate_options()


def test_generate_options_is_persistent_and_accumulates() -> None:
    cfg = LLMConfig()
    cfg.device_id = 0
    first = cfg.generate_options()
    assert cfg.options is first
    cfg.listen_ip_info = "1.2.3.4:5"
    second = cfg.gen_options()
    assert second is first
    assert second["llm.listenIpInfo"] == "1.2.3.4:5"
    assert second["ge.exec.deviceId"] == "0"
    cfg.device_id = 2
    assert cfg.generate_options()["ge.exec.deviceId"] == "2"
    cfg.listen_ip_info = ""
    assert cfg.generate_options()["llm.listenIpInfo"] == "1.2.3.4:5"


def test_ge_options_first_named_options_win() -> None:
    cfg = LLMConfig()
    cfg.ge_options = {"ge.custom": "v", "llm.MemoryUtilization": "0.1", "ge.exec.deviceId": "9"}
    cfg.device_id = 1
    opts = cfg.generate_options()
    assert list(opts)[:3] == ["ge.custom", "llm.MemoryUtilization", "ge.exec.deviceId"]
    assert opts["llm.MemoryUtilization"] == "0.95"
    assert opts["ge.exec.deviceId"] == "1"
    assert opts["ge.custom"] == "v"


def test_typical_cache_manager_options() -> None:
    cfg = LLMConfig()
    cfg.device_id = 0
    cfg.enable_cache_manager = True
    cfg.mem_pool_cfg = '{"memory_size": 1048576}'
    cfg.listen_ip_info = "10.0.0.1:26000"
    cfg.enable_remote_cache_accessible = True
    cfg.transfer_backend = "hixl"
    assert cfg.generate_options() == {
        "ge.exec.deviceId": "0",
        "ge.session_device_id": "0",
        "llm.listenIpInfo": "10.0.0.1:26000",
        "llm.MemPoolConfig": '{"memory_size": 1048576}',
        "llm.MemoryUtilization": "0.95",
        "llm.EnableCacheManager": "1",
        "llm.EnableRemoteCacheAccessible": "1",
        "llm.TransferBackend": "hixl",
    }


# ---- ip helpers and LLMClusterInfo ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("127.0.0.1", 16777343),
        ("0.0.0.0", 0),
        ("255.255.255.255", 2**32 - 1),
        ("10.0.0.1", 0x0100000A),
    ],
)
def test_ip_conversion(text: str, value: int) -> None:
    assert trans_str_ip(text) == value
    assert int_to_ip(value) == text


@pytest.mark.parametrize("value", [0, 7, 2**40])
def test_trans_str_ip_passes_ints(value: int) -> None:
    assert trans_str_ip(value) == value


@pytest.mark.parametrize("text", ["bad", "1.2.3.4.5", "256.0.0.1", "", "::1", "1.2.3.4\x00"])
def test_trans_str_ip_rejects(text: str) -> None:
    with pytest.raises(RuntimeError, match=r"^Can not parse ip str:") as info:
        trans_str_ip(text)
    assert not isinstance(info.value, LLMException)


@pytest.mark.parametrize(
    ("value", "exc"), [(-1, ValueError), (2**32, ValueError), ("1", TypeError), (True, TypeError)]
)
def test_int_to_ip_rejects(value: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        int_to_ip(value)


def test_cluster_info_defaults() -> None:
    info = LLMClusterInfo()
    assert info.remote_cluster_id is None
    assert info.remote_role_type is None
    assert info.local_ip_info_list == []
    assert info.remote_ip_info_list == []


def test_cluster_info_setters_and_append() -> None:
    info = LLMClusterInfo()
    info.remote_cluster_id = 2**64 - 1
    info.remote_role_type = LLMRole.DECODER
    assert info.remote_role_type is LLMRole.DECODER
    info.remote_role_type = 1
    info.append_local_ip_info("127.0.0.1", 26000)
    info.append_remote_ip_info(16777343, 0)
    info.append_remote_ip_info("10.0.0.1", 65535)
    assert info.remote_cluster_id == 2**64 - 1
    assert info.local_ip_info_list == [(16777343, 26000)]
    assert info.remote_ip_info_list == [(16777343, 0), (0x0100000A, 65535)]


@pytest.mark.parametrize(
    ("action", "exc", "pattern"),
    [
        (
            lambda i: setattr(i, "remote_cluster_id", -1),
            ValueError,
            r"^remote_cluster_id's value is out of range",
        ),
        (
            lambda i: setattr(i, "remote_cluster_id", None),
            TypeError,
            r"^remote_cluster_id only support",
        ),
        (
            lambda i: setattr(i, "remote_cluster_id", "1"),
            TypeError,
            r"^remote_cluster_id only support",
        ),
        (
            lambda i: setattr(i, "remote_role_type", "PROMPT"),
            TypeError,
            r"^remote_role_type only support \['LLMRole', 'int'\]",
        ),
        (
            lambda i: setattr(i, "remote_role_type", True),
            TypeError,
            r"^remote_role_type only support",
        ),
        (lambda i: i.append_local_ip_info(1.0, 1), TypeError, r"^ip only support \['str', 'int'\]"),
        (lambda i: i.append_remote_ip_info(None, 1), TypeError, r"^ip only support"),
        (lambda i: i.append_local_ip_info("1.2.3.4", "1"), TypeError, r"^port only support"),
        (
            lambda i: i.append_local_ip_info("1.2.3.4", 65536),
            ValueError,
            r"^port's value is out of range,65536 is not a uint16",
        ),
        (
            lambda i: i.append_remote_ip_info("1.2.3.4", -1),
            ValueError,
            r"^port's value is out of range",
        ),
        (lambda i: i.append_remote_ip_info("x.y", 1), RuntimeError, r"^Can not parse ip str:x\.y$"),
        # the port is checked before the ip string is parsed
        (lambda i: i.append_remote_ip_info("x.y", -1), ValueError, r"^port"),
    ],
)
def test_cluster_info_rejects(action: Any, exc: type[Exception], pattern: str) -> None:
    info = LLMClusterInfo()
    with pytest.raises(exc, match=pattern):
        action(info)
    assert info.local_ip_info_list == [] and info.remote_ip_info_list == []


def test_init_waits_longer_for_larger_pools() -> None:
    """Init's deadline grows with the pools it creates (the daemon pre-faults and
    writes every page first); pool options it will refuse add nothing."""
    from hixl_client._transport import CONTROL_TIMEOUT_S
    from hixl_client.llm_datadist import POOL_SETUP_S_PER_GIB, init_timeout_s

    config = LLMConfig()
    config.mem_pool_cfg = json.dumps({"memory_size": 10 << 30})
    config.host_mem_pool_cfg = json.dumps({"memory_size": 6 << 30})
    assert init_timeout_s(config.generate_options()) == CONTROL_TIMEOUT_S + 16 * POOL_SETUP_S_PER_GIB
    assert init_timeout_s({}) == CONTROL_TIMEOUT_S
    for bad in ("not json", "[]", '{"memory_size": true}', '{"memory_size": -1}', "{}"):
        assert init_timeout_s({"llm.MemPoolConfig": bad}) == CONTROL_TIMEOUT_S


def test_the_control_timeout_option() -> None:
    """hixl.ControlCallTimeout (ms) bounds the calls without an LLM-DataDist timeout."""
    from hixl_client._transport import CONTROL_TIMEOUT_OPTION, CONTROL_TIMEOUT_S
    from hixl_client.llm_datadist import control_timeout_s, init_timeout_s

    assert control_timeout_s({}) == CONTROL_TIMEOUT_S
    assert control_timeout_s({CONTROL_TIMEOUT_OPTION: "2500"}) == 2.5
    assert init_timeout_s({}, 2.5) == 2.5
    for bad in ("0", "-1", "1.5", "abc", "", str(2**31)):
        with pytest.raises(LLMException) as info:
            control_timeout_s({CONTROL_TIMEOUT_OPTION: bad})
        assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
