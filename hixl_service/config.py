"""Daemon configuration: defaults < TOML file < ``HIXL_*`` environment.

Every section is a frozen pydantic model that rejects unknown keys, so a
misspelt setting fails at start instead of being silently ignored. The file
and environment are merged by pydantic-settings; :func:`load_config` is the
one entry point the process shell uses, and it turns every failure (missing
file, bad TOML, invalid value) into a :class:`ConfigError` that names the
offending fields.

Environment variables use ``HIXL_<SECTION>__<FIELD>``, for example
``HIXL_SERVER__PEER_PORT=26001`` or ``HIXL_POOL__MAX_BYTES=2GiB``. Only the
section prefixes are read as settings; the ``HIXL_*`` variables other parts of
hixl read (:data:`OTHER_ENV_VARIABLES`, such as the client's ``HIXL_DAEMON``)
are left alone, and any other ``HIXL_*`` variable is an error, as an unknown
TOML key is: ``HIXL_SERVER_PEER_PORT`` (one underscore) would otherwise be
ignored without a word. TOML has no null, so optional fields take an empty
string to mean "unset".
"""

from __future__ import annotations

import contextvars
import difflib
import json
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

__all__ = [
    "ENV_PREFIX",
    "OTHER_ENV_PREFIXES",
    "OTHER_ENV_VARIABLES",
    "AllowedPeer",
    "AscendConfig",
    "ConfigError",
    "DaemonConfig",
    "LimitsConfig",
    "LinksConfig",
    "LoggingConfig",
    "PoolConfig",
    "SecurityConfig",
    "ServerConfig",
    "TransferConfig",
    "dump_toml",
    "load_config",
]

ENV_PREFIX = "HIXL_"
_ENV_NESTED_DELIMITER = "__"
# HIXL_* variables that are not daemon settings but are read elsewhere: the
# daemon accepts them in its environment (a shell that runs clients and a
# daemon has them set) and any other HIXL_* name is refused. A new variable
# read anywhere in hixl is added here.
OTHER_ENV_VARIABLES = frozenset({
    "HIXL_DAEMON",  # clients: which daemon to dial
    "HIXL_TRANSFER_LANE",  # clients: "0" keeps transfer calls on gRPC
    "HIXL_TEST_LOOP",  # the test suite: which event loop the tests run on
    "HIXL_DEBUG",  # setup.py: a debug build of the native extension
    "HIXL_BENCH_CALLS_DIR",  # hixl-bench: where its calls tool writes profiles
    "HIXL_BENCH_GC_DIR",  # hixl-bench: where its soak and links tools' daemons answer SIGUSR2
    "HIXL_TRACING",  # clients: "1" turns on OpenTelemetry spans (the tracing extra)
    "HIXL_BENCH_MOONCAKE_PYTHON",  # the bench tests: an interpreter with Mooncake TE
    "HIXL_BENCH_NIXL_PYTHON",  # the bench tests: an interpreter with NIXL
    "HIXL_VLLM_VENV",  # scripts/vllm_env.sh: where the vLLM environment lives
    "HIXL_VLLM_PIP_TIMEOUT",  # scripts/vllm_env.sh: bound on each pip step
    "HIXL_VLLM_PYTHON",  # hixl-bench's vLLM tools and tests: that environment's python
})
OTHER_ENV_PREFIXES = ("HIXL_DOUBLE_",)  # the CANN test double's knobs (tests/cann_double)
# sun_path holds 108 bytes on Linux and 104 on macOS, including the final NUL.
_MAX_UNIX_PATH = 103 if sys.platform == "darwin" else 107
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]"})

