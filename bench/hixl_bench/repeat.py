"""``--repeat``: several whole runs folded into one table of medians.

On a noisy host one run's ratio can swing by a fifth between neighbouring
minutes. Each run still takes its ratios between rows measured next to each
other; the table then shows, per row, the median over the runs of every
figure (ratios included, each first taken within its own run) and the
spread of the ratio, so a reader sees how much a single run could mislead.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from hixl_bench.model import Row

# The figures of a row that are folded into their median.
_FIGURES = ("gbps", "rps", "p50_us", "p99_us", "client_us", "control_us", "data_us", "ratio",
            "rtt_ratio")
_Key = tuple[Any, ...]


def _keys(rows: list[Row]) -> list[_Key]:
    """Per row: its identity and how many rows with that identity came before it
    in its run (a ceiling shape shared by several KV cases is measured each time)."""
    seen: dict[_Key, int] = {}
    keys = []
    for row in rows:
        identity = (row.kind, row.name, row.suite, row.op, row.path, row.block, row.nblocks,
                    row.conc, row.extra.get("model"), row.extra.get("tokens"),
                    row.extra.get("kv_mode"))
        seen[identity] = seen.get(identity, -1) + 1
        keys.append((*identity, seen[identity]))
    return keys


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_of_runs(runs: list[list[Row]]) -> list[Row]:
    """The rows of the first run, each figure replaced by its median over the runs.

    A row that failed or was skipped in any run keeps that run's status. Each
    row records ``runs`` (how many runs measured it) and, when it has a ratio
    in several, ``ratio_min`` and ``ratio_max``.
    """
    if len(runs) == 1:
        return runs[0]
    by_key: dict[_Key, list[Row]] = {}
    for rows in runs:
        for key, row in zip(_keys(rows), rows, strict=True):
            by_key.setdefault(key, []).append(row)
    merged = []
    for key, first in zip(_keys(runs[0]), runs[0], strict=True):
        same = by_key[key]
        row = dataclasses.replace(first, extra=dict(first.extra))
        row.extra["runs"] = len(same)
        failed = next((r for r in same if not r.ok), None)
        if failed is not None:
            row.status = failed.status
            merged.append(row)
            continue
        for name in _FIGURES:
            setattr(row, name, _median([getattr(r, name) for r in same]))
        row.requests = sum(r.requests for r in same)
        for name, value in first.extra.items():
            if isinstance(value, float):
                values = [r.extra.get(name) for r in same]
                row.extra[name] = _median(values)
                present = [v for v in values if v is not None]
                if name.endswith("_ratio") and len(present) > 1:  # a paired ratio's spread
                    row.extra[f"{name}_min"], row.extra[f"{name}_max"] = min(present), \
                        max(present)
        ratios = [r.ratio for r in same if r.ratio is not None]
        if len(ratios) > 1:
            row.extra["ratio_min"], row.extra["ratio_max"] = min(ratios), max(ratios)
        merged.append(row)
    return merged
