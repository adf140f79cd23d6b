"""hixl_wire.status: LLMStatusCode integers, LLMException, and the gRPC status table
and trailing metadata that carry a status across the wire (the client's helpers
around them: tests/client/test_status.py)."""

from __future__ import annotations

import pickle

import grpc
import grpc.aio
import pytest

import hixl_client.status
from hixl_wire.status import (
    GRPC_TO_STATUS,
    STATUS_METADATA_KEY,
    STATUS_TO_GRPC,
    LLMException,
    LLMStatusCode,
    code_2_status,
    error_from_rpc,
    param_invalid,
    status_from_grpc,
    status_metadata,
)

S = LLMStatusCode

EXPECTED_VALUES = [
    ("LLM_SUCCESS", 0),
    ("LLM_FAILED", 0xFFFFFFFF),
    ("LLM_WAIT_PROCESS_TIMEOUT", 1343270913),
    ("LLM_KV_CACHE_NOT_EXIST", 1343270914),
    ("LLM_REPEAT_REQUEST", 1343270915),
    ("LLM_REQUEST_ALREADY_COMPLETED", 1343270916),
    ("LLM_PARAM_INVALID", 1343270917),
    ("LLM_ENGINE_FINALIZED", 1343270918),
    ("LLM_NOT_YET_LINK", 1343270919),
    ("LLM_ALREADY_LINK", 1343270920),
    ("LLM_LINK_FAILED", 1343270921),
    ("LLM_UNLINK_FAILED", 1343270922),
    ("LLM_NOTIFY_PROMPT_UNLINK_FAILED", 1343270923),
    ("LLM_CLUSTER_NUM_EXCEED_LIMIT", 1343270924),
    ("LLM_PROCESSING_LINK", 1343270925),
    ("LLM_DEVICE_OUT_OF_MEMORY", 1343270926),
    ("LLM_PREFIX_ALREADY_EXIST", 1343270927),
    ("LLM_PREFIX_NOT_EXIST", 1343270928),
    ("LLM_SEQ_LENOVERLIMIT", 1343270929),
    ("LLM_NO_FREE_BLOCK", 1343270930),
    ("LLM_BLOCKS_OUT_OF_MEMORY", 1343270931),
    ("LLM_EXIST_LINK", 1343270936),
    ("LLM_FEATURE_NOT_ENABLED", 1343270937),
    ("LLM_TIMEOUT", 1343270938),
    ("LLM_LINK_BUSY", 1343270939),
    ("LLM_OUT_OF_MEMORY", 1343270940),
    ("LLM_DEVICE_MEM_ERROR", 507053),
    ("LLM_SUSPECT_REMOTE_ERROR", 507057),
    ("LLM_UNKNOWN_ERROR", -1),
]


@pytest.mark.parametrize(("name", "value"), EXPECTED_VALUES)
def test_member_integer(name: str, value: int) -> None:
    member = LLMStatusCode[name]
    assert member == value
    assert int(member) == value
    assert isinstance(member, int)


def test_member_set_is_exactly_the_spec() -> None:
    assert [m.name for m in S] == [name for name, _ in EXPECTED_VALUES]


@pytest.mark.parametrize("member", list(S))
def test_str_and_format(member: LLMStatusCode) -> None:
    assert str(member) == f"LLMStatusCode.{member.name}"
    assert f"{member}" == f"LLMStatusCode.{member.name}"
    assert f"{member!s}" == str(member)


@pytest.mark.parametrize("member", [m for m in S if m is not S.LLM_UNKNOWN_ERROR])
def test_code_2_status_known(member: LLMStatusCode) -> None:
    assert code_2_status(int(member)) is member


@pytest.mark.parametrize(
    "code",
    [0x5010B014, 0x5010B015, 0x5010B016, 0x5010B017, 12345, -1, 2**64],
    ids=["incompatible", "key-exists", "copy-failed", "id-exists", "random", "minus-one", "huge"],
)
def test_code_2_status_unknown_is_failed(code: int) -> None:
    assert code_2_status(code) is S.LLM_FAILED


def test_exception_defaults_to_success() -> None:
    exc = LLMException("boom")
    assert isinstance(exc, RuntimeError)
    assert exc.status_code is S.LLM_SUCCESS
    assert str(exc) == "boom"


def test_exception_keeps_status_and_args() -> None:
    exc = LLMException("a", "b", status_code=S.LLM_TIMEOUT)
    assert exc.status_code is S.LLM_TIMEOUT
    assert exc.args == ("a", "b")


def test_exception_pickles_with_status() -> None:
    exc = pickle.loads(pickle.dumps(LLMException("x", status_code=S.LLM_LINK_BUSY)))
    assert type(exc) is LLMException
    assert exc.args == ("x",)
    assert exc.status_code is S.LLM_LINK_BUSY



# ---- the gRPC table -------------------------------------------------------------------------


def test_table_covers_every_member_once() -> None:
    assert set(STATUS_TO_GRPC) == set(S)
    assert len(STATUS_TO_GRPC) == len(S)
    assert all(isinstance(code, grpc.StatusCode) for code in STATUS_TO_GRPC.values())


def test_only_success_maps_to_ok() -> None:
    assert [m for m, g in STATUS_TO_GRPC.items() if g is grpc.StatusCode.OK] == [S.LLM_SUCCESS]


