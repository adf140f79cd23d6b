"""`LLMConfig`, the options builder for ``LLMDataDist.init``, and `LLMClusterInfo`.

`LLMConfig` mirrors LLM-DataDist's ``LlmConfig``: every setter validates, and
`LLMConfig.generate_options` merges into one persistent dict that it returns
(keys are never removed; repeated calls accumulate). Some keys are emitted
only when their value is non-empty, others whenever the property was set; the
table in the spec (section 2.6) is the contract.

Setting a string or bool property to None puts it back to "not set", as the
reference's validators let None through; numeric properties reject None.
"""

from __future__ import annotations

import json
import socket

from hixl_client._validation import (
    UINT32_MAX,
    check_dict,
    check_int32,
    check_isinstance,
    check_uint16,
    check_uint32,
    check_uint64,
)
from hixl_client.status import raise_if_false
from hixl_client.types import LLMRole

__all__ = ["LLMClusterInfo", "LLMConfig", "LlmConfig", "int_to_ip", "trans_str_ip"]


def trans_str_ip(ip: str | int) -> int:
    """Turn a dotted IPv4 string into the integer the native layer expects.

    The four address bytes are read as a little-endian uint32, so
    ``"127.0.0.1"`` becomes ``0x0100007F``.

    Args:
        ip: an IPv4 string, or an int which is returned unchanged.

    Returns:
        The integer form.

    Raises:
        RuntimeError: ``"Can not parse ip str:..."`` for an unparseable string.
    """
    if not isinstance(ip, str):
        return ip
    try:
        packed = socket.inet_aton(ip)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"Can not parse ip str:{ip}") from exc
    return int.from_bytes(packed, "little")


def int_to_ip(value: int) -> str:
    """Turn the integer form of `trans_str_ip` back into ``"a.b.c.d"``.

    Args:
        value: a uint32 as produced by `trans_str_ip`.

    Returns:
        The dotted IPv4 string.

    Raises:
        TypeError: ``value`` is not an int.
        ValueError: ``value`` is outside uint32.
    """
    check_uint32("ip", value)
    return socket.inet_ntoa(value.to_bytes(4, "little"))


class LLMClusterInfo:
    """A remote cluster to link to or unlink from, with its addresses."""

    def __init__(self) -> None:
        self._remote_cluster_id: int | None = None
        self._remote_role_type: LLMRole | int | None = None
        self._local_ip_info_list: list[tuple[int, int]] = []
        self._remote_ip_info_list: list[tuple[int, int]] = []

    @property
    def remote_cluster_id(self) -> int | None:
        """The remote cluster id (uint64), None until set."""
        return self._remote_cluster_id

    @remote_cluster_id.setter
    def remote_cluster_id(self, value: int) -> None:
        check_uint64("remote_cluster_id", value)
        self._remote_cluster_id = value

    @property
    def remote_role_type(self) -> LLMRole | int | None:
        """A role label for the remote; recorded but never sent (role 0 goes on the wire)."""
        return self._remote_role_type

    @remote_role_type.setter
    def remote_role_type(self, value: LLMRole | int | None) -> None:
        check_isinstance("remote_role_type", value, [LLMRole, int])
        self._remote_role_type = value

    @property
    def local_ip_info_list(self) -> list[tuple[int, int]]:
        """Local ``(ip_int, port)`` pairs, appended with `append_local_ip_info`."""
        return self._local_ip_info_list

    @property
    def remote_ip_info_list(self) -> list[tuple[int, int]]:
        """Remote ``(ip_int, port)`` pairs, appended with `append_remote_ip_info`."""
        return self._remote_ip_info_list

    @staticmethod
    def _ip_info(ip: str | int, port: int) -> tuple[int, int]:
        check_isinstance("ip", ip, [str, int], allow_none=False)
        check_uint16("port", port)
        return trans_str_ip(ip), port

    def append_local_ip_info(self, ip: str | int, port: int) -> None:
        """Add a local address.

        Args:
            ip: an IPv4 string or its integer form (see `trans_str_ip`).
            port: a uint16 port.

        Raises:
            TypeError: ``ip`` is not a str or int, or ``port`` is not an int.
            ValueError: ``port`` is outside uint16.
            RuntimeError: ``ip`` is an unparseable string.
        """
        self._local_ip_info_list.append(self._ip_info(ip, port))

    def append_remote_ip_info(self, ip: str | int, port: int) -> None:
        """Add a remote address (link needs exactly one).

        Args:
            ip: an IPv4 string or its integer form (see `trans_str_ip`).
            port: a uint16 port.

        Raises:
            TypeError: ``ip`` is not a str or int, or ``port`` is not an int.
            ValueError: ``port`` is outside uint16.
            RuntimeError: ``ip`` is an unparseable string.
        """
        self._remote_ip_info_list.append(self._ip_info(ip, port))

    @classmethod
    def for_peer(cls, remote_cluster_id: int, peer_address: str) -> LLMClusterInfo:
        """hixl extension: what ``link_clusters`` takes to reach cluster
        ``remote_cluster_id`` at a daemon's ``"host:port"`` peer address (another
        client's ``LLMDataDist.peer_address``, or a cluster's ``listen_ip_info``).

        Raises:
            ValueError: ``peer_address`` is not ``"host:port"``.
        """
        host, separator, port = peer_address.rpartition(":")
        if not separator or not port.isdigit():
            raise ValueError(f"peer_address must be 'host:port', got {peer_address!r}")
        info = cls()
        info.remote_cluster_id = remote_cluster_id
        info.append_local_ip_info("127.0.0.1", 0)
        info.append_remote_ip_info(host.strip("[]"), int(port))
        return info


