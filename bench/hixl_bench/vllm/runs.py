"""What the vLLM benchmarks' entry points (``compare``, ``ttft``) share."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

from .nixl_check import nixl_missing


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def stop_on_sigterm() -> None:
    """A SIGTERM ends the run through SystemExit, so every server is stopped."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def without_missing_nixl(python: str, names: list[str]) -> list[str]:
    """``names`` less "nixl" when nixl does not import under ``python`` (said on stderr)."""
    if "nixl" in names and nixl_missing(python) is not None:
        print(f"nixl does not import under {python}: NixlConnector is left out",
              file=sys.stderr)
        return [name for name in names if name != "nixl"]
    return names


def append_row(path: Path | None, row: dict[str, Any]) -> None:
    """Add ``row`` to ``path`` as a JSON line (nothing without a path)."""
    if path is not None:
        with path.open("a") as out:
            out.write(json.dumps(row) + "\n")
