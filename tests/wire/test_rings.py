"""hixl_wire.rings: the layout of a submission and a completion, a pair made by
the daemon's end and attached by the client's (descriptors travelling over a
real unix socketpair), and the HELLO that asks for it; and
hixl_wire.link_status, the words both ends give a failed transfer."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator

import hixl_native
import pytest

from hixl_wire.lane import HEADER, KIND_HELLO, MAX_BODY, REPLY_ERROR, REPLY_OK, frame_of
from hixl_wire.link_status import LINK_STATUS, link_failure
from hixl_wire.rings import (
    COMPLETION,
    KIND_PULL,
    OUTCOME_OK,
    PAIR_FDS,
    RINGS_TAG,
    SUBMISSION,
    attach_pair,
    greet,
    new_pair,
    receive_with_fds,
    send_with_fds,
)
from hixl_wire.status import LLMStatusCode


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.fixture
def sockets() -> Iterator[tuple[socket.socket, socket.socket]]:
    client, daemon = socket.socketpair()
    with client, daemon:
        client.setblocking(False)
        yield client, daemon


def test_a_submission_and_a_completion_are_32_bytes() -> None:
    # The daemon's C thread reads them as packed structs of this size.
    assert SUBMISSION.size == COMPLETION.size == 32


def test_a_pair_carries_submissions_one_way_and_completions_the_other(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    client_sock, daemon_sock = sockets
    daemon, fds = new_pair()
    try:
        assert len(fds) == PAIR_FDS
        send_with_fds(daemon_sock, b"x", fds)
        for fd in fds:
            os.close(fd)
        data, received = receive_with_fds(client_sock, 16)
        assert data == b"x" and len(received) == PAIR_FDS
        client = attach_pair(received)
        try:
            submission = SUBMISSION.pack(7, 11, 1, 2, 1500, KIND_PULL)
            assert client.outgoing.write(submission)
            assert daemon.incoming.read() == submission
            completion = COMPLETION.pack(7, OUTCOME_OK, 0, 4096, 9, 0)
            assert daemon.outgoing.write(completion)
            assert client.incoming.read() == completion
            assert client.incoming.read() is None
        finally:
            client.close()
    finally:
        daemon.close()


def test_attaching_closes_the_descriptors_when_they_are_not_a_pair() -> None:
    pipes = [os.pipe() for _ in range(2)]
    few = [fd for pipe in pipes for fd in pipe]
    with pytest.raises(ValueError, match="6 descriptors, not 4"):
        attach_pair(few)
    assert not any(_is_open(fd) for fd in few)
    six = [fd for pipe in [os.pipe() for _ in range(3)] for fd in pipe]
    with pytest.raises(hixl_native.NativeError):
        attach_pair(six)  # pipes are no ring's memfd
    assert not any(_is_open(fd) for fd in six)


def _reply(kind: int, body: bytes = b"") -> bytes:
    return HEADER.pack(len(body), 0, kind, 0, 0) + body


@pytest.mark.asyncio
async def test_greet_sends_the_hello_and_reads_the_reply_with_its_descriptors(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    client, daemon = sockets
    hello = frame_of(0, KIND_HELLO, 1.0, RINGS_TAG, b"session")
    daemon_end, fds = new_pair()
    try:
        greeting = asyncio.ensure_future(greet(client, hello))
        await asyncio.sleep(0.01)
        assert daemon.recv(1024) == hello
        reply = _reply(REPLY_OK)
        send_with_fds(daemon, reply[:5], fds)  # a reply in two pieces, the fds with the first
        for fd in fds:
            os.close(fd)
        await asyncio.sleep(0.01)
        daemon.sendall(reply[5:])
        kind, body, received = await asyncio.wait_for(greeting, 1.0)
        assert (kind, body, len(received)) == (REPLY_OK, b"", PAIR_FDS)
        attach_pair(received).close()
    finally:
        daemon_end.close()


@pytest.mark.asyncio
async def test_greet_reads_a_refusal_without_descriptors(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    client, daemon = sockets
    daemon.sendall(_reply(REPLY_ERROR, b"why"))
    assert await asyncio.wait_for(greet(client, b"hello"), 1.0) == (REPLY_ERROR, b"why", [])


@pytest.mark.asyncio
@pytest.mark.parametrize("reply", [b"", HEADER.pack(MAX_BODY + 1, 0, REPLY_OK, 0, 0)],
                         ids=["closed", "oversized"])
async def test_greet_fails_when_the_daemon_closes_or_sends_a_bad_frame_and_closes_its_fds(
        sockets: tuple[socket.socket, socket.socket], reply: bytes) -> None:
    client, daemon = sockets
    read, write = os.pipe()
    os.close(write)
    if reply:
        send_with_fds(daemon, reply, [read])
    else:
        send_with_fds(daemon, HEADER.pack(4, 0, REPLY_OK, 0, 0), [read])
        daemon.shutdown(socket.SHUT_WR)
    os.close(read)
    before = _open_fds()
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(greet(client, b"hello"), 1.0)
    assert _open_fds() == before  # the descriptor that came is closed


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("status", [*LINK_STATUS, -9999])
def test_a_link_failure_names_its_native_status(status: int) -> None:
    code, text = link_failure(status)
    assert text.endswith(f" (native status {status})")
    assert code == LINK_STATUS.get(status, (LLMStatusCode.LLM_FAILED, ""))[0]


def test_the_link_statuses_that_matter_to_a_repeat() -> None:
    assert link_failure(hixl_native.E_TIMEOUT)[0] == LLMStatusCode.LLM_TIMEOUT
    assert link_failure(hixl_native.E_CHECKSUM)[0] == LLMStatusCode.LLM_LINK_FAILED
    assert link_failure(hixl_native.E_CLOSED)[0] == LLMStatusCode.LLM_LINK_FAILED