Port = Annotated[int, Field(ge=0, le=65535)]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class ConfigError(Exception):
    """The daemon configuration is missing, unreadable or invalid.

    The message names every failing field as ``section.field: reason`` and the
    file the configuration came from, so it can be shown to an operator as is.

    Attributes:
        path: The TOML file that was loaded, or ``None`` for defaults and
            environment only.
        problems: One ``section.field: reason`` line per failure.
    """

    def __init__(self, message: str, *, path: Path | None = None, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.path = path
        self.problems = problems


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _default_client_socket() -> Path:
    # Imported here, though cheap (the standard library only): the daemon's
    # other imports pull in grpc and the native module, which --check and
    # --print-config do not need.
    from hixl_wire.defaults import default_socket_path

    return default_socket_path()


def _empty_is_unset(value: object) -> object:
    if isinstance(value, str) and not value.strip():
        return None
    return value


class ServerConfig(_Section):
    """Listeners of the daemon and how it stops."""

    client_socket: Path | None = Field(
        default_factory=_default_client_socket,
        description="Absolute path of the unix socket clients attach to; empty disables it. "
        "Defaults to hixl.sock in the runtime directory ($RUNTIME_DIRECTORY, "
        "$XDG_RUNTIME_DIR/hixl, /run/hixl for root, else /tmp/hixl-<uid>).",
    )
    client_tcp: str | None = Field(
        default=None,
        description='Optional "host:port" TCP listener for clients (port 0 = ephemeral); '
        "empty disables it.",
    )
    peer_host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="Address the peer gRPC server and the data plane listen on.",
    )
    peer_port: Port = Field(
        default=26000, description="Peer gRPC port that other daemons dial; 0 = ephemeral."
    )
    data_port: Port = Field(default=0, description="Native TCP data-plane port; 0 = ephemeral.")
    advertise_host: str | None = Field(
        default=None,
        description="Host peers should dial for the peer and data ports; empty means peer_host. "
        "Required when peer_host is a wildcard address.",
    )
    max_concurrent_rpcs: int = Field(
        default=256, gt=0, description="Concurrent RPCs the gRPC servers accept before refusing."
    )
    grace_period_s: Seconds = Field(
        default=5.0,
        description="Seconds in-flight RPCs and transfers get to finish after SIGTERM.",
    )
    use_uvloop: bool = Field(default=True, description="Run the event loop on uvloop.")
    transfer_lane: bool = Field(
        default=True,
        description="Offer the transfer lane: a unix socket next to the client socket on which "
        "clients send transfer calls without gRPC's per-call cost (see docs/daemon.md).",
    )
    peer_lane: bool = Field(
        default=True,
        description="Offer the peer lane: a TCP listener on peer_host that carries the peer "
        "calls a transfer makes (resolve, release, HCCL posts) without gRPC's per-call cost.",
    )
    peer_lane_port: Port = Field(
        default=0, description="TCP port of the peer lane; 0 = ephemeral (announced to peers "
        "at link time, like data_port)."
    )
    ready_file: Path | None = Field(
        default=None,
        description="If set, a JSON readiness record is written here (atomically) once the "
        "daemon listens; empty disables it.",
    )

    _unset_if_empty = field_validator(
        "client_socket", "client_tcp", "advertise_host", "ready_file", mode="before"
    )(_empty_is_unset)

    @field_validator("client_socket")
    @classmethod
    def _check_socket_path(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        if not value.is_absolute():
            raise ValueError(f"must be an absolute path, got {str(value)!r}")
        if len(os.fsencode(value)) > _MAX_UNIX_PATH:
            raise ValueError(f"longer than the {_MAX_UNIX_PATH} bytes a unix socket path may have")
        return value

    @field_validator("client_tcp")
    @classmethod
    def _check_host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f'expected "host:port" with a port in 0..65535, got {value!r}')
        return value

    @model_validator(mode="after")
    def _check_listeners(self) -> ServerConfig:
        if self.client_socket is None and self.client_tcp is None:
            raise ValueError("no client listener: set client_socket or client_tcp")
        if self.peer_port != 0 and self.peer_port == self.data_port:
            raise ValueError(f"peer_port and data_port must differ (both {self.peer_port})")
        if self.advertise_host is None and self.peer_host in _WILDCARD_HOSTS:
            raise ValueError(
                f"peer_host {self.peer_host!r} is a wildcard address: set advertise_host "
                "to a host peers can dial"
            )
        return self

    @property
    def effective_advertise_host(self) -> str:
        """The host written into addresses given to peers."""
        return self.advertise_host or self.peer_host


