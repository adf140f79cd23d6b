"""Notifications: small messages from one cluster to another it linked to.

HIXL has SendNotify/GetNotifies and NIXL its notifs; engines use them to say
"I am done with your blocks" without a channel of their own. A cluster sends
over one of its outbound links (``SendNotify``); the far daemon queues the
message in the linked cluster's session inbox, and that session's Attach
stream carries it to the client. Nothing here waits on the receiving client:
an inbox holds at most INBOX_LIMIT messages, and a send into a full one is
refused at once, so a client that stopped reading makes its senders fail
rather than the daemon grow.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

from hixl_wire.status import LLMException, LLMStatusCode

# Per receiving session: engines drain theirs every step, so a full inbox
# means a client that stopped reading.
INBOX_LIMIT = 65536
# A notification names a request or a handful of them; a larger payload
# belongs on the data plane.
MAX_MESSAGE_BYTES = 65536
MAX_NAME_BYTES = 1024


@dataclass(frozen=True)
class Notification:
    """One message, as delivered: who sent it, its name and its bytes."""

    src_cluster_id: int
    name: str
    message: bytes


def check_notification(name: str, message: bytes) -> None:
    """Refuse a name or message over its bound.

    Raises:
        LLMException: ``LLM_PARAM_INVALID`` naming the bound.
    """
    if len(name.encode()) > MAX_NAME_BYTES or len(message) > MAX_MESSAGE_BYTES:
        raise LLMException(f"a notification's name is at most {MAX_NAME_BYTES} bytes and its "
                           f"message at most {MAX_MESSAGE_BYTES} bytes, got "
                           f"{len(name.encode())} and {len(message)}",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)


class Inbox:
    """The notifications waiting for one session's client, in arrival order."""

    def __init__(self, limit: int = INBOX_LIMIT) -> None:
        self._limit = limit
        self._waiting: collections.deque[Notification] = collections.deque()
        self._arrived = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, notification: Notification) -> None:
        """Queue ``notification`` for the client.

        Raises:
            LLMException: the inbox is closed (``LLM_NOT_YET_LINK``: the
                cluster is gone) or full (``LLM_OUT_OF_MEMORY``).
        """
        if self._closed:
            raise LLMException("the linked cluster's session ended",
                               status_code=LLMStatusCode.LLM_NOT_YET_LINK)
        if len(self._waiting) >= self._limit:
            raise LLMException(f"the linked cluster has {self._limit} notifications it has "
                               "not read; refused",
                               status_code=LLMStatusCode.LLM_OUT_OF_MEMORY)
        self._waiting.append(notification)
        self._arrived.set()

    async def take(self) -> list[Notification]:
        """Every waiting notification, once there is one; [] once closed."""
        while not self._waiting and not self._closed:
            self._arrived.clear()
            await self._arrived.wait()
        taken = list(self._waiting)
        self._waiting.clear()
        return taken

    def close(self) -> None:
        """Refuse new notifications and wake the reader (the session ends)."""
        self._closed = True
        self._waiting.clear()
        self._arrived.set()
