"""How many transfer calls the daemon has under way: whether one may hold the loop.

A transfer alone in the daemon moves a small request on the event loop's own
thread: a TCP transfer waits for its reply there (``transports.tcp.INLINE_WAIT_US``)
and a local copy up to 1 MiB is made there (``copier.INLINE_COPY_BYTES``),
since the hop to another thread and back costs more than the bytes. While
other transfer calls are under way the loop's thread is theirs to run, so
the bytes move on the data link's workers or the native copy threads and
both cores work.

Counting native requests awaiting completion is not enough: with many
pulls in flight, each could find itself alone (the others read but not yet
started, or ended inline), and the loop's thread, busy receiving payloads,
then capped the daemon's rate. So calls are counted from acceptance.

A call counts from the moment the daemon accepts it: when the transfer lane
reads its frame (its handler may start later; ``lane_server``), or when a
gRPC transfer handler starts (``interceptors.LoadInterceptor``). Each
transport counts its own calls; the handlers do not count. Transfer calls
are the lane's (``CLIENT_METHODS``): pulls, pushes, copies, swaps
and a layer-wise task's ``LayerReady``; a layer announced on the task's own
gRPC stream (no lane) is not counted.
"""

from __future__ import annotations

from typing import Any


class TransferLoad:
    """A count of the transfer calls accepted and not yet answered."""

    __slots__ = ("running",)

    def __init__(self) -> None:
        self.running = 0

    @property
    def alone(self) -> bool:
        """At most one transfer call is under way (the caller's own)."""
        return self.running <= 1

    def begin(self) -> None:
        self.running += 1

    def end(self, _done: Any = None) -> None:
        """One call ended; takes (and ignores) a task, to serve as its done callback."""
        self.running -= 1