def _optional_str(name: str, value: str | None) -> str | None:
    check_isinstance(name, value, str)
    return value


def _optional_bool(name: str, value: bool | None) -> bool | None:
    check_isinstance(name, value, bool)
    return value


class LLMConfig:
    """Builds the options dict for ``LLMDataDist.init``; every setter validates.

    ``LlmConfig`` is the same class under LLM-DataDist's older spelling.
    """

    def __init__(self) -> None:
        self._options: dict[str, str] = {}
        self._device_id: int | list[int] | tuple[int, ...] | None = None
        self._sync_kv_timeout: int | str | None = None
        self._ge_options: dict[str, str] = {}
        self._listen_ip_info = ""
        self._deploy_res_path = ""
        self._buf_pool_cfg = ""
        self._output_max_size: int | None = None
        self._mem_utilization = 0.95
        self._cluster_info = ""
        self._enable_switch_role = False
        self._link_total_time: int | None = None
        self._link_retry_count: int | None = None
        self._enable_cache_manager: bool | None = None
        self._enable_remote_cache_accessible: bool | None = None
        self._mem_pool_cfg = ""
        self._host_mem_pool_cfg = ""
        self._rdma_traffic_class: int | None = None
        self._rdma_service_level: int | None = None
        self._local_comm_res: str | None = None
        self._transfer_backend: str | None = None
        self._global_resource_config: str | None = None

    def generate_options(self) -> dict[str, str]:
        """Merge the configured values into `options` and return that same dict.

        ``ge_options`` go in first so that the named properties win over them.

        Returns:
            The persistent options dict (keys accumulate across calls).
        """
        opts = self._options
        opts.update(self._ge_options)
        if self._device_id is not None:
            if isinstance(self._device_id, int):
                opts["ge.exec.deviceId"] = str(self._device_id)
                opts["ge.session_device_id"] = str(self._device_id)
            else:
                opts["ge.exec.deviceId"] = ";".join(str(dev) for dev in self._device_id)
                opts["ge.session_device_id"] = str(self._device_id[0])
        if self._sync_kv_timeout is not None:
            opts["llm.SyncKvCacheWaitTime"] = str(self._sync_kv_timeout)
        # Emitted only when non-empty / non-zero:
        for key, text in (
            ("llm.listenIpInfo", self._listen_ip_info),
            ("llm.deployResPath", self._deploy_res_path),
            ("llm.BufPoolCfg", self._buf_pool_cfg),
            ("llm.OutputMaxSize", self._output_max_size),
            ("llm.ClusterInfo", self._cluster_info),
            ("llm.MemPoolConfig", self._mem_pool_cfg),
            ("llm.HostMemPoolConfig", self._host_mem_pool_cfg),
        ):
            if text:
                opts[key] = str(text)
        opts["llm.MemoryUtilization"] = str(self._mem_utilization)
        if self._enable_switch_role:
            opts["llm.EnableSwitchRole"] = "1"
        # Emitted whenever set, even to "" / 0 / False:
        for key, value in (
            ("llm.LinkTotalTime", self._link_total_time),
            ("llm.LinkRetryCount", self._link_retry_count),
            ("llm.EnableCacheManager", self._enable_cache_manager),
            ("llm.EnableRemoteCacheAccessible", self._enable_remote_cache_accessible),
            ("llm.RdmaTrafficClass", self._rdma_traffic_class),
            ("llm.RdmaServiceLevel", self._rdma_service_level),
            ("llm.LocalCommRes", self._local_comm_res),
            ("llm.TransferBackend", self._transfer_backend),
            ("llm.GlobalResourceConfig", self._global_resource_config),
        ):
            if isinstance(value, bool):
                opts[key] = "1" if value else "0"
            elif value is not None:
                opts[key] = str(value)
        return opts

    def gen_options(self) -> dict[str, str]:
        """Alias of `generate_options`.

        Returns:
            The persistent options dict.
        """
        return self.generate_options()

    @property
    def options(self) -> dict[str, str]:
        """The accumulated options dict (empty until `generate_options` runs)."""
        return self._options

    @property
    def device_id(self) -> int | list[int] | tuple[int, ...] | None:
        """The device id, or a list/tuple of them (only the first is the session device)."""
        return self._device_id

    @device_id.setter
    def device_id(self, value: int | list[int] | tuple[int, ...]) -> None:
        check_isinstance("device_id", value, [int, list, tuple], allow_none=False)
        ids = (
            [value]
            if isinstance(value, int)
            else check_isinstance("device_id", value, [list, tuple], int)
        )
        # An empty list would leave no session device to emit.
        raise_if_false(len(ids) > 0, "device_id should not be empty.")
        for dev in ids:
            raise_if_false(
                dev >= 0, "device_id should be greater than or equal to zero, but got {0}.", dev
            )
            check_int32("device_id", dev)
        self._device_id = value

    @property
    def sync_kv_timeout(self) -> int | str | None:
        """Timeout of pull/push in ms, as given (int or digit string)."""
        return self._sync_kv_timeout

    @sync_kv_timeout.setter
    def sync_kv_timeout(self, value: int | str) -> None:
        check_isinstance("sync_kv_timeout", value, [int, str], allow_none=False)
        if isinstance(value, str):
            raise_if_false(
                value.isdigit(), "sync_kv_timeout must be a digit string, but got {0!r}.", value
            )
        raise_if_false(
            int(value) > 0, "sync_kv_timeout should be greater than zero, but got {0}.", value
        )
        check_int32("sync_kv_timeout", int(value))
        self._sync_kv_timeout = value

    @property
    def ge_options(self) -> dict[str, str]:
        """Extra raw options merged verbatim (before the named ones)."""
        return self._ge_options

    @ge_options.setter
    def ge_options(self, value: dict[str, str]) -> None:
        check_isinstance("ge_options", value, dict, allow_none=False)
        check_dict("ge_options", value, str, str)
        self._ge_options = value

    @property
    def listen_ip_info(self) -> str:
        """``"ip:port"`` this instance listens on (empty: do not listen)."""
        return self._listen_ip_info

    @listen_ip_info.setter
    def listen_ip_info(self, value: str | None) -> None:
        self._listen_ip_info = _optional_str("listen_ip_info", value) or ""

    @property
    def deploy_res_path(self) -> str:
        """Deployment resource path (legacy v1 option)."""
        return self._deploy_res_path

    @deploy_res_path.setter
    def deploy_res_path(self, value: str | None) -> None:
        self._deploy_res_path = _optional_str("deploy_res_path", value) or ""

    @property
    def buf_pool_cfg(self) -> str:
        """Buffer pool configuration JSON."""
        return self._buf_pool_cfg

    @buf_pool_cfg.setter
    def buf_pool_cfg(self, value: str | None) -> None:
        self._buf_pool_cfg = _optional_str("buf_pool_cfg", value) or ""

    @property
    def output_max_size(self) -> int | None:
        """Maximum output size (legacy v1 option)."""
        return self._output_max_size

    @output_max_size.setter
    def output_max_size(self, value: int | None) -> None:
        self._output_max_size = check_isinstance("output_max_size", value, int)

    @property
    def mem_utilization(self) -> float:
        """Fraction of device memory to use, a float in [0.0, 1.0]; always emitted."""
        return self._mem_utilization

    @mem_utilization.setter
    def mem_utilization(self, value: float) -> None:
        # float only: the reference rejects ints such as 1.
        check_isinstance("mem_utilization", value, float, allow_none=False)
        raise_if_false(
            0.0 <= value <= 1.0, "mem_utilization must be in range [0, 1], but got {0}.", value
        )
        self._mem_utilization = value

    @property
    def cluster_info(self) -> str:
        """Cluster description JSON (legacy v1), stored with its listen IPs in integer form."""
        return self._cluster_info

    @cluster_info.setter
    def cluster_info(self, value: str) -> None:
        check_isinstance("cluster_info", value, str, allow_none=False)
        parsed = json.loads(value)
        listen = parsed.get("listen_ip_info") if isinstance(parsed, dict) else None
        for entry in listen if isinstance(listen, list) else ():
            if isinstance(entry, dict) and "ip" in entry:
                entry["ip"] = trans_str_ip(entry["ip"])
        self._cluster_info = json.dumps(parsed)

    @property
    def enable_switch_role(self) -> bool:
        """Allow switch_role (legacy v1); emitted only when True."""
        return self._enable_switch_role

    @enable_switch_role.setter
    def enable_switch_role(self, value: bool | None) -> None:
        self._enable_switch_role = bool(_optional_bool("enable_switch_role", value))

    @property
    def link_total_time(self) -> int:
        """Total link time in seconds, in [0, 2**32 - 1] (0: HCCL's default); 0 until set."""
        return 0 if self._link_total_time is None else self._link_total_time

    @link_total_time.setter
    def link_total_time(self, value: int) -> None:
        check_isinstance("link_total_time", value, int, allow_none=False)
        raise_if_false(
            0 <= value <= UINT32_MAX,
            "link_total_time should be an integer in [0, 2^32-1], but got {0}.",
            value,
        )
        self._link_total_time = value

    @property
    def link_retry_count(self) -> int:
        """Link retries, in [1, 100]; 1 until set."""
        return 1 if self._link_retry_count is None else self._link_retry_count

    @link_retry_count.setter
    def link_retry_count(self, value: int) -> None:
        check_isinstance("link_retry_count", value, int, allow_none=False)
        raise_if_false(
            1 <= value <= 100,
            "link_retry_count should be an integer in [1, 100], but got {0}.",
            value,
        )
        self._link_retry_count = value

    @property
    def enable_cache_manager(self) -> bool:
        """Cache-manager (v2) mode; emitted only once set."""
        return bool(self._enable_cache_manager)

    @enable_cache_manager.setter
    def enable_cache_manager(self, value: bool | None) -> None:
        self._enable_cache_manager = _optional_bool("enable_cache_manager", value)

    @property
    def enable_remote_cache_accessible(self) -> bool:
        """Let peers address this instance's caches by key; emitted only once set."""
        return bool(self._enable_remote_cache_accessible)

    @enable_remote_cache_accessible.setter
    def enable_remote_cache_accessible(self, value: bool | None) -> None:
        self._enable_remote_cache_accessible = _optional_bool(
            "enable_remote_cache_accessible", value
        )

    @property
    def mem_pool_cfg(self) -> str:
        """Device pool JSON, ``{"memory_size": N, "page_shift": 16}``."""
        return self._mem_pool_cfg

    @mem_pool_cfg.setter
    def mem_pool_cfg(self, value: str | None) -> None:
        self._mem_pool_cfg = _optional_str("mem_pool_cfg", value) or ""

    @property
    def host_mem_pool_cfg(self) -> str:
        """Host pool JSON, same format as `mem_pool_cfg`."""
        return self._host_mem_pool_cfg

    @host_mem_pool_cfg.setter
    def host_mem_pool_cfg(self, value: str | None) -> None:
        self._host_mem_pool_cfg = _optional_str("host_mem_pool_cfg", value) or ""

    @property
    def rdma_traffic_class(self) -> int | None:
        """RDMA traffic class (uint32), overriding HCCL_RDMA_TC."""
        return self._rdma_traffic_class

    @rdma_traffic_class.setter
    def rdma_traffic_class(self, value: int) -> None:
        check_uint32("rdma_traffic_class", value)
        self._rdma_traffic_class = value

    @property
    def rdma_service_level(self) -> int | None:
        """RDMA service level (uint32), overriding HCCL_RDMA_SL."""
        return self._rdma_service_level

    @rdma_service_level.setter
    def rdma_service_level(self, value: int) -> None:
        check_uint32("rdma_service_level", value)
        self._rdma_service_level = value

    @property
    def local_comm_res(self) -> str:
        """Local communication resource JSON; emitted whenever set, even to ``""``."""
        return self._local_comm_res or ""

    @local_comm_res.setter
    def local_comm_res(self, value: str | None) -> None:
        self._local_comm_res = _optional_str("local_comm_res", value)

    @property
    def transfer_backend(self) -> str:
        """Transfer backend name (only ``"hixl"`` is valid); emitted whenever set."""
        return self._transfer_backend or ""

    @transfer_backend.setter
    def transfer_backend(self, value: str | None) -> None:
        self._transfer_backend = _optional_str("transfer_backend", value)

    @property
    def global_resource_config(self) -> str:
        """Resource JSON passed through to the transfer engine; emitted whenever set."""
        return self._global_resource_config or ""

    @global_resource_config.setter
    def global_resource_config(self, value: str | None) -> None:
        self._global_resource_config = _optional_str("global_resource_config", value)


LlmConfig = LLMConfig
