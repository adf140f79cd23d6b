"""The daemon's malloc setting: freed large allocations leave its memory at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20

# Frees one 16 MiB allocation (which raises glibc's default mmap threshold to
# 16 MiB), then takes and frees 24 MiB in 1 MiB pieces, every page written,
# and prints how much more anonymous memory it holds than before the pieces.
_CHILD = textwrap.dedent("""
    import sys
    from hixl_service._glibc import return_large_allocations

    def anon_bytes():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024

    if sys.argv[1] == "set":
        assert return_large_allocations()
    big = bytearray(16 << 20)
    big[::4096] = b"x" * len(big[::4096])
    del big
    before = anon_bytes()
    pieces = []
    for _ in range(24):
        piece = bytearray(1 << 20)
        piece[::4096] = b"x" * len(piece[::4096])
        pieces.append(piece)
    del pieces, piece
    print(anon_bytes() - before)
""")


def _held_after_free(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _CHILD, mode], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    return int(done.stdout.strip())


def test_freed_large_allocations_are_returned() -> None:
    assert _held_after_free("set") < 4 * MIB


def test_without_it_glibc_keeps_them() -> None:
    # What the setting is for (and proof the measurement can see it): by
    # default the 1 MiB pieces come from the heap and stay resident.
    assert _held_after_free("default") > 16 * MIB
