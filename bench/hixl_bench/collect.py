"""A full garbage collection inside a daemon, on request, before its fds are counted.

Objects a daemon let go of can stay alive in reference cycles (an exception,
its traceback and the frames it names, an asyncio future holding that
exception) until Python's cyclic collector next runs its oldest
generation, which an idle daemon may not do for minutes; a native object
among them keeps its descriptors open meanwhile. A leak is what stays
after a full collection, so the soak and link-scale tools ask for one
before each reading, and report what was held until then.

The daemons are started with a ``sitecustomize`` module on their
``PYTHONPATH`` (as ``calls`` does for its profiles) that installs a
``SIGUSR2`` handler: ``gc.collect()``, then the number of collections so
far and the daemon's default-executor threads (``procstat.executor_threads``:
the tools count a daemon's threads less those, as they count their own)
written to ``gc-<pid>`` in the directory ``HIXL_BENCH_GC_DIR`` names.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hixl_bench.procstat import EXECUTOR_THREAD_PREFIXES
from hixl_service.testing import package_roots

SIGNAL = signal.SIGUSR2
ENV = "HIXL_BENCH_GC_DIR"
_WAIT_S = 10.0
_SITECUSTOMIZE = f"""
import os, sys
_dir = os.environ.get("{ENV}")
if _dir and "hixl_service" in " ".join(sys.orig_argv):
    import gc, signal, threading
    _done = [0]
    def _collect(signum, frame):
        gc.collect()
        _done[0] += 1
        executor = sum(1 for t in threading.enumerate()
                       if t.name.startswith({EXECUTOR_THREAD_PREFIXES!r}))
        path = os.path.join(_dir, f"gc-{{os.getpid()}}")
        with open(path + ".tmp", "w") as out:
            out.write(f"{{_done[0]}} {{executor}}")
        os.replace(path + ".tmp", path)
    signal.signal({int(SIGNAL)}, _collect)
"""


@contextlib.contextmanager
def hook_dir() -> Iterator[dict[str, str]]:
    """A directory with the hook; yields the environment a daemon needs to load it."""
    with tempfile.TemporaryDirectory(prefix="hixl-gc-") as scratch:
        (Path(scratch) / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
        path = [scratch, *package_roots(), os.environ.get("PYTHONPATH", "")]
        yield {"PYTHONPATH": os.pathsep.join(p for p in path if p), ENV: scratch}


def _answer(env: dict[str, str], pid: int) -> tuple[int, int]:
    """(collections so far, default-executor threads then) of daemon ``pid``."""
    try:
        done, executor = (Path(env[ENV]) / f"gc-{pid}").read_text(encoding="ascii").split()
        return int(done), int(executor)
    except (OSError, ValueError):
        return 0, 0


def _done(env: dict[str, str], pid: int) -> int:
    return _answer(env, pid)[0]


def executor_threads(env: dict[str, str], pid: int) -> int:
    """Daemon ``pid``'s default-executor threads at its last collection (0 before one)."""
    return _answer(env, pid)[1]


async def collect(env: dict[str, str], pid: int) -> bool:
    """A full collection in daemon ``pid`` (started with ``env``); whether it answered."""
    before = _done(env, pid)
    try:
        os.kill(pid, SIGNAL)
    except ProcessLookupError:
        return False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _WAIT_S
    while _done(env, pid) <= before:
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def collect_here() -> None:
    """The same in this process."""
    gc.collect()
