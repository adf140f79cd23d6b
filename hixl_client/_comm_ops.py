"""LLMDataDist's role and communicator calls: switch_role, link, unlink, and the v1 leftovers.

hixl links clusters one-sidedly (``link_clusters``); the two-sided HCCL
communicator calls of LLM-DataDist keep their validation and then answer
``LLM_FEATURE_NOT_ENABLED`` on the host backend, so ported code learns at
once which call to use instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hixl_wire._proto.hixl.v1 import client_pb2

from ._validation import check_dict, check_isinstance, check_uint32, check_uint64
from .status import LLMException, LLMStatusCode, raise_if_false
from .types import LLMRole, RegisterMemStatus

if TYPE_CHECKING:
    from ._transport import DaemonConnection

MAX_COMM_NAME = 128
MAX_COMM_RANKS = 4


def _not_on_this_backend(what: str, instead: str) -> LLMException:
    return LLMException(f"{what} is not available on hixl's host backend; use {instead}",
                        status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)


def _v1_only(what: str) -> LLMException:
    return LLMException(f"{what} belongs to LLM-DataDist's v1 mode; hixl runs in cache-manager "
                        "mode", status_code=LLMStatusCode.LLM_PARAM_INVALID)


class CommOps:
    """Mixed into LLMDataDist; relies on its session and options."""

    _role: LLMRole
    _options: dict[str, str]

    def _require_init(self) -> DaemonConnection:
        raise NotImplementedError

    async def switch_role(self, role: LLMRole,
                          switch_options: dict[str, str] | None = None) -> None:
        """Change the cluster's role label (a label only in cache-manager mode).

        Raises:
            RuntimeError: not initialized.
            TypeError: ``role`` is not an LLMRole, or the options are not a dict.
            LLMException: links exist (``LLM_EXIST_LINK``), a malformed
                ``llm.listenIpInfo``, or a different listen address, which the hixl
                backend cannot change (``LLM_FEATURE_NOT_ENABLED``).
        """
        connection = self._require_init()
        check_isinstance("role", role, LLMRole, allow_none=False)
        check_isinstance("switch_options", switch_options, dict)
        listen = (switch_options or {}).get("llm.listenIpInfo")
        if listen is not None:
            parts = listen.split(":")
            raise_if_false(len(parts) == 2, "llm.listenIpInfo should be 'ip:port', got {0}.",
                           listen)
            current = self._options.get("llm.listenIpInfo")
            if current is not None and current != listen:
                raise LLMException("the hixl backend cannot change the listen address",
                                   status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        await connection.call("SwitchRole",
                              client_pb2.SwitchRoleRequest(role=int(role)))
        self._role = role

    async def link(self, comm_name: str, cluster_rank_info: dict[int, int], rank_table: str) -> int:
        """LLM-DataDist's two-sided HCCL link: validated, then not available here.

        Raises:
            TypeError / ValueError / LLMException: LLM-DataDist's checks, then
                ``LLM_FEATURE_NOT_ENABLED`` (link with ``link_clusters`` instead).
        """
        self._require_init()
        check_isinstance("comm_name", comm_name, str, allow_none=False)
        raise_if_false(len(comm_name) > 0, "comm_name should not be empty.")
        raise_if_false(len(comm_name) < MAX_COMM_NAME, "comm_name should be shorter than "
                       "{0} characters.", MAX_COMM_NAME)
        check_isinstance("cluster_rank_info", cluster_rank_info, dict, allow_none=False)
        check_dict("cluster_rank_info", cluster_rank_info, int, int)
        raise_if_false(len(cluster_rank_info) <= MAX_COMM_RANKS, "cluster_rank_info supports "
                       "at most {0} clusters.", MAX_COMM_RANKS)
        for cluster_id, rank in cluster_rank_info.items():
            check_uint64("cluster_id", cluster_id)
            check_uint32("rank", rank)
        check_isinstance("rank_table", rank_table, str)
        raise_if_false(len(cluster_rank_info) >= 2, "cluster_rank_info needs at least 2 "
                       "clusters.")
        ranks = list(cluster_rank_info.values())
        raise_if_false(ranks == sorted(ranks) and len(set(ranks)) == len(ranks),
                       "ranks of cluster_rank_info should be ascending.")
        raise _not_on_this_backend("link", "link_clusters")

    async def unlink(self, comm_id: int) -> None:
        """LLM-DataDist's two-sided unlink: validated, then not available here."""
        self._require_init()
        check_isinstance("comm_id", comm_id, int, allow_none=False)
        check_uint64("comm_id", comm_id)
        raise _not_on_this_backend("unlink", "unlink_clusters")

    async def query_register_mem_status(self, comm_id: int) -> RegisterMemStatus:
        """LLM-DataDist's communicator memory status: validated, then not available here."""
        self._require_init()
        check_isinstance("comm_id", comm_id, int, allow_none=False)
        check_uint64("comm_id", comm_id)
        raise _not_on_this_backend("query_register_mem_status",
                                   "link_clusters (memory is ready once it returns)")

    @property
    def kv_cache_manager(self) -> None:
        """LLM-DataDist's v1 manager: not in cache-manager mode."""
        self._require_init()
        raise _v1_only("kv_cache_manager")

    async def check_link_status(self, remote_cluster_id: int) -> None:
        """LLM-DataDist's v1 link check: not in cache-manager mode."""
        self._require_init()
        raise _v1_only("check_link_status")
