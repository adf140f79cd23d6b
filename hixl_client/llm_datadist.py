"""LLMDataDist: one cluster, one session with the local daemon, as coroutines.

Unlike LLM-DataDist's blocking class, several instances may live in one
process (one per cluster): each holds its own session with the daemon.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from hixl_wire._proto.hixl.v1 import client_pb2

from ._comm_ops import CommOps
from ._defaults import default_daemon_target
from ._memory import PoolMapping, map_pools
from ._notify_ops import NotifyOps
from ._transport import CONTROL_TIMEOUT_OPTION, CONTROL_TIMEOUT_S, DaemonConnection
from ._validation import check_int32, check_isinstance, check_uint64
from .cache_manager import CacheManager
from .config import LLMClusterInfo, int_to_ip
from .status import LLMException, LLMStatusCode, raise_if_false
from .types import LinkState, LinkStatus, LLMRole, role_to_str

logger = logging.getLogger(__name__)

OPT_ROLE = "llm.Role"
OPT_CACHE_MANAGER = "llm.EnableCacheManager"
OPT_REMOTE_ACCESSIBLE = "llm.EnableRemoteCacheAccessible"
OPT_LOCAL_COMM_RES = "llm.LocalCommRes"
OPT_TRANSFER_BACKEND = "llm.TransferBackend"
OPT_LISTEN_IP_INFO = "llm.listenIpInfo"
OPT_FLOW_GRAPH_MEM = "ge.flowGraphMemMaxSize"
OPT_POOLS = ("llm.MemPoolConfig", "llm.HostMemPoolConfig")
# Init creates the cluster's pools, and the daemon maps, pre-faults and writes
# every page of them first (0.7 s per GiB on the slow VMs hixl is developed
# on): Init may take this long per GiB on top of a control call, so a large
# pool is not cut off by the fixed control timeout.
POOL_SETUP_S_PER_GIB = 2.0


def control_timeout_s(options: dict[str, str]) -> float:
    """The timeout of calls without one of LLM-DataDist's own, in seconds: the
    option ``hixl.ControlCallTimeout`` (milliseconds, a positive int32), else
    CONTROL_TIMEOUT_S.

    Raises:
        LLMException: the option is not a positive int32 (``LLM_PARAM_INVALID``).
    """
    value = options.get(CONTROL_TIMEOUT_OPTION)
    if value is None:
        return CONTROL_TIMEOUT_S
    raise_if_false(isinstance(value, str) and value.isdigit() and 0 < int(value) < 2**31,
                   "{0} must be milliseconds in [1, 2**31-1], got {1!r}.",
                   CONTROL_TIMEOUT_OPTION, value)
    return int(value) / 1000.0


def init_timeout_s(options: dict[str, str], control_s: float = CONTROL_TIMEOUT_S) -> float:
    """How long Init may take: a control call (``control_s``), plus the setup of
    the pools it asks for. Pool options the daemon will refuse count for nothing here."""
    pool_bytes = 0
    for name in OPT_POOLS:
        try:
            size = json.loads(options[name])["memory_size"]
        except (KeyError, TypeError, ValueError):
            continue
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            pool_bytes += size
    return control_s + POOL_SETUP_S_PER_GIB * pool_bytes / 2**30


def normalize_options(options: dict[str, str], role: LLMRole) -> dict[str, str]:
    """Apply LLM-DataDist's init-time option rules and return the options to send.

    Raises:
        TypeError: ``ge.flowGraphMemMaxSize`` is not a str.
        ValueError: the listen port is not a number.
        LLMException: a rule of LLM-DataDist's init is broken (``LLM_PARAM_INVALID``).
    """
    if OPT_FLOW_GRAPH_MEM in options:
        value = options[OPT_FLOW_GRAPH_MEM]
        check_isinstance(OPT_FLOW_GRAPH_MEM, value, str)
        raise_if_false("," not in value, "{0} does not support multiple values, got {1}.",
                       OPT_FLOW_GRAPH_MEM, value)
        raise_if_false(value.isdigit(), "{0} must be digits, got {1}.", OPT_FLOW_GRAPH_MEM, value)
    normalized = dict(options)
    normalized[OPT_ROLE] = role_to_str(role)
    if OPT_LOCAL_COMM_RES in normalized:
        normalized.setdefault(OPT_CACHE_MANAGER, "1")
        normalized.setdefault(OPT_REMOTE_ACCESSIBLE, "1")
    cache_manager_mode = normalized.get(OPT_CACHE_MANAGER) == "1"
    raise_if_false(OPT_LOCAL_COMM_RES not in normalized or cache_manager_mode,
                   "{0} is not supported when llm.EnableCacheManager is not configured.",
                   OPT_LOCAL_COMM_RES)
    if OPT_TRANSFER_BACKEND in normalized:
        raise_if_false(cache_manager_mode, "{0} requires llm.EnableCacheManager to be 1.",
                       OPT_TRANSFER_BACKEND)
        normalized.setdefault(OPT_REMOTE_ACCESSIBLE, "1")
        raise_if_false(normalized[OPT_REMOTE_ACCESSIBLE] == "1",
                       "{0} requires llm.EnableRemoteCacheAccessible to be 1.",
                       OPT_TRANSFER_BACKEND)
        raise_if_false(OPT_LISTEN_IP_INFO in normalized, "{0} requires llm.listenIpInfo.",
                       OPT_TRANSFER_BACKEND)
    if cache_manager_mode and OPT_LISTEN_IP_INFO in normalized:
        parts = normalized[OPT_LISTEN_IP_INFO].split(":")
        raise_if_false(len(parts) == 2, "llm.listenIpInfo should be 'ip:port', got {0}.",
                       normalized[OPT_LISTEN_IP_INFO])
        normalized["llm.ListenIp"] = parts[0]
        normalized["llm.ListenPort"] = str(int(parts[1]))
    return normalized


class LLMDataDist(CommOps, NotifyOps):
    """One prefill or decode cluster attached to the local hixl daemon.

    Args:
        role: the cluster's role label (``LLMRole``).
        cluster_id: the cluster's id (uint64), unique among linked clusters.
        daemon: the gRPC target of the local daemon; defaults to ``$HIXL_DAEMON``
            or the default unix socket.
        transfer_lane: send transfer calls over the daemon's transfer lane (a hixl
            extension); defaults to yes unless ``$HIXL_TRANSFER_LANE=0``.

    Raises:
        TypeError / ValueError: wrong ``role`` or ``cluster_id``.
    """

    def __init__(self, role: LLMRole, cluster_id: int, *, daemon: str | None = None,
                 transfer_lane: bool | None = None) -> None:
        check_isinstance("role", role, LLMRole, allow_none=False)
        check_uint64("cluster_id", cluster_id)
        self._role = role
        self._cluster_id = cluster_id
        self._daemon = daemon or default_daemon_target()
        self._transfer_lane = transfer_lane
        self._connection: DaemonConnection | None = None
        self._cache_manager: CacheManager | None = None
        self._pools: dict[int, PoolMapping] = {}
        self._link_transports: dict[int, str] = {}
        self._options: dict[str, str] = {}

    @staticmethod
    def _role_to_str(role: LLMRole) -> str:
        return role_to_str(role)

    @property
    def cluster_id(self) -> int:
        """The cluster id given at construction."""
        return self._cluster_id

    @property
    def role(self) -> LLMRole:
        """The cluster's role label."""
        return self._role

    @property
    def daemon(self) -> str:
        """The gRPC target of the daemon this cluster attaches to."""
        return self._daemon

    @property
    def peer_address(self) -> str:
        """hixl extension: ``host:port`` where other daemons reach this cluster's
        daemon, to name in their ``link_clusters`` (its remote ip info); "" before init.
        A cluster with ``listen_ip_info`` is also reached at that address."""
        return self._connection.peer_address if self._connection is not None else ""

    @property
    def is_initialized(self) -> bool:
        return self._cache_manager is not None

    @property
    def cache_manager(self) -> CacheManager:
        """The cache manager of the initialized cluster.

        Raises:
            RuntimeError: not initialized.
        """
        if self._cache_manager is None:
            raise RuntimeError("llm datadist is not initialized")
        return self._cache_manager

    def _require_init(self) -> DaemonConnection:
        if self._connection is None or self._cache_manager is None:
            raise RuntimeError("llm datadist is not initialized")
        return self._connection

    async def init(self, options: dict[str, str]) -> None:
        """Attach to the daemon and create this cluster's pools.

        A second call on an initialized instance returns at once.

        Args:
            options: engine options, e.g. ``LLMConfig().generate_options()``.

        Raises:
            TypeError: ``options`` is not a dict.
            ImportError: the options ask for LLM-DataDist's legacy (non cache
                manager) mode, which hixl does not provide.
            LLMException: invalid options or the daemon refused the cluster.
        """
        if self._cache_manager is not None:
            return
        check_isinstance("options", options, dict, allow_none=False)
        normalized = normalize_options(options, self._role)
        if normalized.get(OPT_CACHE_MANAGER) != "1":
            raise ImportError("hixl implements LLM-DataDist's cache-manager mode only; set "
                              "LLMConfig.enable_cache_manager = True")
        control_s = control_timeout_s(normalized)
        connection = DaemonConnection(self._daemon, transfer_lane=self._transfer_lane,
                                      control_timeout_s=control_s)
        await connection.open()
        try:
            reply = await connection.call("Init", client_pb2.InitRequest(
                cluster_id=self._cluster_id, role=int(self._role), options=normalized),
                init_timeout_s(normalized, control_s))

            async def share(tgid: int) -> client_pb2.ShareDevicePoolsReply:
                reply: client_pb2.ShareDevicePoolsReply = await connection.call(
                    "ShareDevicePools", client_pb2.ShareDevicePoolsRequest(tgid=tgid))
                return reply

            self._pools = await map_pools(reply, share)
            await connection.call("ReportMappings", client_pb2.ReportMappingsRequest(
                pools=[client_pb2.PoolAddress(pool_id=p.pool_id, address=p.base)
                       for p in self._pools.values()]))
        except BaseException:
            self._close_pools()
            await connection.close()
            raise
        self._connection = connection
        self._options = normalized
        self._cache_manager = CacheManager(connection, normalized, self._pools, reply.fd_socket,
                                           reply.upload_token, reply.daemon_tgid)

    async def finalize(self) -> None:
        """Free the cluster's caches and pools in the daemon and end the session.

        A no-op when not initialized. The old ``cache_manager`` raises
        ``LLM_ENGINE_FINALIZED`` afterwards; a later ``init`` creates a new one.
        Never raises for the daemon's sake: when it went away (closed the
        session, died) or does not answer within the control timeout, the
        failure is logged and the session ends anyway, which frees what the
        daemon holds for it; so ``async with`` never hides the error that
        left its block.
        """
        connection, self._connection = self._connection, None
        manager, self._cache_manager = self._cache_manager, None
        if manager is not None:
            manager._expire()
        self._link_transports.clear()
        if connection is None:
            return
        # Imports of device pools end before the daemon frees the pools.
        self._close_pools()
        try:
            await connection.call("Finalize", client_pb2.FinalizeRequest())
        except LLMException as exc:
            logger.warning("finalizing cluster %d: %s; the session ends anyway", self._cluster_id,
                           exc)
        finally:
            await connection.close()

    def _close_pools(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            # Host views the caller still holds keep their mapping alive on their own.
            pool.close()

    def _check_clusters(self, clusters: Sequence[LLMClusterInfo], timeout: int,
                         options_require_local_ip: bool) -> None:
        check_int32("timeout", timeout)
        raise_if_false(timeout > 0, "timeout should be > 0, but got {0}.", timeout)
        check_isinstance("clusters", clusters, [list, tuple], LLMClusterInfo, allow_none=False)
        for cluster in clusters:
            if options_require_local_ip:
                raise_if_false(len(cluster.local_ip_info_list) > 0,
                               "local_ip_info_list is empty. Please append local ip info "
                               "when llm.LocalCommRes is not configured.")
            check_uint64("remote_cluster_id", cluster.remote_cluster_id)

    async def _link_call(self, clusters: Sequence[LLMClusterInfo], timeout: int,
                         unlink: bool, force: bool = False
                         ) -> tuple[LLMStatusCode, list[LLMStatusCode]]:
        connection = self._require_init()
        results: list[LLMStatusCode | None] = []
        targets = []
        for cluster in clusters:
            if len(cluster.remote_ip_info_list) != 1 and not (unlink and force):
                results.append(LLMStatusCode.LLM_PARAM_INVALID)
                continue
            host, port = ("", 0)
            if cluster.remote_ip_info_list:
                ip, port = cluster.remote_ip_info_list[0]
                host = int_to_ip(ip)
            targets.append(client_pb2.ClusterLink(
                remote_cluster_id=cluster.remote_cluster_id or 0, remote_host=host,
                remote_port=port))
            results.append(None)
        if targets:
            method = "UnlinkClusters" if unlink else "LinkClusters"
            request_cls: Any = (client_pb2.UnlinkClustersRequest if unlink
                                else client_pb2.LinkClustersRequest)
            reply = await connection.call(
                method, request_cls(clusters=targets, timeout_ms=timeout, force=force),
                timeout=timeout / 1000.0)
            for target, answer in zip(targets, reply.results, strict=True):
                if answer.status != LLMStatusCode.LLM_SUCCESS:
                    # LLM-DataDist returns statuses only: the daemon's reason goes to the log.
                    logger.warning("%s cluster %d failed (%s): %s",
                                   "unlinking" if unlink else "linking",
                                   target.remote_cluster_id,
                                   LLMStatusCode(answer.status).name, answer.message)
                    continue
                if unlink:
                    self._link_transports.pop(target.remote_cluster_id, None)
                else:
                    self._link_transports[target.remote_cluster_id] = answer.transport
            answers = iter(reply.results)
            results = [r if r is not None else LLMStatusCode(next(answers).status)
                       for r in results]
        statuses = [r for r in results if r is not None]
        failed = [r for r in statuses if r != LLMStatusCode.LLM_SUCCESS]
        if not statuses:
            return LLMStatusCode.LLM_PARAM_INVALID, []
        return (failed[-1] if failed else LLMStatusCode.LLM_SUCCESS), statuses

    @property
    def link_transports(self) -> dict[int, str]:
        """hixl extension: the transport of each linked remote cluster, by its id:
        ``"tcp"``, ``"hccl"`` (between daemons) or ``"local"`` (inside one daemon)."""
        return dict(self._link_transports)

    async def link_clusters(self, clusters: Sequence[LLMClusterInfo], timeout: int = 3000
                            ) -> tuple[LLMStatusCode, list[LLMStatusCode]]:
        """Link this cluster to remote clusters (one-sided; the remote side does nothing).

        Each ``LLMClusterInfo`` names the remote daemon's peer endpoint in its
        single remote ip info and the cluster inside it by ``remote_cluster_id``.

        Returns:
            ``(overall, per_cluster)``: overall is the last failure or success.

        Raises:
            RuntimeError: not initialized.
            TypeError / ValueError / LLMException: invalid arguments (link
                failures are reported in the result, never raised).
        """
        self._require_init()
        self._check_clusters(clusters, timeout, self._needs_local_ip())
        return await self._link_call(clusters, timeout, unlink=False)

    async def unlink_clusters(self, clusters: Sequence[LLMClusterInfo], timeout: int = 3000,
                              force: bool = False) -> tuple[LLMStatusCode, list[LLMStatusCode]]:
        """Unlink remote clusters; ``force`` tears down only the local side.

        Returns:
            ``(overall, per_cluster)`` as for `link_clusters`.
        """
        self._require_init()
        self._check_clusters(clusters, timeout, self._needs_local_ip())
        check_isinstance("force", force, bool, allow_none=False)
        return await self._link_call(clusters, timeout, unlink=True, force=force)

    async def query_link_states(self, timeout: int = 3000) -> list[LinkStatus]:
        """hixl extension: the state of every link of this cluster, outbound (made by
        ``link_clusters``) and inbound (made by other clusters to this one).

        Args:
            timeout: milliseconds (int32, > 0) the daemon may take to answer.

        Returns:
            One `LinkStatus` per link.

        Raises:
            RuntimeError: not initialized.
            LLMException: the daemon did not answer.
        """
        connection = self._require_init()
        check_int32("timeout", timeout)
        raise_if_false(timeout > 0, "timeout should be > 0, but got {0}.", timeout)
        reply = await connection.call("QueryLinkStates",
                                      client_pb2.QueryLinkStatesRequest(),
                                      timeout=timeout / 1000.0)
        return [LinkStatus(remote_cluster_id=link.remote_cluster_id, direction=link.direction,
                           state=LinkState(link.health.state), since=link.health.since_unix_s,
                           last_error=link.health.last_error,
                           streams_up=link.health.streams_up, streams=link.health.streams,
                           bytes=link.health.bytes, transfers=link.health.transfers,
                           failed_transfers=link.health.failed_transfers,
                           remote_daemon_id=link.remote_daemon_id, transport=link.transport,
                           lease_left_s=link.health.lease_left_s)
                for link in reply.links]

    def _needs_local_ip(self) -> bool:
        # Without llm.LocalCommRes, LLM-DataDist needs a local ip per cluster.
        return not self._options.get(OPT_LOCAL_COMM_RES)

    async def __aenter__(self) -> LLMDataDist:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.finalize()


__all__ = ["LLMDataDist", "LLMException", "normalize_options"]
