"""Blocking facade with LLM-DataDist's names, signatures and behaviour.

Porting code written for LLM-DataDist is one import line::

    from llm_datadist import LLMDataDist, LLMRole, CacheDesc, ...      # before
    from hixl_client.sync import LLMDataDist, LLMRole, CacheDesc, ...  # after

Every blocking method runs the matching coroutine of the async client
(`hixl_client`) on one private event loop, in a daemon thread named
``hixl-sync-loop`` that starts on first use and is shared by the whole process;
any number of plain threads may call at once. Calling from a thread that runs
an event loop raises ``RuntimeError``: async code uses `hixl_client` directly.
Exceptions are the async client's, unchanged (types, messages, status codes),
and `Cache` is the async client's class. grpc.aio supports one event loop per
process, so use either this facade or the async client in a process, not both.

As in LLM-DataDist, one `LLMDataDist` may be initialized per process, and an
``atexit`` hook finalizes one that is still initialized. The daemon is found
through ``$HIXL_DAEMON`` or the default socket, or `set_daemon`. LLM-DataDist's
legacy (v1) ``KvCache`` type is exported for porting; its v1 manager is not provided.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from ._sync_cache import CacheManager, CacheTask
from ._sync_loop import call_method, ensure_not_in_loop, run
from ._validation import check_isinstance
from .cache import Cache
from .config import LLMClusterInfo, LLMConfig, LlmConfig
from .keys import BlocksCacheKey, CacheKey, CacheKeyByIdAndIndex
from .kv_cache import KvCache
from .llm_datadist import LLMDataDist as _AsyncLLMDataDist
from .notify import NotifyDesc
from .status import LLMException, LLMStatusCode, Status, raise_if_false
from .transfer_config import TransferConfig, TransferWithCacheKeyConfig
from .types import (
    CacheDesc,
    DataType,
    LayerSynchronizer,
    LinkStatus,
    LLMRole,
    MemInfo,
    Memtype,
    Placement,
    RegisterMemStatus,
    role_to_str,
)

if TYPE_CHECKING:
    from .cache_manager import CacheManager as _AsyncCacheManager

__all__ = [
    "BlocksCacheKey",
    "Cache",
    "CacheDesc",
    "CacheKey",
    "CacheKeyByIdAndIndex",
    "CacheManager",
    "CacheTask",
    "DataType",
    "KvCache",
    "LLMClusterInfo",
    "LLMConfig",
    "LLMDataDist",
    "LLMException",
    "LLMRole",
    "LLMStatusCode",
    "LayerSynchronizer",
    "LlmConfig",
    "MemInfo",
    "Memtype",
    "NotifyDesc",
    "Placement",
    "RegisterMemStatus",
    "Status",
    "TransferConfig",
    "TransferWithCacheKeyConfig",
    "set_daemon",
]

logger = logging.getLogger(__name__)

_OWNER = "LLMDataDist"
# Set by set_daemon(); None means $HIXL_DAEMON or the default socket.
_daemon_target: str | None = None


def set_daemon(target: str) -> None:
    """Point the facade at a daemon without setting ``$HIXL_DAEMON``.

    Applies to `LLMDataDist` objects constructed afterwards; it wins over
    ``$HIXL_DAEMON`` and the default socket.

    Args:
        target: the daemon's gRPC target, ``unix:/path/hixl.sock`` or ``host:port``.

    Raises:
        TypeError: ``target`` is not a str.
        LLMException: ``target`` is empty (``LLM_PARAM_INVALID``).
    """
    global _daemon_target
    check_isinstance("target", target, str, allow_none=False)
    raise_if_false(bool(target), "target should not be empty.")
    _daemon_target = target


class LLMDataDist:
    """LLM-DataDist's blocking LLMDataDist: one cluster attached to the local daemon.

    Only one instance may be initialized per process at a time
    (`llm_engine_instance`).

    Args:
        role: the cluster's role label.
        cluster_id: the cluster's id (uint64), unique among linked clusters.

    Raises:
        TypeError: ``role`` is not an LLMRole or ``cluster_id`` not an int.
        ValueError: ``cluster_id`` is not a uint64.
    """

    llm_engine_instance: ClassVar[LLMDataDist | None] = None
    # Serializes init and finalize across threads; never taken on the loop thread.
    _engine_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, role: LLMRole, cluster_id: int) -> None:
        self._async = _AsyncLLMDataDist(role, cluster_id, daemon=_daemon_target)
        self._manager: tuple[_AsyncCacheManager, CacheManager] | None = None

    @staticmethod
    def _role_to_str(role: LLMRole) -> str:
        return role_to_str(role)

    @property
    def cluster_id(self) -> int:
        """The cluster id given at construction."""
        return self._async.cluster_id

    @property
    def cache_manager(self) -> CacheManager:
        """The blocking cache manager of the initialized cluster.

        Raises:
            RuntimeError: not initialized.
        """
        manager = self._async.cache_manager
        if self._manager is None or self._manager[0] is not manager:
            self._manager = (manager, CacheManager(manager))
        return self._manager[1]

    @property
    def kv_cache_manager(self) -> Any:
        """LLM-DataDist's legacy (v1) KV cache manager.

        Raises:
            LLMException: not available in cache-manager mode.
        """
        if not hasattr(type(self._async), "kv_cache_manager"):
            raise LLMException(f"{_OWNER}.kv_cache_manager belongs to LLM-DataDist's legacy "
                               "mode, which hixl does not provide; use cache_manager",
                               status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        return getattr(self._async, "kv_cache_manager", None)

    def init(self, options: dict[str, str]) -> None:
        """Attach to the daemon and create this cluster's pools.

        Returns at once if this instance is already initialized.

        Args:
            options: engine options, e.g. ``LLMConfig().generate_options()``.

        Raises:
            LLMException: another LLMDataDist of this process is initialized
                (``LLM_FAILED``), or the options or the daemon refused the cluster.
            TypeError: ``options`` is not a dict.
            ImportError: the options ask for LLM-DataDist's legacy mode.
            RuntimeError: called from a thread that runs an event loop.
        """
        ensure_not_in_loop()
        with LLMDataDist._engine_lock:
            if self._async.is_initialized:
                return
            if LLMDataDist.llm_engine_instance is not None:
                raise LLMException("Cannot init multiple LLMDataDists",
                                   status_code=LLMStatusCode.LLM_FAILED)
            run(self._async.init, options)
            LLMDataDist.llm_engine_instance = self

    def finalize(self) -> None:
        """Free the cluster's caches, links and pools in the daemon (no-op if not initialized).

        Raises:
            LLMException: the daemon failed to answer; the instance is finalized anyway.
            RuntimeError: called from a thread that runs an event loop.
        """
        ensure_not_in_loop()
        with LLMDataDist._engine_lock:
            if not self._async.is_initialized:
                return
            try:
                run(self._async.finalize)
            finally:
                if self._manager is not None:
                    self._manager[1]._close_lanes()
                if LLMDataDist.llm_engine_instance is self:
                    LLMDataDist.llm_engine_instance = None

    def link_clusters(self, clusters: list[LLMClusterInfo] | tuple[LLMClusterInfo, ...],
                      timeout: int = 3000) -> tuple[LLMStatusCode, list[LLMStatusCode]]:
        """Link this cluster to remote clusters (one-sided).

        Args:
            clusters: one LLMClusterInfo per remote cluster.
            timeout: milliseconds (int32, > 0).

        Returns:
            ``(overall, per_cluster)``; link failures are reported here, never raised.

        Raises:
            RuntimeError: not initialized, or called from a running event loop.
            TypeError / ValueError / LLMException: invalid arguments.
        """
        return run(self._async.link_clusters, clusters, timeout)

    def unlink_clusters(self, clusters: list[LLMClusterInfo] | tuple[LLMClusterInfo, ...],
                        timeout: int = 3000, force: bool = False
                        ) -> tuple[LLMStatusCode, list[LLMStatusCode]]:
        """Unlink remote clusters; ``force`` tears down only the local side.

        Returns:
            ``(overall, per_cluster)`` as for `link_clusters`.

        Raises:
            RuntimeError: not initialized, or called from a running event loop.
            TypeError / ValueError / LLMException: invalid arguments.
        """
        return run(self._async.unlink_clusters, clusters, timeout, force)

    def query_link_states(self, timeout: int = 3000) -> list[LinkStatus]:
        """hixl extension: the state of every link of this cluster, outbound and inbound.

        Args:
            timeout: milliseconds (int32, > 0) the daemon may take to answer.

        Returns:
            One `LinkStatus` per link.

        Raises:
            RuntimeError: not initialized, or called from a running event loop.
            LLMException: the daemon did not answer.
        """
        return run(self._async.query_link_states, timeout)

    @property
    def peer_address(self) -> str:
        """hixl extension: where other daemons reach this cluster's daemon ("" before init)."""
        return self._async.peer_address

    def send_notify(self, remote_cluster_id: int, notify: NotifyDesc,
                    timeout_in_millis: int = 1000) -> None:
        """hixl extension: send a notification to a linked cluster (HIXL's SendNotify);
        as the async client's ``send_notify``."""
        run(self._async.send_notify, remote_cluster_id, notify, timeout_in_millis)

    def get_notifies(self) -> list[NotifyDesc]:
        """hixl extension: take the notifications received so far, oldest first
        (HIXL's GetNotifies); never waits."""
        taken: list[NotifyDesc] = call_method(self._async, _OWNER, "get_notifies")
        return taken

    def switch_role(self, role: LLMRole, switch_options: dict[str, str] | None = None) -> None:
        """Change the role label and, optionally, the listen address.

        Raises:
            LLMException: ``LLM_FEATURE_NOT_ENABLED`` where this release lacks it.
        """
        call_method(self._async, _OWNER, "switch_role", role, switch_options)

    def link(self, comm_name: str, cluster_rank_info: dict[int, int], rank_table: str) -> int:
        """Two-sided (HCCL) link of several clusters.

        Returns:
            The communication id.

        Raises:
            LLMException: ``LLM_FEATURE_NOT_ENABLED`` where this release lacks it.
        """
        comm_id: int = call_method(self._async, _OWNER, "link", comm_name, cluster_rank_info,
                                   rank_table)
        return comm_id

    def unlink(self, comm_id: int) -> None:
        """Undo a two-sided `link`.

        Raises:
            LLMException: ``LLM_FEATURE_NOT_ENABLED`` where this release lacks it.
        """
        call_method(self._async, _OWNER, "unlink", comm_id)

    def query_register_mem_status(self, comm_id: int) -> RegisterMemStatus:
        """Whether the memory of a two-sided link is ready.

        Raises:
            LLMException: ``LLM_FEATURE_NOT_ENABLED`` where this release lacks it.
        """
        status: RegisterMemStatus = call_method(self._async, _OWNER,
                                                "query_register_mem_status", comm_id)
        return status

    def check_link_status(self, remote_cluster_id: int) -> None:
        """LLM-DataDist's legacy (v1) link check.

        Raises:
            LLMException: ``LLM_FEATURE_NOT_ENABLED`` where this release lacks it.
        """
        call_method(self._async, _OWNER, "check_link_status", remote_cluster_id)


def _shutdown_handler() -> None:
    """Finalize the process's initialized LLMDataDist at exit, as LLM-DataDist does."""
    instance = LLMDataDist.llm_engine_instance
    if instance is None:
        return
    try:
        instance.finalize()
    except LLMException as err:
        logger.warning("finalizing LLMDataDist(cluster_id=%s) at exit failed: %s",
                       instance.cluster_id, err)


atexit.register(_shutdown_handler)
