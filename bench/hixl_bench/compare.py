"""Paired runs side by side: ``python -m hixl_bench.compare A.jsonl B.jsonl [...]``.

A change is judged by runs of the two builds made in one sitting, one after
the other, on the same machine. Give the ``--json-out`` files of those runs
in the order they were made, alternating the builds (A, B, A, B, ...): each
hixl row's figure is then the median over the runs of each build, and the
table shows B against A. Rows that move bytes compare their GB/s, the others
(layer lags, latency rows) their p50 latency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

from hixl_bench.model import HIXL, OK

Key = tuple[str, ...]


def _key(record: dict[str, object]) -> Key:
    return tuple(str(record.get(name, "")) for name in
                 ("suite", "name", "op", "path", "block", "nblocks", "conc"))


def load(path: Path) -> dict[Key, dict[str, object]]:
    """The hixl rows of one ``--json-out`` file that ended well, by row."""
    rows: dict[Key, dict[str, object]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("kind") == HIXL and record.get("status") == OK:
            rows[_key(record)] = record
    return rows


def _figure(record: dict[str, object]) -> tuple[str, float] | None:
    gbps = record.get("gbps")
    if isinstance(gbps, (int, float)) and gbps > 0:
        return "GB/s", float(gbps)
    p50 = record.get("p50_us")
    if isinstance(p50, (int, float)) and p50 > 0:
        return "p50 us", float(p50)
    return None


def compare(runs_a: Iterable[dict[Key, dict[str, object]]],
            runs_b: Iterable[dict[Key, dict[str, object]]]) -> list[tuple[Key, str, float, float]]:
    """(row, unit, median of A, median of B) for every row both builds measured."""
    list_a, list_b = list(runs_a), list(runs_b)
    keys = sorted(set().union(*list_a) & set().union(*list_b))
    table = []
    for key in keys:
        figures = {}
        for name, runs in (("a", list_a), ("b", list_b)):
            values = [f for run in runs if key in run and (f := _figure(run[key])) is not None]
            if values:
                figures[name] = (values[0][0], statistics.median(v for _, v in values))
        if "a" in figures and "b" in figures and figures["a"][0] == figures["b"][0]:
            table.append((key, figures["a"][0], figures["a"][1], figures["b"][1]))
    return table


def _change(unit: str, a: float, b: float) -> float:
    """B's figure as a multiple of A's, above 1 when B is better."""
    return b / a if unit == "GB/s" else a / b


def render(table: list[tuple[Key, str, float, float]]) -> str:
    lines = ["| suite | row | op | path | block | blocks | in flight | unit | A | B | B vs A |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for key, unit, a, b in table:
        lines.append(f"| {' | '.join(key)} | {unit} | {a:.3g} | {b:.3g} | "
                     f"{_change(unit, a, b):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path,
                        help="--json-out files in the order made: A, B, A, B, ...")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least one run of each build")
    loaded = [load(path) for path in args.runs]
    print(render(compare(loaded[0::2], loaded[1::2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
