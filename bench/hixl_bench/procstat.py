"""What a process holds, read from ``/proc``, and what a daemon's pools hold (Admin).

The soak and link-scale tools compare these before and after: resident
memory (``VmRSS``), open file descriptors and threads of each daemon and of
the tool's own process, and each daemon's pool bytes, caches, sessions and
links from ``Admin/GetStatus``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import grpc.aio

from hixl_wire._proto.hixl.v1 import admin_pb2, admin_pb2_grpc

_STATUS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ProcFigures:
    """One process at one moment; -1 where ``/proc`` could not be read (it ended).

    ``rss_bytes`` is ``VmRSS``: it counts the pool pages this process has
    touched (shared memory), which grow as a run first writes a slot.
    ``anon_bytes`` is ``RssAnon``, private memory only: the heap, where a
    leak would show.
    """

    rss_bytes: int
    anon_bytes: int
    fds: int
    threads: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def _count(path: str) -> int:
    try:
        return len(os.listdir(path))
    except OSError:
        return -1


def _status_bytes(pid: int, fields: tuple[str, ...]) -> list[int]:
    found = dict.fromkeys(fields, -1)
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                name = line.split(":", 1)[0]
                if name in found:
                    found[name] = int(line.split()[1]) * 1024  # the file counts kB
    except OSError:
        pass
    return [found[name] for name in fields]


def proc_figures(pid: int) -> ProcFigures:
    """RSS, open fds and threads of ``pid`` (Linux ``/proc``)."""
    rss, anon = _status_bytes(pid, ("VmRSS", "RssAnon"))
    return ProcFigures(rss, anon, _count(f"/proc/{pid}/fd"), _count(f"/proc/{pid}/task"))


@dataclass(frozen=True)
class TaskTotals:
    """Every thread of a process, summed: time on a CPU (``schedstat``, in ns),
    and context switches: ``voluntary`` ones are waits (a thread that slept has
    to be woken, which on a virtual machine costs tens of microseconds),
    ``involuntary`` ones preemptions."""

    cpu_ns: int
    voluntary: int
    involuntary: int

    def __sub__(self, other: TaskTotals) -> TaskTotals:
        return TaskTotals(self.cpu_ns - other.cpu_ns, self.voluntary - other.voluntary,
                          self.involuntary - other.involuntary)


def _task_totals(task_dir: str) -> tuple[int, int, int]:
    with open(f"{task_dir}/schedstat", encoding="ascii") as schedstat:
        cpu_ns = int(schedstat.read().split()[0])
    voluntary = involuntary = 0
    with open(f"{task_dir}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary = int(line.split()[1])
    return cpu_ns, voluntary, involuntary


def task_totals(pid: int) -> TaskTotals:
    """The totals of ``pid``'s live threads (``/proc/PID/task/*``): a thread
    that ended takes its share with it, so read them around a window in which
    the process keeps its threads."""
    sums = [0, 0, 0]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return TaskTotals(-1, -1, -1)
    for task in tasks:
        try:
            figures = _task_totals(f"/proc/{pid}/task/{task}")
        except OSError:
            continue  # the thread ended meanwhile
        sums = [a + b for a, b in zip(sums, figures, strict=True)]
    return TaskTotals(*sums)


# The names asyncio's and uvloop's loops give their default executor's threads.
EXECUTOR_THREAD_PREFIXES = ("asyncio_", "uvloop_")


def executor_threads() -> int:
    """Threads of this process's event-loop default executor. The executor starts
    them as calls to ``asyncio.to_thread`` overlap, up to its bound
    (``min(32, cpus + 4)``), and keeps them, so how many there are says how many
    such calls once ran at once, not what was left behind."""
    return sum(1 for t in threading.enumerate() if t.name.startswith(EXECUTOR_THREAD_PREFIXES))


def less_executor(figures: ProcFigures, executor: int) -> ProcFigures:
    """``figures`` without the ``executor`` threads of a default executor."""
    return dataclasses.replace(figures, threads=figures.threads - executor)


def own_figures() -> ProcFigures:
    """This process's figures, less its default executor's threads."""
    return less_executor(proc_figures(os.getpid()), executor_threads())


@dataclass(frozen=True)
class PoolFigures:
    """A daemon's Admin view: what its clients hold, and its links by state."""

    reserved_bytes: int
    used_bytes: int
    pools: int
    caches: int
    sessions: int
    clusters: int
    links: dict[str, int]  # "outbound up", "inbound up", ... -> count

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def links_in(self, direction: str, state: str) -> int:
        return self.links.get(f"{direction} {state}", 0)


class StatusChannels:
    """``Admin/GetStatus`` over one channel per daemon, kept open between readings.

    A channel per reading would move the very figures being read: its socket
    closes a moment after the call, so the fd counts of the tool and of the
    daemon would never hold still for long. A kept channel is one socket on
    each side, the same in every reading (it reconnects to a restarted daemon
    on the same target by itself).
    """

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def status(self, target: str) -> admin_pb2.DaemonStatus:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = grpc.aio.insecure_channel(target)
        reply: admin_pb2.DaemonStatus = await admin_pb2_grpc.AdminStub(channel).GetStatus(
            admin_pb2.GetStatusRequest(), timeout=_STATUS_TIMEOUT_S, wait_for_ready=True)
        return reply

    async def aclose(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


def pool_figures(status: admin_pb2.DaemonStatus) -> PoolFigures:
    links = Counter(f"{link.direction} {link.health.state}" for link in status.links)
    return PoolFigures(
        reserved_bytes=status.pool_reserved_bytes,
        used_bytes=sum(pool.used for pool in status.pools), pools=len(status.pools),
        caches=len(status.caches), sessions=len(status.sessions),
        clusters=len(status.clusters), links=dict(sorted(links.items())))


def raise_nofile(wanted: int) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE towards ``wanted`` (never above the
    hard limit), so that it and the daemons it starts, which inherit it, can
    hold that many descriptors. Returns (soft before, soft after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def mib(value: int) -> float:
    return round(value / (1 << 20), 1)
