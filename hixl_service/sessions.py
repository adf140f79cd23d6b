"""Sessions: one per attached client connection, each owning at most one cluster."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

import grpc

from hixl_wire.status import LLMStatusCode

from .cluster import Cluster
from .drain import refusal
from .log_keys import keys
from .notifies import Inbox
from .rpc_errors import CallRefused

logger = logging.getLogger(__name__)


def no_session(message: str) -> CallRefused:
    """A call without a valid session: UNAUTHENTICATED, with LLM-DataDist's code for a
    call before init (LLM_FAILED)."""
    return CallRefused(message, LLMStatusCode.LLM_FAILED, grpc.StatusCode.UNAUTHENTICATED,
                       reason="no_session")


@dataclass
class Session:
    """One attached client connection; owns at most one cluster."""

    session_id: str
    client_pid: int
    client_name: str
    cluster: Cluster | None = None
    # The transfer lane's use, for the admin status.
    lane_connections: int = 0
    lane_calls: int = 0
    # Notifications from linked clusters, which the Attach stream delivers.
    inbox: Inbox = field(default_factory=Inbox)


class Sessions:
    """The attached sessions, by id."""

    def __init__(self) -> None:
        self._by_id: dict[str, Session] = {}
        self.closing = False  # the daemon is stopping: no new sessions
        # Lane calls of the sessions gone, so that the daemon's total only grows (metrics).
        self.retired_lane_calls = 0

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._by_id

    def values(self) -> list[Session]:
        return list(self._by_id.values())

    def attach(self, client_pid: int, client_name: str) -> Session:
        if self.closing:
            raise refusal("sessions")
        session = Session(secrets.token_hex(16), client_pid, client_name)
        self._by_id[session.session_id] = session
        logger.info("session %s attached (pid %d, %s)", session.session_id, client_pid,
                    client_name or "unnamed", extra=keys(session=session.session_id))
        return session

    def get(self, session_id: str) -> Session:
        session = self._by_id.get(session_id)
        if session is None:
            raise no_session("the call's session is unknown to this daemon (expired, or "
                             "attached to another daemon); attach again")
        return session

    def pop(self, session: Session) -> bool:
        """Forget a session; False if it was already gone."""
        if self._by_id.pop(session.session_id, None) is None:
            return False
        session.inbox.close()
        self.retired_lane_calls += session.lane_calls
        return True
