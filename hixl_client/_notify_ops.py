"""LLMDataDist's notification calls (``notify``): send, take, wait."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from hixl_wire._proto.hixl.v1 import client_pb2

from ._validation import check_int32, check_isinstance, check_uint64
from .notify import NotifyDesc
from .status import raise_if_false

if TYPE_CHECKING:
    from ._transport import DaemonConnection


class NotifyOps:
    """Mixed into LLMDataDist; relies on its session."""

    def _require_init(self) -> DaemonConnection:
        raise NotImplementedError

    async def send_notify(self, remote_cluster_id: int, notify: NotifyDesc,
                          timeout_in_millis: int = 1000) -> None:
        """Send ``notify`` to a cluster this one linked to (hixl extension, after
        HIXL's SendNotify). Returns once the far daemon queued it for that
        cluster's client; notifications to one cluster arrive in the order sent.

        Args:
            remote_cluster_id: a cluster that ``link_clusters`` linked this one to.
            notify: the notification (its ``remote_cluster_id`` is ignored).
            timeout_in_millis: bounds the call (int32, > 0).

        Raises:
            RuntimeError: not initialized.
            TypeError / ValueError: wrong argument types or ranges.
            LLMException: ``LLM_NOT_YET_LINK`` (no link to that cluster, or it is
                gone), ``LLM_OUT_OF_MEMORY`` (its client left too many unread),
                ``LLM_TIMEOUT``, ``LLM_LINK_FAILED`` (its daemon unreachable).
        """
        connection = self._require_init()
        check_uint64("remote_cluster_id", remote_cluster_id)
        check_isinstance("notify", notify, NotifyDesc, allow_none=False)
        check_int32("timeout_in_millis", timeout_in_millis)
        raise_if_false(timeout_in_millis > 0, "timeout_in_millis should be > 0, but got {0}.",
                       timeout_in_millis)
        request = client_pb2.SendNotifyRequest(remote_cluster_id=remote_cluster_id,
                                               name=notify.name, message=notify.notify_msg,
                                               timeout_ms=timeout_in_millis)
        await connection.transfer("SendNotify", request, timeout=timeout_in_millis / 1000.0)

    def get_notifies(self) -> list[NotifyDesc]:
        """Take every notification received so far, oldest first (hixl extension,
        after HIXL's GetNotifies); each names its sender in ``remote_cluster_id``.
        Never waits: [] when none arrived.

        Raises:
            RuntimeError: not initialized.
        """
        return self._require_init().notifies.take()

    async def wait_notifies(self, timeout_in_millis: int | None = None) -> list[NotifyDesc]:
        """Wait until at least one notification arrived, then take them all as
        :meth:`get_notifies` does; [] if none came within ``timeout_in_millis``
        (None: wait as long as it takes).

        Raises:
            RuntimeError: not initialized.
        """
        connection = self._require_init()
        if timeout_in_millis is not None:
            check_int32("timeout_in_millis", timeout_in_millis)
            raise_if_false(timeout_in_millis >= 0,
                           "timeout_in_millis should be >= 0, but got {0}.", timeout_in_millis)
        try:
            await asyncio.wait_for(connection.notifies.wait(),
                                   None if timeout_in_millis is None
                                   else timeout_in_millis / 1000.0)
        except asyncio.TimeoutError:
            return []
        return connection.notifies.take()
