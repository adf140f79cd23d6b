"""The serving suite's targets (issue 20, point 5), checked against one run's rows.

For the record: the report prints whether each target was met; nothing
asserts them (figures come from benchmarks, never from timed assertions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hixl_bench.model import HIXL, MIB, Row

_KIB = 1024


@dataclass
class Outcome:
    """One target: what it asks, what the run measured, and whether it was met
    (None: the run has no row to judge it by)."""

    case: str
    target: str
    measured: str
    met: bool | None

    def line(self) -> str:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[self.met]
        return f"  [{verdict}] {self.case}: {self.measured} (target: {self.target})"

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "target": self.target, "measured": self.measured,
                "met": self.met}


def _serve(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.kind == HIXL and r.suite == "serve" and r.ok]


def _twin(rows: list[Row], row: Row, **change: Any) -> Row | None:
    """The row of the same case with ``change`` (another client or memory)."""
    keys = ("model", "dtype", "tokens", "block_tokens", "memory", "client")
    want = {k: row.extra.get(k) for k in keys} | change
    return next((r for r in _serve(rows) if r.conc == row.conc and
                 all(r.extra.get(k) == v for k, v in want.items())), None)


_BASE = {"memory": "shareable", "client": "async"}


def _vs_tcp(rows: list[Row], block_tokens: int, least: float) -> Outcome:
    case = f"a 1k-token Llama-3-8B request, block size {block_tokens}"
    row = next((r for r in _serve(rows) if r.conc == 1 and all(
        r.extra.get(k) == v for k, v in {"model": "llama3-8b", "tokens": 1024,
                                         "block_tokens": block_tokens, **_BASE}.items())),
        None)
    if row is None or row.ratio is None:
        return Outcome(case, f"at least {least} x raw TCP", "no row", None)
    return Outcome(case, f"at least {least} x raw TCP",
                   f"{row.ratio:.2f} x {row.ratio_to} ({row.gbps:.2f} GB/s)", row.ratio >= least)


def _small(rows: list[Row]) -> Outcome:
    case, target = "16 random blocks x 2 tensors x 16 KiB", "p50 at most 2 x a repeated 4 KiB pull"
    row = next((r for r in _serve(rows) if r.conc == 1 and r.extra.get("model") == "kv-2x16k"
                and r.extra.get("tokens") == 256 and all(
                    r.extra.get(k) == v for k, v in _BASE.items())), None)
    if row is None or not row.p50_us:
        return Outcome(case, target, "no row", None)
    # The reference pull interleaved with the row's own requests, else the
    # reference's row of its own.
    ref_us, where = row.extra.get("ref_4k_p50_us"), "interleaved"
    if not ref_us:
        ref = next((r for r in rows if r.name == "hixl-4k" and r.ok), None)
        ref_us, where = (ref.p50_us if ref is not None else None), "its own row"
    if not ref_us:
        return Outcome(case, target, "no reference", None)
    ratio = row.p50_us / ref_us
    return Outcome(case, target, f"p50 {row.p50_us:.0f} us = {ratio:.2f} x {ref_us:.0f} us "
                   f"({where})", ratio <= 2.0)


def _paired(rows: list[Row], case: str, target: str, select: Callable[[Row], bool],
            change: dict[str, Any], judge: Callable[[Row, Row], float], limit: float,
            higher_is_better: bool) -> Outcome:
    """Every selected row against its twin: met when the worst pair is within ``limit``."""
    pairs = [(row, twin) for row in _serve(rows) if select(row)
             if (twin := _twin(rows, row, **change)) is not None]
    if not pairs:
        return Outcome(case, target, "no pair of rows", None)
    values = [(judge(row, twin), row) for row, twin in pairs]
    worst, row = min(values, key=lambda v: v[0]) if higher_is_better else \
        max(values, key=lambda v: v[0])
    met = worst >= limit if higher_is_better else worst <= limit
    return Outcome(case, target, f"worst {worst:.2f} over {len(pairs)} pairs "
                   f"({row.extra['model']} {row.extra['tokens']} tok/"
                   f"{row.extra['block_tokens']}, {row.conc} in flight)", met)


def check(rows: list[Row]) -> list[Outcome]:
    """Each target of point 5 judged on ``rows`` (one run's, ratios filled)."""
    facade = _paired(
        rows, "the blocking facade, 512 KiB and more",
        "p50 within 10% of the async client's (ratio at most 1.10)",
        lambda r: r.extra.get("client") == "sync" and r.extra["request_bytes"] >= 512 * _KIB,
        {"client": "async"}, lambda r, t: (r.p50_us or 0) / (t.p50_us or 1), 1.10,
        higher_is_better=False)
    engine = _paired(
        rows, "engine-allocated memory, 1 MiB and more",
        "at least 0.7 x shareable memory's GB/s",
        lambda r: r.extra.get("memory") == "engine" and r.extra["request_bytes"] >= MIB,
        {"memory": "shareable"}, lambda r, t: (r.gbps or 0) / (t.gbps or 1), 0.7,
        higher_is_better=True)
    return [_vs_tcp(rows, 128, 0.8), _vs_tcp(rows, 16, 0.7), _small(rows), facade, engine]
