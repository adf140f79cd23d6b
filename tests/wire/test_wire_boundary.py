"""hixl_wire is the ground both sides share: it imports neither hixl_client nor
hixl_service, and the daemon imports no private module of the client."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_IMPORT_ALL_OF_WIRE = """
import importlib, pkgutil, sys
import hixl_wire
for module in pkgutil.walk_packages(hixl_wire.__path__, "hixl_wire."):
    importlib.import_module(module.name)
print(sorted(m for m in sys.modules if m.partition(".")[0] in ("hixl_client", "hixl_service")))
"""


def test_hixl_wire_imports_neither_side() -> None:
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL_OF_WIRE], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _imported(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_the_daemon_imports_no_private_client_module() -> None:
    private = [f"{path.relative_to(ROOT)}: {name}"
               for path in sorted((ROOT / "hixl_service").rglob("*.py"))
               for name in _imported(path)
               if name.startswith("hixl_client.")
               and any(part.startswith("_") for part in name.split(".")[1:])]
    assert private == []
