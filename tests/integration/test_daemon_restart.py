"""A client process outlives its local daemon: after the daemon restarts, a new
session starts at once, whatever the process's other channels to the old
daemon went through while it was down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import grpc.aio
import pytest

from hixl_client import LLMDataDist, LLMRole
from hixl_wire._proto.hixl.v1 import client_pb2, client_pb2_grpc

from .conftest import daemon_process, options

pytestmark = pytest.mark.asyncio

# Long enough for gRPC's reconnect backoff (1 s, then x1.6 per failure) to
# run past the restart when calls keep failing while the daemon is down.
DOWN_S = 3.0


async def _knock(stub: client_pb2_grpc.ClientStub, until: float) -> int:
    """Calls on a plain channel of this process while nothing listens (an old
    session's channel, as an engine has): each fails, and each failed connect
    lengthens the reconnect backoff of what gRPC shares between the process's
    channels to one target."""
    failures = 0
    while time.monotonic() < until:
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Finalize(client_pb2.FinalizeRequest(), timeout=1)
        failures += 1
        await asyncio.sleep(0.05)
    return failures


async def test_a_new_session_starts_right_after_the_daemon_restarts(
        next_cluster_id: Callable[[], int]) -> None:
    with daemon_process() as daemon:
        target = daemon.client_target
        first = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=target)
        await first.init(options())
        await asyncio.to_thread(daemon.kill)
        async with grpc.aio.insecure_channel(target) as old_channel:
            stub = client_pb2_grpc.ClientStub(old_channel)
            assert await _knock(stub, time.monotonic() + DOWN_S) > 0
            await asyncio.to_thread(daemon.start)
            assert daemon.client_target == target  # the same socket, a new daemon
            second = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=target)
            await second.init(options())  # at once, no retry
            await second.finalize()
        await first.finalize()  # its daemon is gone: a no-op, not a hang
