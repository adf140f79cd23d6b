"""The main job (README's first command) runs end to end, on uvloop and on asyncio."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("loop_args", [[], ["--no-uvloop"]])
def test_prefill_decode_demo(loop_args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "prefill_decode.py"), "--layers", "4",
         "--tokens", "256", "--repeats", "2", *loop_args],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "byte-exact" in done.stdout and "GB/s" in done.stdout
