"""Ratios between rows, the terminal table, progress lines and the JSON-lines output."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from hixl_bench.ceilings import GRPC_RTT, MEMCPY, tcp_name
from hixl_bench.model import (
    CEILING,
    GIB,
    HIXL,
    KIB,
    MIB,
    PEER,
    PROBE,
    Row,
    ceiling_shape,
)
from hixl_bench.runner import NOOP, TINY, split
from hixl_bench.targets import Outcome

_ORDER = {CEILING: 0, PROBE: 1, HIXL: 2, PEER: 3}


def size(n: int) -> str:
    """4096 -> '4K', 1 << 20 -> '1M' (binary units)."""
    for unit, scale in (("G", GIB), ("M", MIB), ("K", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    if n >= MIB:
        return f"{n / MIB:.1f}M"
    return f"{n / KIB:.1f}K" if n >= KIB else str(n)


def _find(rows: Iterable[Row], **want: Any) -> Row | None:
    for row in rows:
        if row.ok and all(getattr(row, k) == v for k, v in want.items()):
            return row
    return None


def _ceiling_for(row: Row, ceilings: list[Row], streams: int) -> Row | None:
    name = MEMCPY if row.path == "local" else tcp_name(streams)
    if row.suite == "serve":  # the same bytes as ranges of the same size (plan.ServeCase)
        return _find(ceilings, name=name, block=row.block, nblocks=row.extra["ceiling_nblocks"])
    if row.suite != "kv":
        block, nblocks = ceiling_shape(row.block, row.nblocks, row.conc)
        return _find(ceilings, name=name, block=block, nblocks=nblocks)
    # A KV row's ceiling ran on the same block size with as many blocks as fit.
    same_block = [c for c in ceilings if c.ok and c.name == name and c.block == row.block]
    return max(same_block, key=lambda c: c.nblocks, default=None)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def add_ratios(rows: list[Row], streams: int) -> None:
    """Fill ratio columns and the time split, in place.

    * hixl rows: GB/s over the matching ceiling (``local`` -> cold memcpy,
      ``tcp`` -> raw loopback TCP with as many streams as hixl's links), same
      block size and blocks per request; a row with k requests in flight
      compares with the ceiling moving their bytes at once (k times the
      blocks in one request, see ``model.ceiling_shape``);
    * peer rows: GB/s over hixl's row of the same operation and shape; a
      serving peer row over the raw TCP ceiling of the hixl row whose block
      tables it moved (the same bytes), and over that row itself
      (``hixl_ratio``);
    * every timed row: p50 over the bare gRPC round trip (``rtt_ratio``): the
      calls interleaved with the row's own requests where it has them
      (``rtt_us``, small one-in-flight rows), else the ``grpc-rtt`` row.
    """
    ceilings = [r for r in rows if r.kind == CEILING]
    grpc = _find(ceilings, name=GRPC_RTT)
    noop = _find(rows, name=NOOP)
    for row in rows:
        if not row.ok:
            continue
        if row.kind != CEILING:
            rtt = row.extra.get("rtt_us", grpc.p50_us if grpc is not None else None)
            row.rtt_ratio = _ratio(row.p50_us, rtt)
        if row.kind == HIXL:
            ceiling = _ceiling_for(row, ceilings, streams)
            if ceiling is not None:
                row.ratio, row.ratio_to = _ratio(row.gbps, ceiling.gbps), ceiling.name
            tiny = _find(rows, name=TINY, path=row.path)
            split(row, noop.p50_us if noop else None, tiny.p50_us if tiny else None)
        elif row.kind == PEER and row.suite == "serve":
            ceiling = _ceiling_for(row, ceilings, streams)
            if ceiling is not None:
                row.ratio, row.ratio_to = _ratio(row.gbps, ceiling.gbps), ceiling.name
            hixl = _serve_twin(rows, row)
            row.extra["hixl_ratio"] = _ratio(row.gbps, hixl.gbps) if hixl else None
        elif row.kind == PEER:
            hixl = _find(rows, kind=HIXL, op=row.op, path=row.path, block=row.block,
                         nblocks=row.nblocks, conc=1, suite=row.suite)
            if hixl is not None:
                row.ratio, row.ratio_to = _ratio(row.gbps, hixl.gbps), "hixl"


def _serve_twin(rows: list[Row], peer: Row) -> Row | None:
    """The hixl serving row whose block tables ``peer`` moved."""
    index = peer.extra.get("case_index")
    return next((r for r in rows if r.ok and r.kind == HIXL and r.suite == "serve"
                 and r.extra.get("case_index") == index), None)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt)


COLUMNS = (("what", 22), ("suite", 5), ("op", 4), ("path", 5), ("block", 6), ("n", 5),
           ("conc", 4), ("GB/s", 7), ("req/s", 8), ("p50 us", 9), ("p99 us", 9),
           ("client", 7), ("ctrl", 7), ("data", 9), ("ratio", 6), ("vs", 9), ("p50/rtt", 7))


def _cells(row: Row) -> list[str]:
    what = row.name
    if row.suite == "kv":
        what = f"{row.name} {row.extra.get('kv_mode', '')}"
    elif row.suite == "serve" and row.kind == HIXL:
        what = f"{row.name} {row.extra['client']} {row.extra['memory']}"
    return [what, row.suite, row.op, row.path, size(row.block) if row.block else "-",
            str(row.nblocks or "-"), str(row.conc), _num(row.gbps, ".3f"), _num(row.rps, ".0f"),
            _num(row.p50_us, ".1f"), _num(row.p99_us, ".1f"), _num(row.client_us, ".0f"),
            _num(row.control_us, ".0f"), _num(row.data_us, ".0f"), _num(row.ratio, ".2f"),
            row.ratio_to or "-", _num(row.rtt_ratio, ".2f")]


def format_row(row: Row) -> str:
    cells = _cells(row)
    text = " ".join(c.rjust(w) if i > 0 else c.ljust(w)
                    for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS, strict=True)))
    if row.suite == "kv" and row.ok:
        text += f"  {row.extra['model']} {row.extra['tokens']} tok: " \
                f"{_num(row.extra.get('prompt_ms'), '.1f')} ms/prompt"
        if row.extra.get("lag_ratio") is not None:
            alone = row.extra.get("layer_alone_ms")
            reference = f"one layer alone ({_num(alone, '.2f')} ms)" if alone is not None \
                else f"one layer ({_num(row.extra['layer_ms'], '.2f')} ms, unpaced average)"
            text += f"; paced: last layer lands {_num(row.extra['last_lag_ms'], '.2f')} ms " \
                    f"after it is ready = {_num(row.extra['lag_ratio'], '.2f')} x {reference}"
    elif row.suite == "kv":
        text += f"  {row.extra['model']} {row.extra['tokens']} tok"
    if row.suite == "serve" and row.kind in (HIXL, PEER):
        text += f"  {row.extra['model']} {row.extra['dtype']} {row.extra['tokens']} tok, " \
                f"blocks of {row.extra['block_tokens']}, {size(row.extra['request_bytes'])}"
        if row.kind == PEER:
            text += f", hixl row {row.extra['case_index']}'s tables, one in flight"
        if row.ok:
            text += f", {row.extra['verified_pulls']} pulls checked byte-exact"
        if row.ok and row.kind == PEER:
            text += f" ({row.extra['ranges']} ranges), " \
                    f"{_num(row.extra.get('hixl_ratio'), '.2f')} x hixl's GB/s"
    if row.extra.get("ratio_min") is not None:
        text += f"  ratio {_num(row.extra['ratio_min'], '.2f')}-" \
                f"{_num(row.extra['ratio_max'], '.2f')} over {row.extra['runs']} runs"
    if row.suite == "scale" and row.extra.get("ctrl_us_per_block") is not None:
        text += f"  control {_num(row.extra['ctrl_us_per_block'], '.3f')} us/block"
        if row.extra.get("ctrl_us_per_added_block") is not None:
            text += f"; {_num(row.extra['ctrl_us_per_added_block'], '.3f')} us per added block"
    if row.suite == "sec" and row.extra.get("link_setup_ms") is not None:
        text += f"  link set-up {_num(row.extra['link_setup_ms'], '.2f')} ms"
    if row.suite == "crc" and row.extra.get("crc_gbps_ratio") is not None:
        text += f"  vs crc off: {_num(row.extra['crc_gbps_ratio'], '.3f')} x GB/s, " \
                f"{_num(row.extra['crc_p50_ratio'], '.3f')} x p50"
        if row.extra.get("crc_gbps_ratio_min") is not None:
            text += f" (GB/s {_num(row.extra['crc_gbps_ratio_min'], '.3f')}-" \
                    f"{_num(row.extra['crc_gbps_ratio_max'], '.3f')} over {row.extra['runs']} runs)"
    return text if row.ok else f"{text}  {row.status}"


def header() -> str:
    return " ".join(name.rjust(w) if i > 0 else name.ljust(w)
                    for i, (name, w) in enumerate(COLUMNS))


_SUITE_ORDER = {"block": 0, "batch": 1, "conc": 2, "scale": 3, "kv": 4, "serve": 5, "sec": 6,
                "crc": 7}


def _table_key(item: tuple[int, Row]) -> tuple[Any, ...]:
    """Kind, then (ceilings and peers) name, then suite, op, path and shape; KV in run order."""
    index, r = item
    kind = _ORDER.get(r.kind, 9)
    if r.suite in ("kv", "serve"):
        return (kind, "", _SUITE_ORDER[r.suite], "", "", 0, 0, 0, index)
    name = r.name if r.kind in (CEILING, PEER, PROBE) else ""
    return (kind, name, _SUITE_ORDER.get(r.suite, -1), r.op, r.path, r.block, r.nblocks,
            r.conc, index)


def _table_keys(rows: list[Row]) -> list[tuple[Any, ...]]:
    """Each row's place (see ``_table_key``); a serving peer row goes right
    after the hixl row whose block tables it moved, side by side."""
    beside = {r.extra.get("case_index"): i for i, r in enumerate(rows)
              if r.kind == HIXL and r.suite == "serve"}
    keys = []
    for index, row in enumerate(rows):
        twin = beside.get(row.extra.get("case_index")) if row.suite == "serve" else None
        if row.kind == PEER and twin is not None:
            keys.append((*_table_key((twin, rows[twin])), index))
        else:
            keys.append(_table_key((index, row)))
    return keys


def print_table(rows: list[Row], out: TextIO = sys.stdout) -> None:
    """The final table: ceilings, probes, hixl rows (serving peers beside them),
    peers; each group in run order."""
    ordered = sorted(zip(_table_keys(rows), rows, strict=True), key=lambda item: item[0])
    print(header(), file=out)
    print("-" * len(header()), file=out)
    group = None
    for key, row in ordered:
        if group is not None and key[0] != group:
            print(file=out)
        group = key[0]
        print(format_row(row), file=out)


def print_targets(outcomes: list[Outcome], out: TextIO = sys.stdout) -> None:
    """The serving suite's targets (issue 20, point 5): recorded, never asserted."""
    print("\nserving targets (issue 20, point 5; for the record, not asserted):", file=out)
    for outcome in outcomes:
        print(outcome.line(), file=out)


class Progress:
    """A progress bar over the rows the run will print (rich, on stderr), each row
    printed above it as it completes, with a running count.

    ``total`` is counted from the plan before the run starts (``cli._count``);
    :meth:`close` says so if the run printed another number of rows, which
    would be a counting bug. Use as a context manager.
    """

    def __init__(self, total: int, out: TextIO = sys.stderr, quiet: bool = False) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self.total, self.done, self.quiet = total, 0, quiet
        self._console = Console(file=out, highlight=False, soft_wrap=True)
        # Drawn only on a terminal; a log file gets the row lines alone.
        self._bar = Bar(TextColumn("rows"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=self._console, transient=True,
                        disable=quiet or not self._console.is_terminal)
        self._task = self._bar.add_task("rows", total=total)

    def __enter__(self) -> Progress:
        self._bar.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._bar.stop()
        if self.done != self.total and not self.quiet:
            self.note(f"counted {self.total} rows ahead, printed {self.done}")

    def __call__(self, row: Row) -> None:
        self.done += 1
        self._bar.update(self._task, completed=self.done)
        if not self.quiet:
            self._console.print(f"[{self.done:>3}/{self.total}] {format_row(row)}",
                                markup=False)

    def note(self, text: str) -> None:
        if not self.quiet:
            self._console.print(f"# {text}", markup=False)


def write_json(path: Path, rows: list[Row], meta: dict[str, Any]) -> None:
    """JSON lines: one ``{"kind": "meta", ...}`` record, then one record per row."""
    with path.open("w", encoding="utf-8") as out:
        out.write(json.dumps({"kind": "meta", **meta}) + "\n")
        for row in rows:
            out.write(json.dumps(row.to_json()) + "\n")
