"""Where the time of a transfer went: in the client, in the daemon's control work,
or moving bytes. For benchmarks and diagnosis; nothing is recorded unless asked::

    with capture_timings() as timings:
        await cm.pull_cache(key, cache)
    print(timings[-1].client_us, timings[-1].control_us, timings[-1].data_us)

``capture_layer_lags`` does the same for the layers of transfer_cache_async
tasks: how long after its synchronizer let it go each layer had landed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

_CAPTURE: ContextVar[list[TransferTiming] | None] = ContextVar("hixl_timings", default=None)


@dataclass(frozen=True)
class TransferTiming:
    """One pull or push, in microseconds.

    Attributes:
        operation: the CacheManager method.
        call_us: the whole call, measured by the client.
        control_us: the daemon's work besides moving bytes (planning, finding the
            remote cache, settling keys).
        data_us: the daemon's time moving bytes (native copy or data plane).
    """

    operation: str
    call_us: float
    control_us: float
    data_us: float

    @property
    def client_us(self) -> float:
        """The rest: the client library, gRPC to the local daemon and back."""
        return max(0.0, self.call_us - self.control_us - self.data_us)


@contextlib.contextmanager
def capture_timings() -> Iterator[list[TransferTiming]]:
    """Collect a TransferTiming for each transfer awaited inside the block (this task
    and the tasks it starts)."""
    timings: list[TransferTiming] = []
    token = _CAPTURE.set(timings)
    try:
        yield timings
    finally:
        _CAPTURE.reset(token)


def record(operation: str, call_s: float, reply: Any) -> None:
    """Add one transfer's timing when a capture is active (a no-op otherwise)."""
    timings = _CAPTURE.get()
    if timings is not None:
        timings.append(TransferTiming(operation, call_s * 1e6, float(reply.control_us),
                                      float(reply.data_us)))


@dataclass
class LayerLag:
    """When one layer of a transfer_cache_async task could go, and when it had landed.

    Attributes:
        layer: the source layer.
        ready_s: ``time.perf_counter()`` when its synchronizer returned True.
        landed_s: when the daemon reported it written to every target that
            needs it (None: it never was).
    """

    layer: int
    ready_s: float
    landed_s: float | None = None

    @property
    def lag_s(self) -> float | None:
        return None if self.landed_s is None else self.landed_s - self.ready_s


_LAG_CAPTURE: ContextVar[list[list[LayerLag]] | None] = ContextVar("hixl_layer_lags",
                                                                   default=None)


@contextlib.contextmanager
def capture_layer_lags() -> Iterator[list[list[LayerLag]]]:
    """For benchmarks: each transfer_cache_async started inside the block (in this
    task) adds the list of its layers' LayerLag, in sending order."""
    tasks: list[list[LayerLag]] = []
    token = _LAG_CAPTURE.set(tasks)
    try:
        yield tasks
    finally:
        _LAG_CAPTURE.reset(token)


def layer_lag_capture() -> list[list[LayerLag]] | None:
    """Where a task started now adds its layers' LayerLag (None: no capture active)."""
    return _LAG_CAPTURE.get()
