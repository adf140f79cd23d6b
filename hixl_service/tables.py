"""Aligned text tables, as hixlctl prints them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ",".join(f"{key}={val}" for key, val in sorted(value.items())) or "-"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    text = str(value)
    return text if text else "-"


def render_table(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    """Rows as an aligned text table under upper-case headers."""
    cells = [[_cell(row.get(name, "")) for name in columns] for row in rows]
    widths = [max([len(name), *(len(line[i]) for line in cells)])
              for i, name in enumerate(columns)]
    lines = ["  ".join(name.upper().ljust(width) for name, width in zip(columns, widths,
                                                                         strict=True))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
              for line in cells]
    return "\n".join(line.rstrip() for line in lines)
