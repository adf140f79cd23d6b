"""What a unary handler knows of its call, and how it is served both ways.

The servicers' unary handlers serve a call whichever way it came, over gRPC
or over a lane (``lane_server``), with the same results, errors and
LLMStatusCodes. A handler takes the request and a :class:`CallInfo` (what
it needs of the call: the session it belongs to; nothing of gRPC), and
fails by raising; ``rpc_errors.handler_error`` says what each failure
answers.

Decorated with :func:`unary`, ``servicer.Name`` is the handler's gRPC method
(what the generated ``add_*Servicer_to_server`` registers): it fills the
CallInfo from the call's metadata and ends a failed call with
``context.abort``. A lane runs the handler itself (:func:`lane_handler`) with
the CallInfo its connection is bound to, and answers a failure with a
``CallError`` frame.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import MethodType
from typing import Any, Generic, TypeVar, cast, overload

import grpc.aio

from hixl_wire.defaults import SESSION_METADATA_KEY

from .rpc_errors import abort_with, handler_error, report_failure

GrpcContext = grpc.aio.ServicerContext[Any, Any]
Servicer = TypeVar("Servicer")
Request = TypeVar("Request")
Reply = TypeVar("Reply")
# A handler as a lane runs it: the request and the call's CallInfo.
LaneHandler = Callable[[Any, "CallInfo"], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What a handler knows of its call, filled by gRPC (``call_info_of``) or a lane."""

    # The caller's session (gRPC: the call's metadata; the transfer lane: its
    # HELLO); None: the call names none (peer calls, which carry link tokens).
    session_id: str | None = None


NO_CALL_INFO = CallInfo()


def call_info_of(context: GrpcContext) -> CallInfo:
    """The CallInfo of a gRPC call."""
    for key, value in context.invocation_metadata() or ():
        if key == SESSION_METADATA_KEY:
            return CallInfo(str(value))
    return NO_CALL_INFO


class Unary(Generic[Servicer, Request, Reply]):
    """A servicer's unary handler (see the module docstring); built by :func:`unary`."""

    def __init__(self, handler: Callable[[Servicer, Request, CallInfo], Awaitable[Reply]]) -> None:
        self.handler = handler
        self.__name__ = name = handler.__name__
        self.__doc__ = handler.__doc__

        async def over_grpc(servicer: Servicer, request: Request, context: GrpcContext) -> Reply:
            call = call_info_of(context)
            try:
                return await handler(servicer, request, call)
            except Exception as exc:
                error = handler_error(name, exc, call.session_id)
                report_failure(servicer, name, error)
                await abort_with(context, error)

        self._over_grpc = over_grpc

    @overload
    def __get__(self, servicer: None, owner: type[Any] | None = None) -> Unary[
            Servicer, Request, Reply]: ...

    @overload
    def __get__(self, servicer: object,
                owner: type[Any] | None = None) -> Callable[[Request, GrpcContext],
                                                            Awaitable[Reply]]: ...

    def __get__(self, servicer: object, owner: type[Any] | None = None) -> Any:
        """On a servicer: the gRPC method; on its class: this object."""
        if servicer is None:
            return self
        return MethodType(self._over_grpc, servicer)

    def on_lane(self, servicer: Servicer) -> Callable[[Request, CallInfo], Awaitable[Reply]]:
        """The handler bound to ``servicer``, as a lane calls it."""
        return cast(Callable[[Request, CallInfo], Awaitable[Reply]],
                    MethodType(self.handler, servicer))


def unary(handler: Callable[[Servicer, Request, CallInfo], Awaitable[Reply]]
          ) -> Unary[Servicer, Request, Reply]:
    """Make ``handler`` (an ``async def`` of the servicer, the request and a
    CallInfo) a unary method served over gRPC and over the lanes."""
    return Unary(handler)


def lane_handler(servicer: object, method: str) -> LaneHandler:
    """How a lane runs ``servicer``'s handler of ``method``: a :func:`unary` one
    as it is written; any other method is taken to be a lane handler already
    (an ``async def`` of the request and a CallInfo)."""
    found = getattr(type(servicer), method, None)
    if isinstance(found, Unary):
        return found.on_lane(servicer)
    return cast(LaneHandler, getattr(servicer, method))
