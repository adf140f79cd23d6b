"""The daemon's view of the kernel's ptrace policy for engine-allocated memory,
and the refusals it leads to (memory.process)."""

from __future__ import annotations

import os

import hixl_native
import numpy as np
import pytest

from hixl_client.status import LLMException, LLMStatusCode
from hixl_service.memory.process import ClientProcess, CrossMemoryPolicy, reach


@pytest.mark.parametrize(("scope", "cap", "refused"), [
    (None, False, False), (0, False, False), (1, False, False), (2, True, False),
    (2, False, True), (3, True, True),
])
def test_policy_says_plainly_when_it_cannot_work(scope: int | None, cap: bool,
                                                  refused: bool) -> None:
    policy = CrossMemoryPolicy(scope, cap)
    assert (policy.refusal is not None) == refused
    summary = policy.summary()
    assert summary.startswith("refused: " if refused else "ok: ")
    if refused:
        assert f"ptrace_scope is {scope}" in summary and "alloc_shareable" in summary
    if scope == 1 and not cap:
        assert "PR_SET_PTRACER" in summary


def test_a_refusing_policy_fails_registration_with_the_reason() -> None:
    pools = (hixl_native.BouncePool(1, 65536), hixl_native.BouncePool(1, 65536))
    array = np.zeros(4096, dtype=np.uint8)
    process = ClientProcess(os.getpid(), os.getuid(), os.pidfd_open(os.getpid()))
    try:
        with pytest.raises(LLMException, match="ptrace_scope is 3") as info:
            reach(process, 1, [array.ctypes.data], 4096, pools, CrossMemoryPolicy(3, True))
        assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
        memory = reach(process, 1, [array.ctypes.data], 4096, pools, CrossMemoryPolicy(0, False))
        assert memory.size == 4096 and memory.client_base == array.ctypes.data
        memory.release()
        assert memory.span.revoked
    finally:
        process.close()
