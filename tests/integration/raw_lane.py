"""A lane's framing spoken by hand over a blocking socket (tests only)."""

from __future__ import annotations

import socket

from hixl_wire._proto.hixl.v1 import common_pb2
from hixl_wire.lane import HEADER, REPLY_ERROR


class RawLane:
    """A lane's framing over a blocking socket, for what the libraries never send."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(10.0)

    @classmethod
    def unix(cls, path: str) -> RawLane:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return cls(sock)

    @classmethod
    def tcp(cls, host: str, port: int) -> RawLane:
        return cls(socket.create_connection((host, port), timeout=10.0))

    def send(self, call_id: int, kind: int, body: bytes = b"", timeout_ms: int = 0) -> None:
        self.sock.sendall(HEADER.pack(len(body), call_id, kind, timeout_ms, 0) + body)

    def receive(self) -> tuple[int, int, bytes]:
        header = self._exactly(HEADER.size)
        size, call_id, kind, _, _ = HEADER.unpack(header)
        return call_id, kind, self._exactly(size)

    def error(self) -> tuple[int, common_pb2.CallError]:
        call_id, kind, body = self.receive()
        assert kind == REPLY_ERROR
        return call_id, common_pb2.CallError.FromString(body)

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the daemon closed the lane")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()
