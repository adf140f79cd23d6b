"""Repeat handles: one per shape and direction, bounded per cluster, never
reused; and a repeat's plan (the slot-0 plan moved by two slot offsets) is the
full planner's."""

from __future__ import annotations

import numpy as np
import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service import repeats
from hixl_service.planning import Layout, plan_cache_pull, tensor_pairs
from hixl_service.repeats import RepeatTable
from hixl_wire.types import TransferShape


def _shape(remote_cache_id: int, size: int = -1, push: bool = False) -> TransferShape:
    return TransferShape(push, 2, remote_cache_id, 7, size, 2, (), (), 0)


def test_one_handle_per_shape_and_none_once_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repeats, "MAX_SHAPES", 4)
    table, other = RepeatTable(), RepeatTable()
    first = table.offer(_shape(1))
    assert first and table.offer(_shape(1)) == first
    assert table.get(first, push=False).shape == _shape(1)
    handles = {first, table.offer(_shape(1, size=64)), table.offer(_shape(2)),
               table.offer(_shape(1, push=True))}
    assert len(handles) == 4 and len(table) == 4
    assert table.offer(_shape(3)) == 0  # full: that shape's transfers take the full path
    assert table.offer(_shape(2)) in handles  # known shapes keep theirs
    # A pull's handle does not name a push, nor the other way round.
    for handle, push in ((first, True), (table.offer(_shape(1, push=True)), False)):
        with pytest.raises(LLMException) as crossed:
            table.get(handle, push=push)
        assert crossed.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    # Another cluster's handles are new numbers: a handle names one shape for good.
    assert other.offer(_shape(1)) not in handles
    with pytest.raises(LLMException) as unknown:
        other.get(first, push=False)
    assert unknown.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


def _layout(rng: np.random.Generator, tensors: int, slots: int, stride: int,
            packed: bool) -> Layout:
    """Tensors back to back (``packed``: neighbouring slots' ranges merge) or apart."""
    size = slots * stride
    gaps = np.zeros(tensors, dtype=np.int64) if packed else rng.integers(1, 4, tensors) * 4096
    offsets = np.cumsum(np.concatenate(([0], np.full(tensors - 1, size)))) + np.cumsum(gaps)
    return Layout(tuple(int(o) for o in offsets), size, slots)


@pytest.mark.parametrize("seed", range(12))
def test_a_slot_zero_plan_moved_by_slot_offsets_is_the_planners_plan(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tensors = int(rng.choice([1, 2, 6, 12]))  # a few: plain Python; many: the native loop
    slots = int(rng.integers(1, 5))
    stride = int(rng.integers(1, 64)) * 64
    src = _layout(rng, tensors, slots, stride, packed=bool(rng.integers(0, 2)))
    dst = _layout(rng, tensors, slots, stride, packed=bool(rng.integers(0, 2)))
    size = int(rng.choice([-1, stride, stride // 2]))
    pairs = tensor_pairs(src, dst, [], [], 2 if tensors % 2 == 0 else 1)
    template, _ = plan_cache_pull(src, 0, dst, 0, size, pairs)
    for src_slot in range(slots):
        for dst_slot in range(slots):
            planned, _ = plan_cache_pull(src, src_slot, dst, dst_slot, size, pairs)
            moved = template + np.array((src_slot * src.stride, dst_slot * dst.stride, 0),
                                        dtype=np.uint64)
            np.testing.assert_array_equal(moved, planned)
