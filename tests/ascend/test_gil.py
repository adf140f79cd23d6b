"""Blocking CANN calls run with the GIL released: another Python thread
keeps running while the double makes a call sleep or wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from tests.cann_double import DoubleControl

if TYPE_CHECKING:
    from hixl_native import _ascend as ascend
else:
    ascend = pytest.importorskip("hixl_native._ascend")



def progress_during(call: Callable[[], object]) -> tuple[int, int, float]:
    """Run ``call`` while a thread counts.

    Returns:
        (increments during 100 ms of sleep, increments during the call, its seconds).
    """
    stop = threading.Event()
    count = 0

    def spin() -> None:
        nonlocal count
        while not stop.is_set():
            count += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        start_cal = count
        time.sleep(0.1)  # releases the GIL: the rate of the counter
        calibration = count - start_cal
        before = count
        start = time.monotonic()
        call()
        elapsed = time.monotonic() - start
        during = count - before
    finally:
        stop.set()
        t.join(5)
    return calibration, during, elapsed


def test_gil_released_in_a_slow_call(device: ascend.Device, double: DoubleControl) -> None:
    double.delay("aclrtMalloc", 300)
    bufs: list[ascend.DeviceBuffer] = []
    calibration, during, elapsed = progress_during(lambda: bufs.append(device.malloc(1)))
    bufs[0].close()
    assert elapsed >= 0.25
    # Holding the GIL for the 300 ms call would allow the counter about one
    # switch interval (5 ms) of increments; released, it runs throughout.
    assert during > calibration, (calibration, during)


def test_gil_released_while_synchronizing(device: ascend.Device, double: DoubleControl) -> None:
    with device.create_stream() as stream, device.malloc(1) as a, device.malloc(1) as b:
        double.delay("exec:aclrtMemcpyAsync", 500)  # 100 ms of it pass in calibration
        stream.memcpy_async(a, 0, b, 0, 8)
        calibration, during, elapsed = progress_during(
            lambda: stream.synchronize(timeout_ms=5000))
    assert elapsed >= 0.3
    assert during > calibration, (calibration, during)