class PoolConfig(_Section):
    """Memory pools the daemon allocates for its clusters."""

    backend: Literal["host", "hccl"] = Field(
        default="host",
        description='"host": pools in host memory, links over native TCP. "hccl": DEVICE '
        "pools in Ascend device memory, links over HCCL (needs CANN; see [ascend]).",
    )
    max_bytes: ByteSize = Field(
        default=ByteSize(1 << 30),
        description='Budget across all pools of all clusters, in bytes or with a unit ("1GiB").',
    )
    populate: bool = Field(default=True, description="Pre-fault pool pages at creation.")

    @field_validator("max_bytes")
    @classmethod
    def _check_positive(cls, value: ByteSize) -> ByteSize:
        if value <= 0:
            raise ValueError("Input should be greater than 0")
        return value


class TransferConfig(_Section):
    """Data-plane tuning."""

    streams_per_link: int = Field(
        default=4, ge=1, le=64, description="Parallel TCP streams per peer link."
    )
    connect_timeout_s: Seconds = Field(
        default=3.0, description="Seconds allowed to connect to a peer daemon."
    )
    copy_threads: int = Field(
        default=2, ge=1, le=64,
        description="Native copy threads (and threads of the executor for device copies)."
    )
    data_threads: int = Field(
        default=16, ge=1, le=256,
        description="Native workers that move the data streams of all this daemon's links, "
        "and as many that serve its data server's connections; a stream or connection holds "
        "one only while it moves bytes, so the count does not grow with links.",
    )
    # xmem: engine-allocated client memory moves to and from sockets through these.
    bounce_buffers: int = Field(
        default=16, ge=1, le=4096,
        description="Bounce buffers each way (peers' requests, this daemon's own) that stage "
        "engine-allocated client memory on the data plane; made on first use, never grown.",
    )
    bounce_buffer_bytes: ByteSize = Field(
        default=ByteSize(1 << 20),
        description="Bytes per bounce buffer (a multiple of 4096, 64KiB to 64MiB); one "
        "request moves a piece of at most this much per buffer.",
    )

    checksum: bool = Field(
        default=False,
        description="TCP transfers carry a CRC-32C of their bytes, checked where they land; "
        "a mismatch fails the transfer with LLM_LINK_FAILED. A transfer call's checksum "
        "argument overrides it. Costs a pass over the bytes at each end. SIGHUP reloads it.",
    )

    @field_validator("bounce_buffer_bytes")
    @classmethod
    def _check_bounce(cls, value: ByteSize) -> ByteSize:
        if value % 4096 or not (64 << 10) <= value <= (64 << 20):
            raise ValueError("Input should be a multiple of 4096 in [64KiB, 64MiB]")
        return value


