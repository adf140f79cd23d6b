"""The soak and link-scale tools' readings of a process: a full collection on
request in a real daemon, and threads counted less the default executor's."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from hixl_bench import collect
from hixl_bench.procstat import executor_threads, own_figures, proc_figures
from hixl_service.testing import start_daemon

pytestmark = pytest.mark.asyncio


async def test_a_daemon_answers_each_collection_with_its_executor_threads() -> None:
    with collect.hook_dir() as env:
        async with start_daemon(env=env, pool__max_bytes="64MiB") as daemon:
            assert collect.executor_threads(env, daemon.pid) == 0  # no collection yet
            assert await collect.collect(env, daemon.pid)
            assert await collect.collect(env, daemon.pid)  # each request is answered anew
            executor = collect.executor_threads(env, daemon.pid)
            # The daemon's start-up already ran a call in its executor (so a
            # hook that counted nothing would fail here); the executor is
            # bounded by min(32, cpus + 4), and its threads are the process's.
            assert 1 <= executor <= 32
            assert executor < proc_figures(daemon.pid).threads


async def test_own_threads_are_counted_less_the_default_executor() -> None:
    overlap = 3
    barrier = threading.Barrier(overlap, timeout=10)
    # Three calls that run at once need three executor threads, kept after.
    await asyncio.gather(*(asyncio.to_thread(barrier.wait) for _ in range(overlap)))
    executor = executor_threads()
    assert executor >= overlap
    assert own_figures().threads < proc_figures(os.getpid()).threads
