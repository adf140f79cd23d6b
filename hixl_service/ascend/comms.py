"""How the hccl backend's link communicators are set up: HCCL's network
settings, this daemon's rank descriptions, a link's two-rank table, and the
device memory each communicator's buffer takes.

HCCL reads its network settings from the environment (``HCCL_IF_IP``,
``HCCL_SOCKET_IFNAME``, ``HCCL_IF_BASE_PORT``, ``HCCL_CONNECT_TIMEOUT``,
``HCCL_BUFFSIZE``), so `apply_environment` sets them from ``[ascend]`` before
CANN is loaded; the buffer size also goes into every communicator's
``HcclCommConfig``. A rank table ("Configuring Resource Information Through
the Ranktable File", CANN HCCL user guide) names each rank's host
(``server_id``), physical device (``device_id``), device NIC address
(``device_ip``) and ``rank_id``; `rank_table` builds the two-rank one of a
link from both daemons' `RankInfo` (the far one comes over
``Peer.HcclRankInfo``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .gate import CreationGate

if TYPE_CHECKING:
    from ..config import AscendConfig

MIB = 1 << 20
HCCN_CONF = Path("/etc/hccn.conf")
# HCCL_IF_BASE_PORT takes this many ports from the base (CANN 8.2 and later;
# 16 before), "HCCL_IF_BASE_PORT", CANN environment variable reference.
HCCL_HOST_PORTS = 32
HCCL_DEFAULT_BASE_PORT = 60000


def hccl_environment(config: AscendConfig) -> dict[str, str]:
    """The HCCL environment variables ``[ascend]`` sets (unset keys are left alone)."""
    env = {"HCCL_BUFFSIZE": str(config.hccl_buffer_mb)}
    if config.if_ip is not None:
        env["HCCL_IF_IP"] = config.if_ip
    if config.socket_ifname is not None:
        env["HCCL_SOCKET_IFNAME"] = config.socket_ifname
    if config.base_port is not None:
        env["HCCL_IF_BASE_PORT"] = str(config.base_port)
    if config.connect_timeout_s is not None:
        env["HCCL_CONNECT_TIMEOUT"] = str(config.connect_timeout_s)
    return env


def apply_environment(config: AscendConfig,
                      environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set HCCL's variables before its first call; returns what was set."""
    target = os.environ if environ is None else environ
    env = hccl_environment(config)
    target.update(env)
    return env


def check_network(config: AscendConfig) -> None:
    """Check the host-dependent network settings at start.

    Raises:
        ValueError: ``if_ip`` is not an address of this host, or no interface
            matches ``socket_ifname``.
    """
    if config.if_ip is not None:
        family = socket.AF_INET6 if ipaddress.ip_address(config.if_ip).version == 6 \
            else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.bind((config.if_ip, 0))
        except OSError as exc:
            raise ValueError(f"ascend.if_ip = {config.if_ip} is not an address of this host "
                             f"({exc.strerror})") from None
    if config.socket_ifname is not None:
        spec = config.socket_ifname
        exact, exclude = spec.startswith("="), spec.startswith("^")
        if exclude:
            return  # any interface but these: nothing to find
        names = spec.lstrip("=").split(",")
        have = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
        for name in names:
            if not any(h == name if exact else h.startswith(name) for h in have):
                how = "named" if exact else "starting with"
                raise ValueError(f"ascend.socket_ifname: no interface {how} {name!r} on this "
                                 f"host (have {', '.join(have) or 'none'})")