class AscendConfig(_Section):
    """The Ascend (``pool.backend = "hccl"``) backend: where CANN is, which devices."""

    cann_path: Path | None = Field(
        default=None,
        description="Directory holding libascendcl.so and libhccl.so; empty searches "
        "$ASCEND_TOOLKIT_HOME/lib64, $ASCEND_HOME_PATH/lib64, then the loader path.",
    )
    devices: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: [0],
        min_length=1,
        description="Device ids clusters may use (their ge.exec.deviceId); each is opened at "
        "start.",
    )
    device_pool_max_bytes: ByteSize = Field(
        default=ByteSize(8 << 30),
        description="Budget of device pools per device, in bytes or with a unit.",
    )

    # -- HCCL communicators and network (docs/ascend.md) ------------------------
    comm_init: Literal["rank_table", "root_info"] = Field(
        default="rank_table",
        description='How link communicators are built: "rank_table" '
        "(HcclCommInitClusterInfoMemConfig with a two-rank table of both daemons' device and "
        'host, as HIXL does) or "root_info" (HcclGetRootInfo / HcclCommInitRootInfo; not '
        "on every product).",
    )
    hccl_buffer_mb: int = Field(
        default=200, ge=1, le=1 << 20,
        description="HCCL buffer per communicator, in MB (hcclBufferSize; HCCL_BUFFSIZE for "
        "root info without HcclCommInitRootInfoConfig). Each link's communicator reserves "
        "twice this much device memory, counted against device_pool_max_bytes.",
    )
    if_ip: str | None = Field(
        default=None,
        description="Host IP address HCCL uses for its own sockets (HCCL_IF_IP), and this "
        "host's server_id in rank tables; empty leaves HCCL's choice.",
    )
    socket_ifname: str | None = Field(
        default=None,
        description="Host network interface(s) HCCL picks its IP from (HCCL_SOCKET_IFNAME, "
        'e.g. "eth0" or "eth0,eth1"); empty leaves HCCL\'s choice. Not with if_ip.',
    )
    base_port: int | None = Field(
        default=None, ge=1024, le=65520,
        description="First of the host ports HCCL listens on (HCCL_IF_BASE_PORT; it takes 32 "
        "from there, 60000 when unset).",
    )
    connect_timeout_s: int | None = Field(
        default=None, ge=120, le=7200,
        description="Seconds HCCL waits for a peer while building a communicator "
        "(HCCL_CONNECT_TIMEOUT; HCCL's default 120 when unset).",
    )
    device_ips: dict[int, str] = Field(
        default_factory=dict,
        description="Device NIC IP per device id, for rank tables; a device not named here "
        "takes address_<physical id> of /etc/hccn.conf, else none.",
    )

    _unset_if_empty = field_validator("cann_path", "if_ip", "socket_ifname", "base_port",
                                      "connect_timeout_s", mode="before")(_empty_is_unset)

    @field_validator("if_ip")
    @classmethod
    def _check_ip(cls, value: str | None) -> str | None:
        if value is not None:
            import ipaddress

            ipaddress.ip_address(value)  # ValueError names the bad address
        return value

    @field_validator("device_ips")
    @classmethod
    def _check_device_ips(cls, value: dict[int, str]) -> dict[int, str]:
        import ipaddress

        for device, ip in value.items():
            if device < 0:
                raise ValueError(f"device id {device} is negative")
            ipaddress.ip_address(ip)
        return value

    @field_validator("socket_ifname")
    @classmethod
    def _check_ifname(cls, value: str | None) -> str | None:
        if value is not None:
            import re

            # HCCL_SOCKET_IFNAME: names or prefixes, comma separated, optionally
            # "=" (exact) or "^" (exclude) first
            if not re.fullmatch(r"[=^]?[A-Za-z0-9_.:@-]{1,15}(,[A-Za-z0-9_.:@-]{1,15})*", value):
                raise ValueError(f"not a list of interface names: {value!r}")
        return value

    @model_validator(mode="after")
    def _one_address_choice(self) -> AscendConfig:
        if self.if_ip is not None and self.socket_ifname is not None:
            raise ValueError("set if_ip or socket_ifname, not both (HCCL_IF_IP wins over "
                             "HCCL_SOCKET_IFNAME)")
        return self

    @field_validator("devices")
    @classmethod
    def _check_unique(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"device ids repeat: {value}")
        return value

    @field_validator("device_pool_max_bytes")
    @classmethod
    def _check_positive(cls, value: ByteSize) -> ByteSize:
        if value <= 0:
            raise ValueError("Input should be greater than 0")
        return value