@pytest.mark.parametrize(
    ("member", "grpc_code"),
    [
        (S.LLM_KV_CACHE_NOT_EXIST, grpc.StatusCode.NOT_FOUND),
        (S.LLM_PARAM_INVALID, grpc.StatusCode.INVALID_ARGUMENT),
        (S.LLM_TIMEOUT, grpc.StatusCode.DEADLINE_EXCEEDED),
        (S.LLM_WAIT_PROCESS_TIMEOUT, grpc.StatusCode.DEADLINE_EXCEEDED),
        (S.LLM_OUT_OF_MEMORY, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (S.LLM_NOT_YET_LINK, grpc.StatusCode.FAILED_PRECONDITION),
        (S.LLM_ENGINE_FINALIZED, grpc.StatusCode.FAILED_PRECONDITION),
        (S.LLM_FAILED, grpc.StatusCode.INTERNAL),
        (S.LLM_ALREADY_LINK, grpc.StatusCode.ALREADY_EXISTS),
        (S.LLM_LINK_FAILED, grpc.StatusCode.UNAVAILABLE),
    ],
)
def test_table_entries(member: LLMStatusCode, grpc_code: grpc.StatusCode) -> None:
    assert STATUS_TO_GRPC[member] is grpc_code


@pytest.mark.parametrize(("grpc_code", "member"), list(GRPC_TO_STATUS.items()))
def test_fallback_is_a_preimage(grpc_code: grpc.StatusCode, member: LLMStatusCode) -> None:
    assert STATUS_TO_GRPC[member] is grpc_code


def test_metadata_key_is_valid_grpc_metadata() -> None:
    assert STATUS_METADATA_KEY == "hixl-llm-status"
    assert STATUS_METADATA_KEY == STATUS_METADATA_KEY.lower()
    assert not STATUS_METADATA_KEY.endswith("-bin")


@pytest.mark.parametrize("member", [m for m in S if m is not S.LLM_UNKNOWN_ERROR])
def test_metadata_round_trip(member: LLMStatusCode) -> None:
    ((key, value),) = status_metadata(member)
    assert key == STATUS_METADATA_KEY
    assert value == str(int(member))
    assert status_from_grpc(STATUS_TO_GRPC[member], value) is member
    assert status_from_grpc(STATUS_TO_GRPC[member], value.encode()) is member


@pytest.mark.parametrize(
    ("grpc_code", "metadata", "expected"),
    [
        (grpc.StatusCode.DEADLINE_EXCEEDED, None, S.LLM_TIMEOUT),
        (grpc.StatusCode.INVALID_ARGUMENT, None, S.LLM_PARAM_INVALID),
        (grpc.StatusCode.NOT_FOUND, None, S.LLM_KV_CACHE_NOT_EXIST),
        (grpc.StatusCode.UNAVAILABLE, None, S.LLM_FAILED),
        (grpc.StatusCode.CANCELLED, None, S.LLM_FAILED),
        (grpc.StatusCode.UNKNOWN, None, S.LLM_FAILED),
        (grpc.StatusCode.NOT_FOUND, "garbage", S.LLM_KV_CACHE_NOT_EXIST),
        (grpc.StatusCode.INTERNAL, "1343270939", S.LLM_LINK_BUSY),
        (grpc.StatusCode.INTERNAL, "-1", S.LLM_FAILED),
    ],
)
def test_status_from_grpc_fallbacks(
    grpc_code: grpc.StatusCode, metadata: str | None, expected: LLMStatusCode
) -> None:
    assert status_from_grpc(grpc_code, metadata) is expected


# ---- a failed gRPC call as the far side meant it ---------------------------------------------


def _rpc_error(code: grpc.StatusCode, details: str,
               status: str | None = None) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata() if status is None else grpc.aio.Metadata(
        (STATUS_METADATA_KEY, status))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details)


def test_error_from_rpc_keeps_the_daemons_exact_status_and_message() -> None:
    error = error_from_rpc(_rpc_error(grpc.StatusCode.ABORTED, "busy",
                                      str(int(S.LLM_LINK_BUSY))), "hixl daemon at x")
    assert error.status_code is S.LLM_LINK_BUSY and str(error) == "busy"
    nameless = error_from_rpc(_rpc_error(grpc.StatusCode.ABORTED, "",
                                         str(int(S.LLM_LINK_BUSY))), "x")
    assert str(nameless) == "LLM_LINK_BUSY"
    garbled = error_from_rpc(_rpc_error(grpc.StatusCode.INTERNAL, "?", "nope"), "x")
    assert garbled.status_code is S.LLM_FAILED


@pytest.mark.parametrize(
    ("code", "expected"),
    [(grpc.StatusCode.UNAVAILABLE, S.LLM_NOT_YET_LINK),
     (grpc.StatusCode.CANCELLED, S.LLM_NOT_YET_LINK),
     (grpc.StatusCode.DEADLINE_EXCEEDED, S.LLM_TIMEOUT),
     (grpc.StatusCode.PERMISSION_DENIED, S.LLM_FAILED)])
def test_error_from_rpc_without_a_status_names_who_failed_and_how(
        code: grpc.StatusCode, expected: LLMStatusCode) -> None:
    error = error_from_rpc(_rpc_error(code, "boom"), "hixl daemon at unix:/x",
                           unavailable=S.LLM_NOT_YET_LINK)
    assert error.status_code is expected
    assert str(error) == f"hixl daemon at unix:/x: {code.name}: boom"


def test_param_invalid_is_a_broken_rule() -> None:
    error = param_invalid("bad")
    assert error.status_code is S.LLM_PARAM_INVALID and str(error) == "bad"


def test_the_public_home_is_the_clients() -> None:
    # Tracebacks, reprs and pickles name them as users import them.
    assert LLMException.__module__ == LLMStatusCode.__module__ == "hixl_client.status"
    assert hixl_client.status.LLMException is LLMException
    assert hixl_client.status.LLMStatusCode is LLMStatusCode
