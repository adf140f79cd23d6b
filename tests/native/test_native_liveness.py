"""A data link reopens a lost stream in the background, and counts the streams up."""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, DataServer

hn = pytest.importorskip("hixl_native")

from tests.native._native_support import TOKEN  # noqa: E402

WAIT_S = 20.0  # generous: the machine is shared


def _socket_inodes() -> dict[int, int]:
    """inode -> fd of this process's sockets."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(name)
    return found


def _client_fds(server_port: int) -> list[int]:
    """fds of this process's TCP connections to ``server_port`` (the link's streams)."""
    inodes = _socket_inodes()
    fds = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as rows:
                lines = rows.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            inode = int(fields[9])
            if remote_port == server_port and fields[3] == "01" and inode in inodes:
                fds.append(inodes[inode])
    return fds


def _wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.02)


def test_a_lost_stream_is_reopened_in_the_background(server: DataServer,
                                                     cq: CompletionQueue) -> None:
    link = hn.DataLink("127.0.0.1", server.port, TOKEN, 2, cq, 2000)
    try:
        assert link.streams_up == 2
        fds = _client_fds(server.port)
        assert len(fds) == 2, fds
        # Shut one stream's connection down under the link, as a reset would:
        # its idle worker sees the connection end.
        with socket.socket(fileno=os.dup(fds[0])) as lost:
            lost.shutdown(socket.SHUT_RDWR)
        _wait_for(lambda: len(_client_fds(server.port)) == 2 and link.streams_up == 2
                  and link.alive, "the lost stream reconnected")
    finally:
        link.close()
    assert link.streams_up == 0


def test_a_revoked_link_stays_down(server: DataServer, cq: CompletionQueue) -> None:
    link = hn.DataLink("127.0.0.1", server.port, TOKEN, 1, cq, 2000)
    try:
        server.revoke(TOKEN)  # the server ends the token's connections
        _wait_for(lambda: not link.alive, "the link noticed the lost stream")
        # Reopening is tried (first after 0.2 s, then less often) and refused:
        # the token is gone, so the link never comes back to life.
        time.sleep(1.0)
        assert not link.alive and link.streams_up == 0
    finally:
        link.close()


def test_liveness_options_are_checked() -> None:
    with pytest.raises((ValueError, OverflowError)):
        hn.set_tcp_liveness(-1, 1, 3, 1000)
    hn.set_tcp_liveness(0, 0, 0, 0)  # the kernel's defaults again
