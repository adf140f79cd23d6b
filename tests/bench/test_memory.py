"""The bench's sampling of a daemon's memory beside its pools, on real processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from hixl_bench.memory import FAST_SAMPLE_S, SAMPLE_S, Sampler, beside_pools_bytes, watch


def test_reads_this_process_and_nothing_for_a_gone_one() -> None:
    own = beside_pools_bytes(os.getpid())
    assert own is not None and own > 1 << 20  # an interpreter holds more than 1 MiB
    with subprocess.Popen([sys.executable, "-c", "pass"]) as gone:
        gone.wait()
    assert beside_pools_bytes(gone.pid) is None


def test_the_peak_covers_memory_taken_while_watched() -> None:
    # A child that takes 64 MiB of heap, then gives it back and waits.
    with subprocess.Popen(
            [sys.executable, "-c",
             "import sys\n"
             "held = bytearray(64 << 20)\n"
             "print('held', flush=True)\n"
             "sys.stdin.readline()\n"
             "del held\n"
             "print('freed', flush=True)\n"
             "sys.stdin.readline()\n"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdin is not None and child.stdout is not None
        stdin, stdout = child.stdin, child.stdout
        try:
            assert stdout.readline().strip() == "held"
            peaks: dict[str, int] = {}

            async def run() -> None:
                async with watch({"child": child.pid}, peaks):
                    await asyncio.sleep(0.25)
                    stdin.write("\n")
                    stdin.flush()
                    assert (await asyncio.to_thread(stdout.readline)).strip() == "freed"
                    await asyncio.sleep(0.25)

            asyncio.run(run())
            after = beside_pools_bytes(child.pid)
            assert after is not None
            assert peaks["child"] >= 64 << 20  # seen while it held the 64 MiB
            assert peaks["child"] > after + (32 << 20)  # and kept after it was freed
        finally:
            child.kill()


def test_fast_sampling_is_scoped() -> None:
    sampler = Sampler()
    assert sampler.interval == SAMPLE_S
    with sampler.fast():
        assert sampler.interval == FAST_SAMPLE_S < SAMPLE_S
    assert sampler.interval == SAMPLE_S
