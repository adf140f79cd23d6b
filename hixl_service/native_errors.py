"""Native failures as LLM-DataDist status codes: the one translation.

Two native sources fail with codes of their own, and this module is where
each becomes the `LLMException` a client sees:

* hixl's own native core (``hixl_native``: the TCP data plane and the copy
  threads) ends a request with a status integer: `link_error` and
  `copy_error`;
* the ACL/HCCL shim (``hixl_native._ascend``) raises `AscendError` with
  CANN's code: `to_llm_exception`, with the status from the tables below
  and a message naming the entry point, the native code (with its symbolic
  name when known) and CANN's own text (``aclGetRecentErrMsg`` /
  ``HcclGetErrorString``, carried by the shim's exception). Codes absent
  from the tables map to ``LLM_FAILED``.

CANN's codes and names are those of its public headers (acl_base_rt.h and
rt_error_codes.h of the runtime, hccl_types.h of HCCL).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Literal

import hixl_native
from hixl_native._ascend import AscendError, AscendUnavailable

from hixl_wire.link_status import link_failure
from hixl_wire.status import LLMException, LLMStatusCode

__all__ = ["ACL_CODES", "HCCL_CODES", "Library", "RegionRefused", "code_name", "copy_error",
           "link_error", "process_copy_error", "status_for", "to_llm_exception"]

Library = Literal["acl", "hccl"]

_S = LLMStatusCode

ACL_CODES: Mapping[int, tuple[str, LLMStatusCode]] = types.MappingProxyType(
    {
        # arguments, devices, handles
        100000: ("ACL_ERROR_INVALID_PARAM", _S.LLM_PARAM_INVALID),
        200002: ("ACL_ERROR_INVALID_DEVICE", _S.LLM_PARAM_INVALID),
        200003: ("ACL_ERROR_MEMORY_ADDRESS_UNALIGNED", _S.LLM_PARAM_INVALID),
        200005: ("ACL_ERROR_INVALID_RESOURCE_HANDLE", _S.LLM_PARAM_INVALID),
        107000: ("ACL_ERROR_RT_PARAM_INVALID", _S.LLM_PARAM_INVALID),
        107001: ("ACL_ERROR_RT_INVALID_DEVICEID", _S.LLM_PARAM_INVALID),
        107008: ("ACL_ERROR_RT_ADDR_UNALIGNED", _S.LLM_PARAM_INVALID),
        107016: ("ACL_ERROR_RT_INVALID_MEMORY_TYPE", _S.LLM_PARAM_INVALID),
        107017: ("ACL_ERROR_RT_INVALID_HANDLE", _S.LLM_PARAM_INVALID),
        107018: ("ACL_ERROR_RT_INVALID_MALLOC_TYPE", _S.LLM_PARAM_INVALID),
        # device memory exhausted
        200000: ("ACL_ERROR_BAD_ALLOC", _S.LLM_DEVICE_OUT_OF_MEMORY),
        207001: ("ACL_ERROR_RT_MEMORY_ALLOCATION", _S.LLM_DEVICE_OUT_OF_MEMORY),
        207018: ("ACL_ERROR_RT_DEVICE_OOM", _S.LLM_DEVICE_OUT_OF_MEMORY),
        # other runtime resources (streams, events, notifies) exhausted
        207005: ("ACL_ERROR_RT_RESOURCE_ALLOC_FAIL", _S.LLM_OUT_OF_MEMORY),
        207007: ("ACL_ERROR_RT_NO_EVENT_RESOURCE", _S.LLM_OUT_OF_MEMORY),
        207008: ("ACL_ERROR_RT_NO_STREAM_RESOURCE", _S.LLM_OUT_OF_MEMORY),
        207009: ("ACL_ERROR_RT_NO_NOTIFY_RESOURCE", _S.LLM_OUT_OF_MEMORY),
        # waits that ran out of time
        107019: ("ACL_ERROR_RT_WAIT_TIMEOUT", _S.LLM_TIMEOUT),
        107020: ("ACL_ERROR_RT_TASK_TIMEOUT", _S.LLM_TIMEOUT),
        207020: ("ACL_ERROR_RT_TIMEOUT", _S.LLM_TIMEOUT),
        507012: ("ACL_ERROR_RT_REPORT_TIMEOUT", _S.LLM_TIMEOUT),
        507046: ("ACL_ERROR_RT_STREAM_SYNC_TIMEOUT", _S.LLM_TIMEOUT),
        507047: ("ACL_ERROR_RT_EVENT_SYNC_TIMEOUT", _S.LLM_TIMEOUT),
        # entry points or features this CANN lacks
        200001: ("ACL_ERROR_API_NOT_SUPPORT", _S.LLM_FEATURE_NOT_ENABLED),
        200006: ("ACL_ERROR_FEATURE_UNSUPPORTED", _S.LLM_FEATURE_NOT_ENABLED),
        207000: ("ACL_ERROR_RT_FEATURE_NOT_SUPPORT", _S.LLM_FEATURE_NOT_ENABLED),
        # used after aclFinalize (or before aclInit)
        100001: ("ACL_ERROR_UNINITIALIZE", _S.LLM_ENGINE_FINALIZED),
        # broken device memory: LLM-DataDist passes these through
        507053: ("ACL_ERROR_RT_DEVICE_MEM_ERROR", _S.LLM_DEVICE_MEM_ERROR),
        507054: ("ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR", _S.LLM_DEVICE_MEM_ERROR),
        507055: ("ACL_ERROR_RT_SUSPECT_DEVICE_MEM_ERROR", _S.LLM_DEVICE_MEM_ERROR),
        # the remote end or the link between the two
        507057: ("ACL_ERROR_RT_SUSPECT_REMOTE_ERROR", _S.LLM_SUSPECT_REMOTE_ERROR),
        507056: ("ACL_ERROR_RT_LINK_ERROR", _S.LLM_LINK_FAILED),
        507904: ("ACL_ERROR_RT_COMM_OP_RETRY_FAIL", _S.LLM_LINK_FAILED),
        # named for the message, generic failures all the same
        107002: ("ACL_ERROR_RT_CONTEXT_NULL", _S.LLM_FAILED),
        107022: ("ACL_ERROR_RT_DEVICE_TASK_ABORT", _S.LLM_FAILED),
        107023: ("ACL_ERROR_RT_STREAM_ABORT", _S.LLM_FAILED),
        207006: ("ACL_ERROR_RT_NO_PERMISSION", _S.LLM_FAILED),
        500000: ("ACL_ERROR_INTERNAL_ERROR", _S.LLM_FAILED),
        507000: ("ACL_ERROR_RT_INTERNAL_ERROR", _S.LLM_FAILED),
        507022: ("ACL_ERROR_RT_IPC_ERROR", _S.LLM_FAILED),
        507899: ("ACL_ERROR_RT_DRV_INTERNAL_ERROR", _S.LLM_FAILED),
    }
)
"""ACL runtime codes: ``code -> (name, status)``."""

HCCL_CODES: Mapping[int, tuple[str, LLMStatusCode]] = types.MappingProxyType(
    {
        1: ("HCCL_E_PARA", _S.LLM_PARAM_INVALID),
        2: ("HCCL_E_PTR", _S.LLM_PARAM_INVALID),
        3: ("HCCL_E_MEMORY", _S.LLM_DEVICE_OUT_OF_MEMORY),
        24: ("HCCL_E_OOM", _S.LLM_DEVICE_OUT_OF_MEMORY),
        5: ("HCCL_E_NOT_SUPPORT", _S.LLM_FEATURE_NOT_ENABLED),
        9: ("HCCL_E_TIMEOUT", _S.LLM_TIMEOUT),
        11: ("HCCL_E_TCP_CONNECT", _S.LLM_LINK_FAILED),
        12: ("HCCL_E_ROCE_CONNECT", _S.LLM_LINK_FAILED),
        19: ("HCCL_E_NETWORK", _S.LLM_LINK_FAILED),
        23: ("HCCL_E_OPRETRY_FAIL", _S.LLM_LINK_FAILED),
        13: ("HCCL_E_TCP_TRANSFER", _S.LLM_SUSPECT_REMOTE_ERROR),
        14: ("HCCL_E_ROCE_TRANSFER", _S.LLM_SUSPECT_REMOTE_ERROR),
        21: ("HCCL_E_REMOTE", _S.LLM_SUSPECT_REMOTE_ERROR),
        # transient: the caller may retry
        20: ("HCCL_E_AGAIN", _S.LLM_LINK_BUSY),
        22: ("HCCL_E_SUSPENDING", _S.LLM_LINK_BUSY),
        4: ("HCCL_E_INTERNAL", _S.LLM_FAILED),
        6: ("HCCL_E_NOT_FOUND", _S.LLM_FAILED),
        7: ("HCCL_E_UNAVAIL", _S.LLM_FAILED),
        8: ("HCCL_E_SYSCALL", _S.LLM_FAILED),
        10: ("HCCL_E_OPEN_FILE_FAILURE", _S.LLM_FAILED),
        15: ("HCCL_E_RUNTIME", _S.LLM_FAILED),
        16: ("HCCL_E_DRV", _S.LLM_FAILED),
        17: ("HCCL_E_PROFILING", _S.LLM_FAILED),
        18: ("HCCL_E_CCE", _S.LLM_FAILED),
        1041: ("HCCL_E_IN_STATUS", _S.LLM_FAILED),
    }
)
"""HCCL codes (``HcclResult``): ``code -> (name, status)``."""

del _S


def _table(library: Library) -> Mapping[int, tuple[str, LLMStatusCode]]:
    if library == "acl":
        return ACL_CODES
    if library == "hccl":
        return HCCL_CODES
    raise ValueError(f"library must be 'acl' or 'hccl', not {library!r}")


def status_for(library: Library, code: int) -> LLMStatusCode:
    """Look up the status of one native code.

    Args:
        library: ``"acl"`` for ``aclError`` codes, ``"hccl"`` for ``HcclResult``.
        code: The native code.

    Returns:
        Its `LLMStatusCode`; ``LLM_FAILED`` for codes not in the table.
    """
    entry = _table(library).get(code)
    return LLMStatusCode.LLM_FAILED if entry is None else entry[1]


def code_name(library: Library, code: int) -> str:
    """Return the symbolic name of a native code, or ``"UNKNOWN"``."""
    entry = _table(library).get(code)
    return "UNKNOWN" if entry is None else entry[0]


def to_llm_exception(
    error: AscendError | AscendUnavailable, operation: str = ""
) -> LLMException:
    """Turn a failure of the shim into the exception for a client.

    Args:
        error: An `AclError`/`HcclError` (any `AscendError`) or `AscendUnavailable`.
        operation: What the daemon was doing, prefixed to the message.

    Returns:
        An `LLMException` (raise it ``from error``). `AscendUnavailable`
        becomes ``LLM_FEATURE_NOT_ENABLED``.
    """
    prefix = f"{operation}: " if operation else ""
    if isinstance(error, AscendUnavailable):
        return LLMException(
            f"{prefix}{error}", status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED
        )
    library: Library = "hccl" if error.library == "hccl" else "acl"
    status = status_for(library, error.code)
    text = (
        f"{prefix}{error.api} failed with {library.upper()} error {error.code} "
        f"({code_name(library, error.code)})"
    )
    if error.detail:
        text = f"{text}: {error.detail}"
    return LLMException(text, status_code=status)


# -- hixl's own native core -------------------------------------------------------
# The link statuses' table is hixl_wire.link_status's: a client raises the same
# for a repeat that failed on its rings (hixl_wire.rings).

class RegionRefused(LLMException):
    """The far end refused a range (a region gone, or outside it); nothing moved.

    A transfer that used a remembered resolve of the far cache resolves it
    afresh and tries once more."""


class ChecksumMismatch(LLMException):
    """The transfer's bytes did not match their CRC-32C (here, or at the far
    daemon that received them); counted in ``hixl_checksum_mismatches``."""


def link_error(status: int) -> LLMException:
    """The exception for a data-link request that ended with native ``status``."""
    code, text = link_failure(status)
    kind: type[LLMException] = LLMException
    if status == hixl_native.E_REFUSED:
        kind = RegionRefused
    elif status == hixl_native.E_CHECKSUM:
        kind = ChecksumMismatch
    return kind(text, status_code=code)


def process_copy_error(status: int) -> LLMException:
    """The exception for a copy with engine memory (``copy_process``) that failed."""
    if status == hixl_native.E_GONE:
        text = "a cache's engine memory is gone: it was unregistered, or its process exited"
    elif status == hixl_native.E_REFUSED:
        text = "the kernel refused the daemon access to a cache's engine memory"
    else:
        text = f"a copy with engine memory failed ({hixl_native.status_name(status)})"
    return LLMException(text, status_code=LLMStatusCode.LLM_PARAM_INVALID)


def copy_error(status: int) -> LLMException:
    """The exception for a copy the native copy threads did not run: they only
    refuse work once they are closing, so the daemon is stopping."""
    return LLMException(f"a copy did not run ({hixl_native.status_name(status)}): "
                        f"the daemon is stopping", status_code=LLMStatusCode.LLM_FAILED)
