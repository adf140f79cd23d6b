"""What the daemon counts of its own work, as plain integers on the event loop.

Transfers are the tuned path: a call's accounting is one method call with a
dict lookup, three ``bisect`` calls (C) and a few integer additions, made
where the handler already computes the reply's control and data split
(``servicer_client``). Nothing here imports prometheus_client: ``metrics``
reads these counters at scrape time, on the loop's thread, and so does the
Admin status (``hixlctl transfers``). Failures are counted where every
handler failure already goes (``rpc_errors.handler_error`` and the servicers'
``call_failed``), so a successful call pays nothing for them.

Label values stay few: an op name (the call, not its ids), a transport
name, an LLMStatusCode name, a refusal reason, a link direction and state.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from hixl_wire.status import LLMStatusCode

# Upper bounds (seconds) of the latency histograms: 10 us to 10 s.
LATENCY_BOUNDS: tuple[float, ...] = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SUCCESS = LLMStatusCode.LLM_SUCCESS.name

# A transfer call's method -> its op label (repeats count as what they repeat).
OPS: dict[str, str] = {
    "PullCache": "pull_cache",
    "RepeatPull": "pull_cache",
    "PullBlocks": "pull_blocks",
    "PushCache": "push_cache",
    "RepeatPush": "push_cache",
    "PushBlocks": "push_blocks",
    "CopyCache": "copy_cache",
    "CopyBlocks": "copy_blocks",
    "SwapBlocks": "swap_blocks",
    "LayerReady": "layer",
    "TransferCache": "layer",
}
# Transport label of a failed call: the handler failed before (or without) saying.
UNKNOWN_TRANSPORT = "unknown"
# Transport label of copies inside one cluster.
COPY_TRANSPORT = "copy"


class Histogram:
    """Counts per bucket of LATENCY_BOUNDS (the last is +Inf) and their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS) + 1)
        self.sum = 0.0

    def cumulative(self) -> list[tuple[str, int]]:
        """The buckets as Prometheus writes them: ``le`` and the count at or below it."""
        out, running = [], 0
        for bound, count in zip((*map(repr, LATENCY_BOUNDS), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class Moved:
    """Successful calls of one (op, transport): how many, their bytes, their latency."""

    __slots__ = ("bytes", "control", "count", "data", "total")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.control = Histogram()
        self.data = Histogram()
        self.total = Histogram()


@dataclass
class DaemonStats:
    """The counters of one daemon (``EngineDeps.stats``)."""

    # (op, transport) -> successful calls
    moved: dict[tuple[str, str], Moved] = field(default_factory=dict)
    # (op, transport, LLMStatusCode name) -> failed calls
    failed: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # refusal reason (rpc_errors.CallRefused.reason) -> refused calls
    refused: dict[str, int] = field(default_factory=dict)
    # (direction, state) -> links that entered the state
    link_transitions: dict[tuple[str, str], int] = field(default_factory=dict)
    # transfer calls of this daemon that failed because their bytes did not
    # match their CRC-32C (the far daemon's refusals of pushes included)
    checksum_mismatches: int = 0

    def _moved(self, op: str, transport: str) -> Moved:
        entry = self.moved.get((op, transport))
        if entry is None:
            entry = self.moved[(op, transport)] = Moved()
        return entry

    def transferred(self, op: str, transport: str, nbytes: int, control_s: float,
                    data_s: float) -> None:
        """One successful pull or push: its bytes and its control and data time."""
        entry = self.moved.get((op, transport)) or self._moved(op, transport)
        entry.count += 1
        entry.bytes += nbytes
        total_s = control_s + data_s
        entry.control.counts[bisect_left(LATENCY_BOUNDS, control_s)] += 1
        entry.data.counts[bisect_left(LATENCY_BOUNDS, data_s)] += 1
        entry.total.counts[bisect_left(LATENCY_BOUNDS, total_s)] += 1
        entry.control.sum += control_s
        entry.data.sum += data_s
        entry.total.sum += total_s

    def copied(self, op: str, transport: str, nbytes: int) -> None:
        """One successful copy, swap or layer write: counted with its bytes, no latency."""
        entry = self.moved.get((op, transport)) or self._moved(op, transport)
        entry.count += 1
        entry.bytes += nbytes

    def call_failed(self, method: str, status: LLMStatusCode,
                    transport: str = UNKNOWN_TRANSPORT) -> None:
        """A transfer call (by method name) that answered ``status``; others are ignored."""
        op = OPS.get(method)
        if op is None:
            return
        key = (op, transport, status.name)
        self.failed[key] = self.failed.get(key, 0) + 1

    def call_refused(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def link_state(self, direction: str, state: str) -> None:
        """A link entered ``state`` ("up" when made, "closed" when ended; the link
        state machine adds its own states)."""
        key = (direction, state)
        self.link_transitions[key] = self.link_transitions.get(key, 0) + 1

    def transfer_counts(self) -> list[tuple[str, str, str, int, int]]:
        """(op, transport, status, calls, bytes) of every series, successes first."""
        rows = [(op, transport, SUCCESS, entry.count, entry.bytes)
                for (op, transport), entry in sorted(self.moved.items())]
        rows += [(op, transport, status, count, 0)
                 for (op, transport, status), count in sorted(self.failed.items())]
        return rows