class LoggingConfig(_Section):
    """Log output of the daemon (always stderr)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Lowest level logged; case-insensitive."
    )
    format: Literal["text", "json"] = Field(
        default="text", description='"text" lines, or one JSON object per line.'
    )

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class AllowedPeer(_Section):
    """One identity that may link to this daemon (``[[security.allowed_peers]]``)."""

    identity: str = Field(
        min_length=1,
        description="mtls: the peer certificate's SPIFFE URI SAN, else its DNS SAN, else its "
        "CN; token and none: the peer's IP address.",
    )
    clusters: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="Cluster ids of this daemon it may link to; empty: any.",
    )
    write: bool = Field(
        default=False,
        description="Whether it may write (push, TransferConfig writes) into those clusters' "
        "writable caches; reads only when false.",
    )


class SecurityConfig(_Section):
    """Who may link to this daemon, and how peers prove it (docs/security.md)."""

    mode: Literal["none", "token", "mtls"] = Field(
        default="none",
        description='"none": no authentication (loopback only, unless insecure). "token": '
        "peers prove knowledge of the shared secret in token_file by HMAC challenge-response. "
        '"mtls": every TCP gRPC listener requires client certificates signed by tls_ca.',
    )
    token_file: Path | None = Field(
        default=None,
        description="token mode: file holding the shared secret (at least 16 bytes); must be "
        "owned by the daemon's user and mode 0600 or stricter.",
    )
    tls_cert: Path | None = Field(
        default=None, description="mtls mode: this daemon's certificate chain (PEM)."
    )
    tls_key: Path | None = Field(default=None, description="mtls mode: its private key (PEM).")
    tls_ca: Path | None = Field(
        default=None, description="mtls mode: the CA certificates peers' certificates chain to."
    )
    allowed_peers: list[AllowedPeer] = Field(
        default_factory=list,
        description="Identities that may link; empty: any peer that authenticates, to any "
        "cluster, with writes.",
    )
    insecure: bool = Field(
        default=False,
        description='Allow mode "none" on a non-loopback listener (logs a warning at every '
        "start). Anyone who reaches the ports can then read and write every cache.",
    )

    _unset_if_empty = field_validator(
        "token_file", "tls_cert", "tls_key", "tls_ca", mode="before"
    )(_empty_is_unset)

    @model_validator(mode="after")
    def _check_mode(self) -> SecurityConfig:
        if self.mode == "token" and self.token_file is None:
            raise ValueError('mode "token" needs token_file')
        if self.mode == "mtls":
            missing = [name for name in ("tls_cert", "tls_key", "tls_ca")
                       if getattr(self, name) is None]
            if missing:
                raise ValueError(f'mode "mtls" needs {", ".join(missing)}')
        identities = [peer.identity for peer in self.allowed_peers]
        if len(set(identities)) != len(identities):
            raise ValueError(f"allowed_peers names an identity twice: {identities}")
        return self


class LimitsConfig(_Section):
    """Bounds on what peers may hold of this daemon; each refusal names its key."""

    max_inbound_links: int = Field(
        default=4096, gt=0, description="Inbound links from all peers together."
    )
    max_links_per_peer: int = Field(
        default=512, gt=0, description="Inbound links from one peer identity."
    )
    hello_rate: float = Field(
        default=200.0, gt=0, allow_inf_nan=False,
        description="Link attempts (Peer.Challenge and Peer.Hello) accepted per second, "
        "all peers together; a burst of hello_burst is allowed.",
    )
    hello_burst: int = Field(default=400, gt=0, description="See hello_rate.")
    max_data_connections: int = Field(
        default=1024, gt=0, le=1 << 20,
        description="Data-plane connections served at once (each link opens "
        "transfer.streams_per_link of them).",
    )


# branch metrics: [metrics]
class MetricsConfig(_Section):
    """The Prometheus endpoint (``/metrics``, plain HTTP); off unless ``listen`` is set."""

    listen: str | None = Field(
        default=None,
        description='host:port of the /metrics HTTP listener, e.g. "127.0.0.1:9464" '
        "(port 0: ephemeral); unset or empty: no listener. Off loopback it is refused "
        "unless allow_remote.",
    )
    allow_remote: bool = Field(
        default=False,
        description="Accept a listen address off loopback: /metrics has no authentication, "
        "so anyone who reaches it reads the daemon's counters; warned at every start.",
    )

    _empty_listen = field_validator("listen", mode="before")(_empty_is_unset)

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f'listen must be "host:port", got {value!r}')
        return value


# branch metrics: [tracing]
class TracingConfig(_Section):
    """OpenTelemetry spans of transfers (the ``tracing`` extra); off by default."""

    enabled: bool = Field(
        default=False,
        description="Export spans of pulls, pushes and layer-wise tasks, continuing the "
        "traces clients send; needs pip install 'hixl[tracing]'.",
    )
    exporter: Literal["otlp", "console"] = Field(
        default="otlp",
        description='"otlp" (OTLP over gRPC, to endpoint) or "console" (one JSON object '
        "per span, to console_file).",
    )
    endpoint: str | None = Field(
        default=None,
        description="OTLP gRPC endpoint, e.g. \"http://127.0.0.1:4317\"; unset: "
        "OTEL_EXPORTER_OTLP_ENDPOINT, else the exporter's default.",
    )
    console_file: Path | None = Field(
        default=None, description='exporter "console": file the spans are appended to; '
        "unset: stderr."
    )
    service_name: str = Field(default="hixl-serviced", min_length=1,
                              description="The spans' service.name.")

    _empty_is_none = field_validator("endpoint", "console_file", mode="before")(_empty_is_unset)


# branch linkstate: the [links] section.
class LinksConfig(_Section):
    """How links find out that a peer is gone, and how long an inbound link is kept."""

    heartbeat_interval_s: Seconds = Field(
        default=1.0, le=60,
        description="Seconds between heartbeats to each linked daemon (also renewing the "
        "leases of its links); at most a third of the peer's lease is used.",
    )
    heartbeat_timeout_s: Seconds = Field(
        default=1.0, le=60, description="Seconds one heartbeat may take before it counts as "
        "missed.",
    )
    down_after_s: Seconds = Field(
        default=5.0, le=600,
        description="A link whose far daemon answered no heartbeat for this long is down; "
        "inbound: a link not renewed for this long is shown down.",
    )
    lease_s: Seconds = Field(
        default=10.0, le=3600,
        description="An inbound link not renewed by its linking daemon for this long is "
        "dropped: its token revoked, its counts released.",
    )
    tcp_keepalive_idle_s: int = Field(
        default=2, ge=1, le=32767,
        description="Idle seconds before a data stream's first TCP keepalive probe.",
    )
    tcp_keepalive_interval_s: int = Field(
        default=1, ge=1, le=32767, description="Seconds between TCP keepalive probes."
    )
    tcp_keepalive_count: int = Field(
        default=3, ge=1, le=127,
        description="Unanswered keepalive probes after which a data stream fails.",
    )
    tcp_user_timeout_s: Seconds = Field(
        default=5.0, le=3600,
        description="TCP_USER_TIMEOUT of data streams: seconds sent data may stay "
        "unacknowledged before the stream fails (it is then reopened in the background).",
    )

    @model_validator(mode="after")
    def _renewal_fits_lease(self) -> LinksConfig:
        if self.down_after_s > self.lease_s:
            raise ValueError("down_after_s must not exceed lease_s (a link is shown down "
                             "before its lease ends)")
        return self


@dataclass(frozen=True)
class _LoadRequest:
    path: Path | None
    environ: Mapping[str, str]


# load_config() hands its file and environment to settings_customise_sources
# through this variable, which is the only hook pydantic-settings gives a
# classmethod; it is set and reset around a single construction.
_LOAD_REQUEST: contextvars.ContextVar[_LoadRequest | None] = contextvars.ContextVar(
    "hixl_config_load_request", default=None
)


class _MappingEnvSource(EnvSettingsSource):
    """The environment source, reading a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env_vars = {key.lower(): value for key, value in environ.items()}


