"""Quality gates in the test suite, so CI runs them: ruff and mypy --strict."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["hixl_client", "hixl_wire", "hixl_service", "native/hixl_native"]


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return found


def run(*command: str) -> None:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff() -> None:
    run(tool("ruff"), "check", *PACKAGES, "tests", "examples", "scripts")


def test_mypy_strict() -> None:
    run(tool("mypy"), *PACKAGES)