def host_address(host: str) -> str:
    """The IP address of a host name (as given, if it is one), for ``server_id``;
    127.0.0.1 for a wildcard or a name that does not resolve."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            return socket.gethostbyname(host)
        except OSError:
            return "127.0.0.1"
    return "127.0.0.1" if address.is_unspecified else str(address)


def hccn_addresses(path: Path = HCCN_CONF) -> dict[int, str]:
    """Device NIC addresses of ``/etc/hccn.conf`` (``address_<physical id>=<ip>``)."""
    found: dict[int, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        key, _, value = line.strip().partition("=")
        if key.startswith("address_") and key[8:].isdigit() and value:
            found[int(key[8:])] = value.strip()
    return found


# Atlas A3 SoCs, whose rank tables are version 1.2 with super-pod fields
# (hixl rank_table_generator.cc, kV2Version; hcomm topoinfo_detect.cc and
# topoinfo_ranktableConcise.cc read super_device_id and super_pod_list).
A3_SOC_PREFIX = "Ascend910_93"
# Atlas A2 SoCs (hixl hixl_utils.cc, kSocV2): across hosts HCCL reaches the
# peer through the device NICs (RoCE), so each rank needs its device_ip.
A2_SOC_PREFIX = "Ascend910B"


@dataclass(frozen=True)
class RankInfo:
    """One rank of a link as a rank table names it."""

    host_ip: str    # server_id: the host HCCL's sockets use
    device_id: int  # the physical device id
    device_ip: str  # the device NIC's address; "" where none is known
    soc: str = ""   # aclrtGetSocName; "" where unknown
    # A3 only (aclrtGetDeviceInfo): the device's id in its super pod, and the pod's
    super_device_id: int | None = None
    super_pod_id: int | None = None

    @property
    def super_pod(self) -> bool:
        """Whether this rank is on an A3 product with its super-pod ids known."""
        return (self.soc.startswith(A3_SOC_PREFIX) and self.super_device_id is not None
                and self.super_pod_id is not None)

    def check(self) -> None:
        """Raises ValueError for a description a rank table cannot hold."""
        ipaddress.ip_address(self.host_ip)
        if self.device_ip:
            ipaddress.ip_address(self.device_ip)
        if not 0 <= self.device_id < 1 << 16:
            raise ValueError(f"device id {self.device_id} out of range")
        for name in ("super_device_id", "super_pod_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1 << 32:
                raise ValueError(f"{name} {value} out of range")


def rank_table(rank0: RankInfo, rank1: RankInfo) -> str:
    """The JSON rank table of a two-rank communicator (rank_id 0 and 1).

    Ranks on one host share a ``server_list`` entry; HCCL's format lists each
    server once. When both ranks are on A3 products (Ascend910_93xx) the table
    is version 1.2, as HIXL writes it (rank_table_generator_v2.cc): each device
    has its ``super_device_id`` and ``super_pod_list`` names each super pod's
    servers; otherwise it is version 1.0 (HIXL takes the lower version of the
    two ranks').

    Raises:
        ValueError: an A2 (Ascend910B) link between two hosts where a rank's
            device NIC address is unknown: HCCL could not reach it.
    """
    same_host = rank0.host_ip == rank1.host_ip
    if not same_host:
        for rank, info in ((0, rank0), (1, rank1)):
            if info.soc.startswith(A2_SOC_PREFIX) and not info.device_ip:
                raise ValueError(
                    f"rank {rank} ({info.soc}, host {info.host_ip}, device {info.device_id}) "
                    f"has no known device NIC address, which HCCL needs between two hosts on "
                    f"Atlas A2: set ascend.device_ips or the host's /etc/hccn.conf")
    v12 = rank0.super_pod and rank1.super_pod

    def device(info: RankInfo, rank: int) -> dict[str, str]:
        entry = {"device_id": str(info.device_id), "rank_id": str(rank)}
        if info.device_ip:  # an unknown one is left out, never written as ""
            entry["device_ip"] = info.device_ip
        if v12:
            entry["super_device_id"] = str(info.super_device_id)
        return entry

    if same_host:
        servers = [{"server_id": rank0.host_ip,
                    "device": [device(rank0, 0), device(rank1, 1)]}]
    else:
        servers = [{"server_id": rank0.host_ip, "device": [device(rank0, 0)]},
                   {"server_id": rank1.host_ip, "device": [device(rank1, 1)]}]
    table: dict[str, object] = {"version": "1.2" if v12 else "1.0",
                                "server_count": str(len(servers)), "server_list": servers}
    if v12:
        pods: dict[str, list[str]] = {}
        for info in (rank0, rank1):
            hosts = pods.setdefault(str(info.super_pod_id), [])
            if info.host_ip not in hosts:
                hosts.append(info.host_ip)
        table["super_pod_list"] = [
            {"super_pod_id": pod, "server_list": [{"server_id": h} for h in hosts]}
            for pod, hosts in sorted(pods.items())]
    table["status"] = "completed"
    return json.dumps(table, separators=(",", ":"))


@dataclass(frozen=True)
class CommSpec:
    """How both ranks build one communicator: what the linking daemon (rank 0)
    sends in ``Peer.HcclConnect``. Exactly one of root_info and rank_table is set;
    the buffer size and the name must be the same on both ranks (HCCL requires
    one config per communicator)."""

    root_info: bytes = b""
    rank_table: str = ""
    buffer_mb: int = 200
    name: str = ""

    def check(self, root_info_bytes: int) -> None:
        """Raises ValueError for a spec a peer may not send."""
        if bool(self.root_info) == bool(self.rank_table):
            raise ValueError("an HCCL connect names a root info or a rank table (one of them)")
        if self.root_info and len(self.root_info) != root_info_bytes:
            raise ValueError(f"an HCCL root info has {root_info_bytes} bytes, not "
                             f"{len(self.root_info)}")
        if not 1 <= self.buffer_mb <= 1 << 20:
            raise ValueError(f"an HCCL buffer of {self.buffer_mb} MB")
        if len(self.name) >= 128 or not self.name.isascii():
            raise ValueError(f"not a communicator name: {self.name!r}")
        if self.rank_table and not self.name:
            # hcomm op_base.cc, HcclCommInitClusterInfoMemConfig: HCCL_E_PARA
            raise ValueError("a rank-table communicator needs a name")

    @property
    def device_bytes(self) -> int:
        """Device memory the communicator reserves: twice its buffer (HCCL keeps
        an input and an output buffer of HCCL_BUFFSIZE each)."""
        return 2 * self.buffer_mb * MIB


@dataclass(frozen=True)
class CommSettings:
    """What a link needs of the backend to build its communicators."""

    mode: str                                # "rank_table" or "root_info"
    buffer_mb: int
    describe: Callable[[int], RankInfo]      # this daemon's rank on a (logical) device
    reserve: Callable[[int, int], None]      # (device, bytes): count, or raise LLMException
    release: Callable[[int, int], None]      # (device, bytes)
    # one communicator creation at a time in the daemon (issue 30, defect 6)
    gate: CreationGate = field(default_factory=CreationGate)
