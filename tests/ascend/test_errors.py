"""The mapping of every ACL and HCCL code to an LLMStatusCode, and the
messages of hixl_service.native_errors.to_llm_exception."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from hixl_client.status import LLMException, LLMStatusCode

if TYPE_CHECKING:
    from hixl_native import _ascend as ascend

    from hixl_service.ascend import errors
else:
    ascend = pytest.importorskip("hixl_native._ascend")
    errors = pytest.importorskip("hixl_service.native_errors")


S = LLMStatusCode

# Written out independently of the module's tables, so that a changed entry
# fails here.
EXPECTED_ACL = {
    100000: S.LLM_PARAM_INVALID, 200002: S.LLM_PARAM_INVALID, 200003: S.LLM_PARAM_INVALID,
    200005: S.LLM_PARAM_INVALID, 107000: S.LLM_PARAM_INVALID, 107001: S.LLM_PARAM_INVALID,
    107008: S.LLM_PARAM_INVALID, 107016: S.LLM_PARAM_INVALID, 107017: S.LLM_PARAM_INVALID,
    107018: S.LLM_PARAM_INVALID,
    200000: S.LLM_DEVICE_OUT_OF_MEMORY, 207001: S.LLM_DEVICE_OUT_OF_MEMORY,
    207018: S.LLM_DEVICE_OUT_OF_MEMORY,
    207005: S.LLM_OUT_OF_MEMORY, 207007: S.LLM_OUT_OF_MEMORY, 207008: S.LLM_OUT_OF_MEMORY,
    207009: S.LLM_OUT_OF_MEMORY,
    107019: S.LLM_TIMEOUT, 107020: S.LLM_TIMEOUT, 207020: S.LLM_TIMEOUT, 507012: S.LLM_TIMEOUT,
    507046: S.LLM_TIMEOUT, 507047: S.LLM_TIMEOUT,
    200001: S.LLM_FEATURE_NOT_ENABLED, 200006: S.LLM_FEATURE_NOT_ENABLED,
    207000: S.LLM_FEATURE_NOT_ENABLED,
    100001: S.LLM_ENGINE_FINALIZED,
    507053: S.LLM_DEVICE_MEM_ERROR, 507054: S.LLM_DEVICE_MEM_ERROR,
    507055: S.LLM_DEVICE_MEM_ERROR,
    507057: S.LLM_SUSPECT_REMOTE_ERROR,
    507056: S.LLM_LINK_FAILED, 507904: S.LLM_LINK_FAILED,
    107002: S.LLM_FAILED, 107022: S.LLM_FAILED, 107023: S.LLM_FAILED, 207006: S.LLM_FAILED,
    500000: S.LLM_FAILED, 507000: S.LLM_FAILED, 507022: S.LLM_FAILED, 507899: S.LLM_FAILED,
}
EXPECTED_HCCL = {
    1: S.LLM_PARAM_INVALID, 2: S.LLM_PARAM_INVALID,
    3: S.LLM_DEVICE_OUT_OF_MEMORY, 24: S.LLM_DEVICE_OUT_OF_MEMORY,
    5: S.LLM_FEATURE_NOT_ENABLED,
    9: S.LLM_TIMEOUT,
    11: S.LLM_LINK_FAILED, 12: S.LLM_LINK_FAILED, 19: S.LLM_LINK_FAILED, 23: S.LLM_LINK_FAILED,
    13: S.LLM_SUSPECT_REMOTE_ERROR, 14: S.LLM_SUSPECT_REMOTE_ERROR,
    21: S.LLM_SUSPECT_REMOTE_ERROR,
    20: S.LLM_LINK_BUSY, 22: S.LLM_LINK_BUSY,
    4: S.LLM_FAILED, 6: S.LLM_FAILED, 7: S.LLM_FAILED, 8: S.LLM_FAILED, 10: S.LLM_FAILED,
    15: S.LLM_FAILED, 16: S.LLM_FAILED, 17: S.LLM_FAILED, 18: S.LLM_FAILED, 1041: S.LLM_FAILED,
}


def test_tables_cover_exactly_the_expected_codes() -> None:
    assert set(errors.ACL_CODES) == set(EXPECTED_ACL)
    assert set(errors.HCCL_CODES) == set(EXPECTED_HCCL)
    names = [name for name, _ in (*errors.ACL_CODES.values(), *errors.HCCL_CODES.values())]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(("code", "status"), sorted(EXPECTED_ACL.items()))
def test_acl_code(code: int, status: LLMStatusCode) -> None:
    assert errors.status_for("acl", code) is status
    exc = errors.to_llm_exception(ascend.AclError(code, "aclrtSomething", "EE1001: why"), "op")
    assert isinstance(exc, LLMException) and exc.status_code is status
    name = errors.code_name("acl", code)
    assert name.startswith("ACL_ERROR_")
    assert str(exc) == f"op: aclrtSomething failed with ACL error {code} ({name}): EE1001: why"


@pytest.mark.parametrize(("code", "status"), sorted(EXPECTED_HCCL.items()))
def test_hccl_code(code: int, status: LLMStatusCode) -> None:
    assert errors.status_for("hccl", code) is status
    exc = errors.to_llm_exception(ascend.HcclError(code, "HcclSend"))
    assert exc.status_code is status
    name = errors.code_name("hccl", code)
    assert name.startswith("HCCL_E_")
    assert str(exc) == f"HcclSend failed with HCCL error {code} ({name})"


@pytest.mark.parametrize(("library", "code"), [("acl", 123), ("acl", 9), ("hccl", 507046),
                                                ("hccl", 999), ("acl", -1)])
def test_unknown_codes_are_failed(library: errors.Library, code: int) -> None:
    assert errors.status_for(library, code) is S.LLM_FAILED
    assert errors.code_name(library, code) == "UNKNOWN"


def test_the_library_decides_between_equal_numbers() -> None:
    # 9 is HCCL_E_TIMEOUT but no ACL code; the exception's class picks the table
    assert errors.to_llm_exception(ascend.HcclError(9, "HcclRecv")).status_code is S.LLM_TIMEOUT
    assert errors.to_llm_exception(ascend.AclError(9, "aclrtX")).status_code is S.LLM_FAILED


def test_unavailable_is_feature_not_enabled() -> None:
    exc = errors.to_llm_exception(ascend.AscendUnavailable("no libascendcl.so"), "link")
    assert exc.status_code is S.LLM_FEATURE_NOT_ENABLED
    assert str(exc) == "link: HCCL backend unavailable: no libascendcl.so"


def test_bad_library_name() -> None:
    with pytest.raises(ValueError):
        errors.status_for("cuda", 1)  # type: ignore[arg-type]
