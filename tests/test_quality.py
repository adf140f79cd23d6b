"""Quality gates in the test suite, so CI runs them: ruff, mypy --strict, import rules."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# bench/hixl_bench is the hixl-bench distribution's package, checked with the same gates
PACKAGES = ["hixl_client", "hixl_wire", "hixl_service", "native/hixl_native", "bench/hixl_bench"]


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


def test_the_daemon_distribution_carries_no_benchmark() -> None:
    """hixl-bench is its own distribution (bench/): hixl's packages never import it."""
    daemon = [ROOT / p for p in PACKAGES if not p.startswith("bench/")]
    importers = [str(f.relative_to(ROOT)) for d in daemon for f in sorted(d.rglob("*.py*"))
                 if "hixl_bench" in f.read_text(encoding="utf-8", errors="replace")]
    assert importers == []
    assert "bench" not in (ROOT / "setup.py").read_text(encoding="utf-8")


def test_import_rules() -> None:
    """The import-linter contracts of pyproject.toml: layers, no circles, no
    benchmark in the daemon."""
    run(tool("lint-imports"), "--no-cache")
