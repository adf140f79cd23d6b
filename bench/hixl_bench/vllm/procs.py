"""A server's process group as ``/proc`` shows it: members, threads, ending, pinning.

Linux only, standard library only. A vLLM server is a process group (the
API server leads it; EngineCore and the worker are its children), so it is
ended as a group and its threads are found through the group.

Why :func:`isolate` exists (vLLM 0.32 CPU with NixlConnector, nixl 1.5):

* NixlConnector's worker calls ``os.sched_setaffinity(0, ...)`` while it is
  built, on the worker's main thread, with the last core of each NUMA node
  (meant as a core kept for KV loads). That thread runs the model, so the
  ``VLLM_CPU_OMP_THREADS_BIND`` core is lost: on a 2-core machine a P bound
  to core 0 computes on core 1, next to D.
* nixl's Python agent sets the UCX progress thread's delay to 0, so that
  thread polls without sleeping: one core's worth of CPU per server, idle
  or not, whatever ``UCX_TLS`` is. vLLM offers no setting that turns it off.

:func:`isolate` puts every thread of the group back on the server's core
(so one server's model and polling stay on one core), and can move the
threads that poll to ``SCHED_IDLE``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ThreadInfo",
    "cpu_seconds",
    "end_group",
    "group_alive",
    "group_members",
    "group_threads",
    "isolate",
    "pollers",
    "thread_seconds",
]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stat_fields(path: str) -> tuple[str, list[str]] | None:
    """(name, fields after the name) of a /proc stat file; None when it is gone."""
    try:
        stat = Path(path).read_text()
    except OSError:
        return None
    # the name in parentheses may hold spaces and parentheses: fields follow the last ')'
    return stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (0 when it is gone)."""
    parsed = _stat_fields(f"/proc/{pid}/stat")
    if parsed is None or len(parsed[1]) < 13:
        return 0.0
    return (int(parsed[1][11]) + int(parsed[1][12])) * _TICK_S


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU time so far of process ``pid``'s threads, summed by thread name."""
    by_name: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return by_name
    for tid in tids:
        parsed = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
        if parsed is None or len(parsed[1]) < 13:
            continue
        used = (int(parsed[1][11]) + int(parsed[1][12])) * _TICK_S
        by_name[parsed[0]] = by_name.get(parsed[0], 0.0) + used
    return by_name


def group_members(pgid: int) -> list[tuple[int, str, int]]:
    """(pid, name, VmRSS bytes) of the live processes of group ``pgid`` (zombies skipped)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        parsed = _stat_fields(f"/proc/{entry}/stat")
        if parsed is None or len(parsed[1]) < 3:
            continue
        name, fields = parsed
        if fields[0] == "Z" or int(fields[2]) != pgid:
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        rss = next((int(line.split()[1]) * 1024 for line in status.splitlines()
                    if line.startswith("VmRSS:")), 0)
        members.append((int(entry), name, rss))
    return members


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies do not count)."""
    if os.path.isdir("/proc/self"):
        return bool(group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    return True


def end_group(popen: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the group that ``popen`` leads, SIGKILL after ``grace_s`` (bounded)."""
    pgid = popen.pid  # start_new_session: the child leads its own group
    for sig, bound in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            popen.poll()
            if not group_alive(pgid):
                popen.poll()
                return
            time.sleep(0.2)
    popen.poll()


@dataclass(frozen=True)
class ThreadInfo:
    """One thread of a server: where it may run and the CPU it has used."""

    pid: int
    tid: int
    process: str
    name: str
    cpus: frozenset[int]
    cpu_s: float


def group_threads(pgid: int) -> list[ThreadInfo]:
    """Every thread of every live process of group ``pgid``."""
    threads = []
    for pid, process, _ in group_members(pgid):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for entry in tids:
            parsed = _stat_fields(f"/proc/{pid}/task/{entry}/stat")
            if parsed is None or len(parsed[1]) < 13:
                continue
            tid = int(entry)
            try:
                cpus = frozenset(os.sched_getaffinity(tid))
            except OSError:
                continue
            used = (int(parsed[1][11]) + int(parsed[1][12])) * _TICK_S
            threads.append(ThreadInfo(pid, tid, process, parsed[0], cpus, used))
    return threads


def _running(tids: list[int]) -> set[int]:
    """The threads among ``tids`` in state R (running or runnable) right now."""
    running = set()
    for tid in tids:
        parsed = _stat_fields(f"/proc/{tid}/stat")
        if parsed is not None and parsed[1] and parsed[1][0] == "R":
            running.add(tid)
    return running


def pollers(pgid: int, sample_s: float = 1.0, samples: int = 20) -> list[ThreadInfo]:
    """Threads of the group that stay runnable while the server is idle.

    A thread that polls without sleeping is in state R (running, or waiting
    for a CPU) in nearly every sample, however busy the machine is; a
    thread that waits for work sleeps. So call this while the server is idle.
    """
    threads = group_threads(pgid)
    counts = dict.fromkeys((t.tid for t in threads), 0)
    for _ in range(samples):
        for tid in _running(list(counts)):
            counts[tid] += 1
        time.sleep(sample_s / samples)
    return [t for t in threads if counts[t.tid] >= 0.6 * samples]


def isolate(pgid: int, cpu: int, demote_pollers: bool = False) -> list[ThreadInfo]:
    """Pins every thread of the group to ``cpu``; optionally demotes its pollers.

    Call it while the server is idle (after /health, before any request).
    Threads started later inherit the pinning from the thread that starts them.

    Args:
        pgid: the server's process group.
        cpu: the core the whole server gets.
        demote_pollers: move the pollers to SCHED_IDLE, so that they take only
            CPU time nothing else on the core wants. That frees the core for
            the model, but on a machine busy with other work a demoted UCX
            progress thread starves, and a peer's reads wait for it.

    Returns:
        The threads found polling (demoted or not).
    """
    polling = pollers(pgid)
    for thread in group_threads(pgid):
        try:
            os.sched_setaffinity(thread.tid, {cpu})
        except OSError:
            continue  # the thread ended meanwhile
    if demote_pollers:
        for thread in polling:
            try:
                os.sched_setscheduler(thread.tid, os.SCHED_IDLE, os.sched_param(0))
            except OSError:
                continue
    return polling