class DaemonConfig(BaseSettings):
    """Effective configuration of one daemon; build it with :func:`load_config`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=_ENV_NESTED_DELIMITER,
        env_nested_max_split=1,
        case_sensitive=False,
        extra="forbid",
        frozen=True,
    )

    server: ServerConfig = Field(default_factory=ServerConfig, description="Listeners.")
    pool: PoolConfig = Field(default_factory=PoolConfig, description="Memory pools.")
    transfer: TransferConfig = Field(default_factory=TransferConfig, description="Data plane.")
    ascend: AscendConfig = Field(
        default_factory=AscendConfig, description='Ascend backend (pool.backend = "hccl").'
    )
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Log output.")
    security: SecurityConfig = Field(
        default_factory=SecurityConfig, description="Peer authentication and authorization."
    )
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Limits on peers.")
    metrics: MetricsConfig = Field(  # branch metrics
        default_factory=MetricsConfig, description="The Prometheus endpoint.")
    tracing: TracingConfig = Field(  # branch metrics
        default_factory=TracingConfig, description="OpenTelemetry tracing.")
    links: LinksConfig = Field(  # branch linkstate
        default_factory=LinksConfig, description="Link liveness, leases and TCP keepalive."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Order the sources: keyword arguments > environment > TOML file > defaults."""
        request = _LOAD_REQUEST.get()
        if request is None:
            return (init_settings, env_settings)
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            _MappingEnvSource(settings_cls, request.environ),
        ]
        if request.path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=request.path))
        return tuple(sources)

    def to_toml(self) -> str:
        """Return the effective configuration as a TOML document ``load_config`` accepts."""
        return dump_toml(self.model_dump(mode="json"))


