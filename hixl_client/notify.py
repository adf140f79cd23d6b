"""Notifications between linked clusters (a hixl extension, after HIXL's
SendNotify/GetNotifies and NIXL's notifs).

A cluster sends a small message to a cluster it linked to; that cluster's
client receives it on its session, in the order sent. Engines use it to say
"done with your blocks" (the vLLM connector does) without a channel of their own.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

from ._validation import check_isinstance
from .status import raise_if_false

# The daemon's bounds (hixl_service.notifies), checked here before any call.
MAX_NAME_BYTES = 1024
MAX_MESSAGE_BYTES = 65536
# Received notifications the client keeps for its reader; past this it stops
# reading its session until some are taken, and the daemon then refuses
# senders once its own inbox fills, so nothing is dropped silently.
CLIENT_INBOX_LIMIT = 65536


@dataclass(frozen=True)
class NotifyDesc:
    """One notification, as HIXL's ``NotifyDesc``.

    Args:
        name: a short label (at most 1 KiB of UTF-8), e.g. what the message is about.
        notify_msg: the message (at most 64 KiB); ``str`` is sent as UTF-8.
        remote_cluster_id: on a received notification, the cluster that sent
            it; ignored when sending.

    Raises:
        TypeError: ``name`` is not a str or ``notify_msg`` neither bytes nor str.
        LLMException: a bound is broken (``LLM_PARAM_INVALID``).
    """

    name: str = ""
    notify_msg: bytes = b""
    remote_cluster_id: int = 0

    def __post_init__(self) -> None:
        check_isinstance("name", self.name, str, allow_none=False)
        check_isinstance("notify_msg", self.notify_msg, (bytes, str), allow_none=False)
        if isinstance(self.notify_msg, str):
            object.__setattr__(self, "notify_msg", self.notify_msg.encode())
        raise_if_false(len(self.name.encode()) <= MAX_NAME_BYTES,
                       "name should be at most {0} bytes.", MAX_NAME_BYTES)
        raise_if_false(len(self.notify_msg) <= MAX_MESSAGE_BYTES,
                       "notify_msg should be at most {0} bytes.", MAX_MESSAGE_BYTES)


class NotifyInbox:
    """The notifications a session received and its reader has not taken yet."""

    def __init__(self, limit: int = CLIENT_INBOX_LIMIT) -> None:
        self._limit = limit
        self._waiting: collections.deque[NotifyDesc] = collections.deque()
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    async def put(self, notify: NotifyDesc) -> None:
        """Keep ``notify``; waits while the inbox is full (the session stops reading)."""
        while len(self._waiting) >= self._limit:
            self._room.clear()
            await self._room.wait()
        self._waiting.append(notify)
        self._arrived.set()

    def take(self) -> list[NotifyDesc]:
        """Every waiting notification, oldest first; [] when none."""
        taken = list(self._waiting)
        self._waiting.clear()
        self._arrived.clear()
        self._room.set()
        return taken

    async def wait(self) -> None:
        """Return once a notification is waiting."""
        while not self._waiting:
            self._arrived.clear()
            await self._arrived.wait()
