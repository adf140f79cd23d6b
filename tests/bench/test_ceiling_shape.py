"""Which ceiling a hixl row is compared with, above all with several requests in flight."""

from __future__ import annotations

import dataclasses

from hixl_bench.cli import _ceilings_of
from hixl_bench.model import CEILING, HIXL, KIB, MIB, Case, Row, ceiling_shape
from hixl_bench.plan import cold_bytes_for, full_plan
from hixl_bench.report import add_ratios


def test_requests_in_flight_compare_with_their_bytes_moved_at_once() -> None:
    assert ceiling_shape(4 * KIB, 128, 1) == (4 * KIB, 128)
    assert ceiling_shape(4 * KIB, 128, 16) == (4 * KIB, 2048)
    assert ceiling_shape(MIB, 1, 64) == (MIB, 64)
    # Capped at 64 MiB, where the ceilings' GB/s no longer grows ...
    assert ceiling_shape(64 * KIB, 128, 64) == (64 * KIB, 1024)
    # ... but never below the one request itself.
    assert ceiling_shape(64 * MIB, 2, 4) == (64 * MIB, 2)


def test_each_ceiling_shape_is_measured_once_with_the_paths_that_need_it() -> None:
    group = [Case("conc", "pull", "tcp", 4 * KIB, 128, conc) for conc in (1, 4)]
    group.append(Case("conc", "pull", "local", 4 * KIB, 128, 4))
    group.append(Case("batch", "pull", "tcp", 4 * KIB, 128))
    assert _ceilings_of(group) == [((4 * KIB, 128), {"tcp"}), ((4 * KIB, 512), {"local", "tcp"})]


def test_a_concurrency_row_takes_its_ratio_from_the_matching_ceiling() -> None:
    one = Row(CEILING, "tcp-cx4", "ceiling", "copy", "tcp", 4 * KIB, 128, gbps=4.0)
    sixteen = Row(CEILING, "tcp-cx4", "ceiling", "copy", "tcp", 4 * KIB, 2048, gbps=5.0)
    alone = Row(HIXL, "hixl", "conc", "pull", "tcp", 4 * KIB, 128, 1, gbps=2.0)
    busy = Row(HIXL, "hixl", "conc", "pull", "tcp", 4 * KIB, 128, 16, gbps=2.5)
    add_ratios([one, sixteen, alone, busy], streams=4)
    assert (alone.ratio, alone.ratio_to) == (0.5, "tcp-cx4")
    assert (busy.ratio, busy.ratio_to) == (0.5, "tcp-cx4")


def test_cold_buffers_hold_the_largest_ceiling_request() -> None:
    # 64 requests of 1 MiB in flight: the ceiling moves 64 MiB at once, far
    # more than any request of the plan, and the cold buffers must hold it.
    plan = dataclasses.replace(full_plan(), cases=(Case("conc", "pull", "tcp", MIB, 1, 64),),
                               kv_cases=(), cold_bytes=MIB)
    assert plan.max_request_bytes() == 64 * MIB
    assert cold_bytes_for(plan) >= 64 * MIB
