"""Running the servicers' unary handlers for calls that arrive another way.

The lanes (``lane_server``) carry many calls over one connection, and run
each through the same handler as its unary gRPC twin, so that results,
errors and LLMStatusCodes are the same on every path. Those handlers
(wrapped by ``rpc_errors.handles_errors``) ask two things of their context:
the invocation metadata, and abort.
:class:`CallContext` provides both; its abort raises :class:`CallAborted`,
which the carrier turns into a ``CallError`` message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import grpc
import grpc.aio

from hixl_client._proto.hixl.v1 import common_pb2
from hixl_client.status import STATUS_METADATA_KEY, LLMStatusCode

Context = grpc.aio.ServicerContext[Any, Any]


class CallAborted(Exception):
    """What ``abort`` raises: the status the call ends with."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 trailing_metadata: Sequence[tuple[str, str]]) -> None:
        super().__init__(details)
        self.error = call_error(code, next((int(v) for k, v in trailing_metadata
                                            if k == STATUS_METADATA_KEY), 0), details)


class CallContext:
    """The part of grpc.aio.ServicerContext that the unary handlers use."""

    __slots__ = ("_metadata",)

    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Sequence[tuple[str, str]] = ()) -> None:
        raise CallAborted(code, details, trailing_metadata)

    def as_context(self) -> Context:
        """This object typed as the gRPC context the handlers declare."""
        return cast(Context, self)


def call_error(code: grpc.StatusCode, llm_status: int, message: str) -> common_pb2.CallError:
    return common_pb2.CallError(grpc_code=code.value[0], llm_status=llm_status, message=message)


def deadline_error() -> common_pb2.CallError:
    """The error of a call cancelled by its own deadline."""
    return call_error(grpc.StatusCode.DEADLINE_EXCEEDED, int(LLMStatusCode.LLM_TIMEOUT),
                      "the call's deadline passed")