def load_config(path: Path | None, env: Mapping[str, str] | None = None) -> DaemonConfig:
    """Load and validate the daemon configuration.

    Args:
        path: TOML file to read, or ``None`` for defaults and environment only.
        env: Environment to read ``HIXL_*`` variables from; ``os.environ`` if
            ``None``. The default socket path still follows the process
            environment (``RUNTIME_DIRECTORY``, ``XDG_RUNTIME_DIR``).

    Returns:
        The frozen, validated configuration.

    Raises:
        ConfigError: The file is missing or not valid TOML, or a value is
            invalid; the message names the file and every failing field.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    where = f"config file {path}" if path is not None else "no config file"
    if path is not None and not path.is_file():
        raise ConfigError(f"{where}: no such file", path=path)
    unknown = _unknown_variables(environ)
    if unknown:
        message = f"invalid environment ({where}):\n" + "\n".join(f"  {p}" for p in unknown)
        raise ConfigError(message, path=path, problems=unknown)
    token = _LOAD_REQUEST.set(_LoadRequest(path, environ))
    try:
        return DaemonConfig()
    except ValidationError as exc:
        problems = tuple(_describe(error, environ) for error in exc.errors())
        message = f"invalid configuration ({where}):\n" + "\n".join(f"  {p}" for p in problems)
        raise ConfigError(message, path=path, problems=problems) from exc
    except (OSError, ValueError) as exc:
        # tomllib/tomli decode errors and pydantic-settings' SettingsError are ValueErrors.
        raise ConfigError(f"cannot load configuration ({where}): {exc}", path=path) from exc
    finally:
        _LOAD_REQUEST.reset(token)


def _unknown_variables(environ: Mapping[str, str]) -> tuple[str, ...]:
    """One line for each ``HIXL_*`` variable that is neither a setting nor read elsewhere.

    ``HIXL_<SECTION>`` and ``HIXL_<SECTION>__<anything>`` are left to the
    settings themselves, which name a misspelt field as the TOML file's would.
    """
    sections = DaemonConfig.model_fields
    problems = []
    for key in environ:
        name = key.upper()
        if not name.startswith(ENV_PREFIX) or name in OTHER_ENV_VARIABLES or name.startswith(
                OTHER_ENV_PREFIXES):
            continue
        section = name[len(ENV_PREFIX):].partition(_ENV_NESTED_DELIMITER)[0].lower()
        if section in sections:
            continue
        line = f"${key}: unknown variable (neither a daemon setting nor one hixl reads)"
        close = difflib.get_close_matches(name, _known_variables(), n=1, cutoff=0.8)
        if close:
            line += f"; did you mean ${close[0]}?"
        problems.append(line)
    return tuple(sorted(problems))


def _known_variables() -> list[str]:
    names = sorted(OTHER_ENV_VARIABLES)
    for section, info in DaemonConfig.model_fields.items():
        prefix = f"{ENV_PREFIX}{section.upper()}"
        names.append(prefix)
        model = info.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            names.extend(f"{prefix}{_ENV_NESTED_DELIMITER}{field.upper()}"
                         for field in model.model_fields)
    return names


def _describe(error: Any, environ: Mapping[str, str]) -> str:
    loc = tuple(str(part) for part in error["loc"])
    field = ".".join(loc) or "(root)"
    message = str(error["msg"]).removeprefix("Value error, ")
    text = f"{field}: {message}"
    if error["type"] not in ("extra_forbidden", "missing") and not isinstance(
        error["input"], (dict, BaseModel)
    ):
        text += f" (got {_short_repr(error['input'])})"
    env_name = ENV_PREFIX + _ENV_NESTED_DELIMITER.join(loc).upper()
    if any(key.upper() == env_name for key in environ):
        text += f" [from ${env_name}]"
    return text


def _short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dump_toml(data: Mapping[str, Mapping[str, object]]) -> str:
    """Render ``{section: {key: value}}`` as TOML.

    Values may be str, int, float, bool, ``os.PathLike``, ``None``, a mapping
    of those (an inline table, keys quoted) or a list of any of them; ``None``
    becomes ``""``, which the daemon reads as "unset".

    Args:
        data: The sections to render, in order.

    Returns:
        The TOML text, one ``[section]`` table per entry.

    Raises:
        TypeError: A value of another type.
    """
    lines: list[str] = []
    for section, values in data.items():
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, Mapping):  # an inline table (allowed_peers, device_ips), keys quoted
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        # JSON string escapes are valid TOML basic-string escapes, except that
        # TOML also wants DEL escaped.
        return json.dumps(value).replace("\x7f", "\\u007f")
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as a TOML value")
