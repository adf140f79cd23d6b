"""Entry point of ``python -m hixl_bench`` and the ``hixl-bench`` console script."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run hixl-bench with command-line arguments; returns the exit code."""
    from hixl_bench.cli import run_cli

    return run_cli(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
