"""Throughput against block size (one block per request) for hixl, the ceilings and the peers.

``python -m hixl_bench.plot RESULTS.jsonl OUT.png`` replots a saved run;
hixl-bench calls :func:`plot` itself with ``--plot``. Needs matplotlib (the
``plot`` extra of hixl-bench).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _series(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in records:
        if r.get("status") != "ok" or not r.get("gbps") or r.get("nblocks") != 1:
            continue
        if r["kind"] == "ceiling" and r["name"] != "grpc-rtt":
            series[r["name"]].append((r["block"], r["gbps"]))
        elif r["kind"] in ("hixl", "peer") and r["suite"] == "block":
            series[f"{r['name']} {r['op']} {r['path']}"].append((r["block"], r["gbps"]))
    return {name: sorted(points) for name, points in series.items()}


def missing_matplotlib() -> str | None:
    """None if matplotlib imports, else what to install, for this interpreter.

    The hint names matplotlib itself: hixl-bench may have come from a wheel,
    a checkout (``pip install -e './bench[plot]'`` there) or elsewhere, and
    ``python -m pip install matplotlib`` is right for all of them.
    """
    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return (f"--plot needs matplotlib, which is not installed: {sys.executable} -m pip "
            "install matplotlib (the plot extra of hixl-bench)")


def plot(records: list[dict[str, Any]], path: Path, title: str = "") -> str | None:
    """Write the PNG; returns None, or why it could not (matplotlib missing, no data)."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return missing_matplotlib() or "matplotlib does not import"
    series = _series(records)
    if not series:
        return "no block-size rows to plot"
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = plt.get_cmap("tab20").colors
    for i, (name, points) in enumerate(sorted(series.items())):
        # hixl solid with circles, ceilings dashed with squares, peers dotted with triangles
        style, marker = ("-", "o") if name.startswith("hixl") else \
            ("--", "s") if name.startswith(("memcpy", "tcp-c")) else (":", "^")
        ax.plot([p[0] for p in points], [p[1] for p in points], linestyle=style, marker=marker,
                color=colors[(2 * i) % 20 + (i >= 10)], label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({p[0] for points in series.values() for p in points})
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t >> 20}M" if t >= 1 << 20 else f"{t >> 10}K" for t in ticks])
    ax.set_xlabel("block size (one block per request, one request in flight)")
    ax.set_ylabel("GB/s (10^9 B/s)")
    ax.set_title(title or "hixl-bench: throughput against block size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main() -> int:
    records = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line]
    problem = plot(records, Path(sys.argv[2]))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
