"""LLM-DataDist's status helpers of the client (``Status``, ``raise_if_false``,
``raise_if_true``, ``handle_llm_status``); the codes and the exception they raise
are hixl_wire's (tests/wire/test_status.py)."""

from __future__ import annotations

import pytest

from hixl_client.status import (
    LLMException,
    LLMStatusCode,
    Status,
    handle_llm_status,
    raise_if_false,
    raise_if_true,
)

S = LLMStatusCode


@pytest.mark.parametrize(
    ("code", "ok"), [(S.LLM_SUCCESS, True), (S.LLM_FAILED, False), (S.LLM_TIMEOUT, False)]
)
def test_status(code: LLMStatusCode, ok: bool) -> None:
    status = Status(code)
    assert status.is_ok() is ok
    assert status.status_code is code


@pytest.mark.parametrize(
    ("helper", "pred", "raises"),
    [
        (raise_if_false, False, True),
        (raise_if_false, True, False),
        (raise_if_true, True, True),
        (raise_if_true, False, False),
    ],
)
def test_raise_helpers(helper: object, pred: bool, raises: bool) -> None:
    assert callable(helper)
    if not raises:
        helper(pred, "never {0}", 1)
        return
    with pytest.raises(LLMException, match=r"^value 1 of x$") as info:
        helper(pred, "value {0} of {name}", 1, name="x")
    assert info.value.status_code is S.LLM_PARAM_INVALID


def test_raise_helper_custom_status() -> None:
    with pytest.raises(LLMException) as info:
        raise_if_false(0, "nope", status_code=S.LLM_FEATURE_NOT_ENABLED)
    assert info.value.status_code is S.LLM_FEATURE_NOT_ENABLED


def test_raise_helper_format_is_not_applied_without_args() -> None:
    with pytest.raises(LLMException, match=r"^braces \{\} stay$"):
        raise_if_true(True, "braces {{}} stay")


def test_handle_llm_status() -> None:
    handle_llm_status(0, "pull_cache", "info")
    with pytest.raises(LLMException) as info:
        handle_llm_status(int(S.LLM_TIMEOUT), "pull_cache", "cache_id=1")
    assert info.value.status_code is S.LLM_TIMEOUT
    assert (
        str(info.value) == "pull_cache failed, error code is LLMStatusCode.LLM_TIMEOUT, cache_id=1."
    )
    with pytest.raises(LLMException) as info:
        handle_llm_status(0x5010B016, "copy_cache", "x")
    assert info.value.status_code is S.LLM_FAILED
