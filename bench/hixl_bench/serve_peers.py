"""The serving pattern for the peers (Mooncake TE, NIXL): which cases they run, and their rows.

A peer runs each KV layout and prompt length of the serving suite that hixl
runs one request at a time: the same cache layout on both sides (``2 *
layers`` tensors of ``pool_blocks`` blocks), and the same seeded, fragmented
block tables as the hixl row it sits beside, so that both move the same
bytes between the same offsets. Only one request is in flight (the peers'
worker issues requests one after another), so cases with several in flight
have no peer rows. A peer row compares with the raw TCP ceiling of its hixl
row (``ratio``) and with that row itself (``hixl_ratio``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hixl_bench import serve
from hixl_bench.model import PEER, Row
from hixl_bench.plan import ServeCase

# The hixl row a peer row sits beside, where the run has it: the peers
# register memory of their own, as shareable memory is, and call one at a time.
_BESIDE = {"memory": "shareable", "client": "async"}
# The pulls a job checks byte-exact: every rotation before the timed ones, the last after.
CHECKED_PULLS = serve.ROTATIONS + 1


@dataclass(frozen=True)
class ServeJob:
    """One serving case for the peers: ``index`` is the hixl case whose tables it uses."""

    case: ServeCase
    index: int

    def spec(self) -> dict[str, Any]:
        """The worker's job (``peer_worker``): the layout and the slot's tables per rotation."""
        case = self.case
        src, dst = serve.side_tables(case, self.index)
        return {"tensors": case.tensors, "tensor_bytes": case.pool_blocks * case.block_bytes,
                "block_bytes": case.block_bytes, "src": src[0], "dst": dst[0]}

    def row(self, name: str, cold_bytes: int) -> Row:
        """An empty peer row of this job, keyed like hixl's serving rows."""
        hixl = serve.row_of(self.case, self.index, cold_bytes)
        extra = {k: v for k, v in hixl.extra.items() if k not in ("memory", "client")}
        return Row(PEER, name, serve.SUITE, "pull", "tcp", hixl.block, hixl.nblocks, 1,
                   extra=extra)


def _layout(case: ServeCase) -> tuple[Any, ...]:
    return (case.model, case.dtype, case.tokens, case.block_tokens)


def jobs(cases: tuple[ServeCase, ...]) -> list[ServeJob]:
    """One job per layout and prompt length that ``cases`` run one at a time,
    with the tables of its shareable async row (else of its first such case)."""
    chosen: dict[tuple[Any, ...], ServeJob] = {}
    for index, case in enumerate(cases):
        if case.conc != 1:
            continue
        key = _layout(case)
        if key not in chosen or (_is_beside(case) and not _is_beside(chosen[key].case)):
            chosen[key] = ServeJob(case, index)
    return list(chosen.values())


def _is_beside(case: ServeCase) -> bool:
    return case.memory == _BESIDE["memory"] and case.client == _BESIDE["client"]


def region_bytes(serve_jobs: list[ServeJob]) -> int:
    """The memory each side registers for ``serve_jobs``: the largest cache."""
    return max([job.case.cache_bytes for job in serve_jobs] or [0])


def fill_serve_row(row: Row, record: dict[str, Any]) -> None:
    """Put the worker's extra results into ``row`` (timing is filled by the caller)."""
    row.extra["verified_pulls"] = record["verified_pulls"]
    row.extra["ranges"] = record["ranges"]
