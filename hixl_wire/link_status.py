"""What a data-link request that ended with a native status tells a client.

The daemon raises it (``hixl_service.native_errors.link_error``) and the
client raises the same for a repeat that failed on the rings
(``hixl_wire.rings``, ``OUTCOME_FAILED``), which carry only the status: one
table, so that both say the same status code and the same words.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import hixl_native

from .status import LLMStatusCode

LINK_STATUS: Mapping[int, tuple[LLMStatusCode, str]] = types.MappingProxyType({
    hixl_native.E_TIMEOUT: (LLMStatusCode.LLM_TIMEOUT, "the transfer timed out"),
    hixl_native.E_CLOSED: (LLMStatusCode.LLM_LINK_FAILED, "the peer daemon closed the link"),
    hixl_native.E_REFUSED: (LLMStatusCode.LLM_PARAM_INVALID,
                            "the peer refused a range outside the memory the cluster registered"),
    hixl_native.E_IO: (LLMStatusCode.LLM_LINK_FAILED, "a data-plane socket failed"),
    hixl_native.E_PROTO: (LLMStatusCode.LLM_LINK_FAILED, "the data-plane protocol broke"),
    hixl_native.E_CANCELLED: (LLMStatusCode.LLM_LINK_FAILED, "the link was closed"),
    hixl_native.E_GONE: (LLMStatusCode.LLM_PARAM_INVALID, "the local cache's engine memory is "
                         "gone: it was unregistered, or its process exited"),
    # The bytes that arrived are not the bytes that were sent: damaged on the way
    # (a NIC, a switch, a relay), or the source changed while it moved.
    hixl_native.E_CHECKSUM: (LLMStatusCode.LLM_LINK_FAILED,
                             "the transfer's CRC-32C did not match: bytes changed between the "
                             "two memories (damaged on the network, or the source was written "
                             "while it moved); the destination's bytes cannot be trusted"),
})
"""Native status -> (status code, what happened)."""


def link_failure(status: int) -> tuple[LLMStatusCode, str]:
    """The status code and message of a data-link request that ended with
    native ``status`` (statuses not in :data:`LINK_STATUS`: ``LLM_FAILED``).

    Returns:
        ``(code, text)``; the text ends with ``(native status N)``.
    """
    code, text = LINK_STATUS.get(status, (LLMStatusCode.LLM_FAILED, "the transfer failed"))
    return code, f"{text} (native status {status})"


__all__ = ["LINK_STATUS", "link_failure"]
