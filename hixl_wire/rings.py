"""Repeated transfers through shared memory: the rings of issue 32.

A repeat (RepeatPull or RepeatPush: a transfer of a shape the daemon gave a
``repeat_handle`` for) is small and frequent, and on the transfer lane most
of its time goes to Python on both ends and to waking sleeping processes.
So a client may ask its daemon for a pair of rings (``hixl_native.Ring``):
it writes a :data:`SUBMISSION` to one, a native thread of the daemon runs
it, with no Python on the way, and writes its :data:`COMPLETION` to the
other; a side that expects an answer soon spins for it instead of sleeping.

The pair comes with the reply to a HELLO whose ``tag`` is :data:`RINGS_TAG`,
sent on a new connection to the transfer lane's socket: REPLY_OK and the
:data:`PAIR_FDS` descriptors (SCM_RIGHTS), or REPLY_ERROR and none. After
that the socket carries nothing; it stays open so that each end sees the
other go away (a read that returns nothing).

Every submission gets exactly one completion with its call id:
``OUTCOME_OK`` (the bytes moved), ``OUTCOME_FAILED`` (the transfer ran and
failed with a native status: ``hixl_wire.link_status``) or
``OUTCOME_FALLBACK`` (nothing moved: the daemon cannot run it natively, and
the client sends the same repeat over the lane, which gives the full call's
result or error). A client never has more than :data:`MAX_IN_FLIGHT`
submissions unanswered, so the completion ring never fills.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from dataclasses import dataclass

from hixl_native import Ring

from .lane import HEADER, MAX_BODY

# The HELLO frame's tag that asks for rings instead of binding a lane.
RINGS_TAG = 1
# Bytes of each ring: far more than MAX_IN_FLIGHT frames of 40 bytes (32 and
# the ring's length and padding).
RING_CAPACITY = 1 << 16
MAX_IN_FLIGHT = 256
# call id, repeat handle, source batch slot, destination batch slot, the
# daemon's bound in ms, KIND_PULL or KIND_PUSH
SUBMISSION = struct.Struct("<QQIIII")
# call id, outcome, native status (OUTCOME_FAILED), bytes moved, microseconds
# of data movement, reserved (0)
COMPLETION = struct.Struct("<QiiQII")
# KIND_CANCEL: the caller of call id gave up; the daemon answers that call at
# once with OUTCOME_CANCELLED (its transfer runs on to its end), and the
# cancel itself gets no completion.
KIND_PULL, KIND_PUSH, KIND_CANCEL = 1, 2, 3
OUTCOME_OK, OUTCOME_FALLBACK, OUTCOME_FAILED, OUTCOME_CANCELLED = 0, 1, 2, 3
# The descriptors of a pair, in the order the HELLO reply carries them: the
# submission ring's memfd, wait and wake ends, then the completion ring's.
PAIR_FDS = 6


@dataclass
class RingPair:
    """One end of the two rings: what it reads and what it writes."""

    incoming: Ring
    outgoing: Ring

    def close(self) -> None:
        """Close both rings (idempotent)."""
        self.incoming.close()
        self.outgoing.close()


def new_pair() -> tuple[RingPair, list[int]]:
    """A fresh pair: the daemon's end (it reads submissions and writes
    completions) and the client's :data:`PAIR_FDS` descriptors, new ones that
    the caller sends with the HELLO reply and then closes."""
    submissions, client_submissions = Ring.create(RING_CAPACITY, producer=False)
    try:
        completions, client_completions = Ring.create(RING_CAPACITY, producer=True)
    except BaseException:
        submissions.close()
        for fd in client_submissions:
            os.close(fd)
        raise
    return RingPair(submissions, completions), [*client_submissions, *client_completions]


def attach_pair(fds: list[int]) -> RingPair:
    """The client's end (it reads completions and writes submissions) of the
    pair whose descriptors came with the HELLO reply; they are the rings'
    from now on, closed even when this raises.

    Raises:
        ValueError: not :data:`PAIR_FDS` descriptors.
        NativeError, OSError: they are not a pair's.
    """
    if len(fds) != PAIR_FDS:
        _close_all(fds)
        raise ValueError(f"a pair of rings comes with {PAIR_FDS} descriptors, not {len(fds)}")
    submissions = None
    try:
        submissions = Ring.attach(fds[0], fds[1], fds[2], producer=True)
        completions = Ring.attach(fds[3], fds[4], fds[5], producer=False)
    except BaseException:
        # Ring.attach closes its own descriptors when it fails.
        if submissions is None:
            _close_all(fds[3:])
        else:
            submissions.close()
        raise
    return RingPair(completions, submissions)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def send_with_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """Write ``data`` (a HELLO reply) with ``fds`` attached, whole, on a
    non-blocking socket that has nothing else queued (BlockingIOError if the
    kernel would not take it at once)."""
    sent = socket.send_fds(sock, [data], fds)
    if sent != len(data):
        raise BlockingIOError("the lane socket took part of the HELLO reply")


def receive_with_fds(sock: socket.socket, bufsize: int) -> tuple[bytes, list[int]]:
    """Read up to ``bufsize`` bytes and the descriptors that came with them."""
    data, fds, _flags, _addr = socket.recv_fds(sock, bufsize, PAIR_FDS)
    return data, list(fds)


def _whole_frame(data: bytes) -> bool:
    if len(data) < HEADER.size:
        return False
    size: int = HEADER.unpack_from(data)[0]
    if size > MAX_BODY:
        raise ConnectionError("the daemon's HELLO reply is malformed")
    return len(data) >= HEADER.size + size


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def greet(sock: socket.socket, frame: bytes) -> tuple[int, bytes, list[int]]:
    """Send the HELLO ``frame`` on a connected non-blocking unix socket and read
    the reply frame, with the descriptors that came with it (the caller's
    ``wait_for`` bounds it; descriptors read are closed when it fails).

    Returns:
        The reply's kind, its body and the descriptors.

    Raises:
        ConnectionError: the daemon closed the socket, or replied with a
            malformed frame.
    """
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, frame)
    data, fds = b"", list[int]()
    try:
        while not _whole_frame(data):
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), _wake, ready)
            try:
                await ready
            finally:
                loop.remove_reader(sock.fileno())
            with contextlib.suppress(BlockingIOError):
                chunk, more = receive_with_fds(sock, 64 * 1024)
                fds += more
                if not chunk:
                    raise ConnectionError("the daemon closed the connection during HELLO")
                data += chunk
        size, _, kind, _, _ = HEADER.unpack_from(data)
        if len(data) != HEADER.size + size:
            raise ConnectionError("the daemon's HELLO reply is malformed")
    except BaseException:
        _close_all(fds)
        raise
    return kind, data[HEADER.size:], fds


__all__ = ["COMPLETION", "KIND_PULL", "KIND_PUSH", "MAX_IN_FLIGHT", "OUTCOME_FAILED",
           "OUTCOME_FALLBACK", "OUTCOME_OK", "PAIR_FDS", "RINGS_TAG", "RING_CAPACITY",
           "SUBMISSION", "RingPair", "attach_pair", "greet", "new_pair", "receive_with_fds",
           "send_with_fds"]
