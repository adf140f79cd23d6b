"""The linked daemon's check of the ranges an HCCL batch names (before it queues anything)."""

from __future__ import annotations

import numpy as np
import pytest

from hixl_client import LLMException, LLMStatusCode
from hixl_service.transports.hccl import region_pairs


def encode(*pairs: tuple[int, int]) -> bytes:
    return np.array(pairs, dtype="<u8").tobytes()


def test_pairs_become_offsets_in_the_memory() -> None:
    got = region_pairs(encode((0, 10), (90, 10)), 7, region_offset=4096, region_size=100)
    assert got.tolist() == [4096, 10, 4186, 10]


@pytest.mark.parametrize("ranges", [
    b"",                                  # nothing
    encode((0, 1))[:-3],                  # a partial pair
    encode((95, 10)),                     # past the end
    encode((2**64 - 1, 2)),               # wraps around
])
def test_bad_ranges_are_refused(ranges: bytes) -> None:
    with pytest.raises(LLMException) as info:
        region_pairs(ranges, 7, region_offset=0, region_size=100)
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
