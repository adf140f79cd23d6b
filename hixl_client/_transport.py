"""The only module that touches gRPC stubs on the client side.

It opens the channel to the local daemon, keeps the session's Attach stream
and opens the session's carriers (``_carrier``): :class:`GrpcCarrier`, which
adds the session metadata to every call and turns ``AioRpcError`` into
``LLMException`` with the daemon's exact LLMStatusCode, and the daemon's
transfer lane (``hixl_wire.lane.Lane``) when it offers one, with the
session's rings for repeats (``_ring_repeats``) when the daemon has them.
Control calls go over gRPC; transfer calls go over the lane when it is open,
else over gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Any

import grpc
import grpc.aio
import hixl_native

from hixl_wire._proto.hixl.v1 import client_pb2, client_pb2_grpc
from hixl_wire.defaults import SESSION_METADATA_KEY
from hixl_wire.lane import CLIENT_METHODS, MAX_BODY, Lane
from hixl_wire.status import error_from_rpc

from . import _tracing
from ._carrier import Carrier
from ._defaults import transfer_lane_enabled
from ._ring_repeats import RingRepeats
from ._spin import ReplySpin
from ._thread_lane import ThreadLane
from .notify import NotifyDesc, NotifyInbox
from .status import LLMException, LLMStatusCode

logger = logging.getLogger(__name__)

# Every call ends by its own timeout plus a fixed margin, even when the local
# daemon stops answering (hung, SIGSTOPped): the daemon bounds its work by the
# call's timeout and answers a late call itself (LLM_TIMEOUT), and the
# margin only covers a daemon that answers nothing at all. Over gRPC the
# deadline is the timeout plus CALL_MARGIN_S; on the transfer lane the frame
# carries the same deadline and the client gives up LANE_GRACE_S after it,
# within one watchdog tick (hixl_wire.lane.WATCHDOG_TICK_S). docs/client.md,
# "Bounded calls", lists each call's timeout.
CALL_MARGIN_S = 0.5
# A session's channel has a connection of its own: by default gRPC shares one
# between a process's channels to a target, with its reconnect backoff, so
# after the local daemon restarted, a new session failed at once (UNAVAILABLE)
# while an old session's failed calls kept that backoff running.
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)
LANE_GRACE_S = 0.2
# Calls without a timeout of LLM-DataDist's own (attach, init's control part,
# allocate, register, deallocate, copies, switch_role, finalize): this bound,
# or the cluster option CONTROL_TIMEOUT_OPTION (milliseconds).
CONTROL_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_OPTION = "hixl.ControlCallTimeout"
# Idle thread lanes kept for the next layer-wise tasks (one per task in flight).
IDLE_THREAD_LANES = 4


class GrpcCarrier:
    """The :class:`~hixl_client._carrier.Carrier` over the session's gRPC channel.

    Every call carries the session's metadata (and its traceparent when
    traced); ``AioRpcError`` becomes LLMException. Once the session ended
    (:attr:`lost`) every call fails at once.

    Args:
        stub: the channel's Client stub.
        session_id: the session the calls belong to.
        what: names the daemon in error messages.
    """

    def __init__(self, stub: client_pb2_grpc.ClientStub, session_id: str, what: str) -> None:
        self._stub = stub
        self._methods: dict[str, Any] = {}
        # Built once: grpc.aio copies call metadata, so one object serves every call.
        self._metadata = grpc.aio.Metadata((SESSION_METADATA_KEY, session_id))
        self._what = what
        self.lost: str | None = None  # why the session ended

    @property
    def is_open(self) -> bool:
        return self.lost is None

    def begin(self, method: str, request: Any, timeout_s: float, *,
              trace: bytes = b"") -> Coroutine[Any, Any, Any]:
        stub_method = self._methods.get(method)
        if stub_method is None:
            stub_method = self._methods[method] = getattr(self._stub, method)
        return self._call(stub_method, request, timeout_s, trace)

    async def _call(self, method: Any, request: Any, timeout_s: float, trace: bytes) -> Any:
        if self.lost is not None:
            raise LLMException(f"{self._what}: {self.lost}", status_code=LLMStatusCode.LLM_FAILED)
        metadata = self._metadata if not trace else grpc.aio.Metadata(
            *self._metadata, (_tracing.TRACEPARENT, trace.decode()))
        try:
            return await method(request, timeout=timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            raise error_from_rpc(err, self._what) from None

    def close(self) -> None:
        if self.lost is None:
            self.lost = "the session was closed"


class DaemonConnection:
    """A channel to the local daemon plus the session that ties us to it."""

    def __init__(self, target: str, client_name: str = "",
                 transfer_lane: bool | None = None,
                 control_timeout_s: float = CONTROL_TIMEOUT_S) -> None:
        self.target = target
        # The timeout of calls that have none of their own (see CONTROL_TIMEOUT_S).
        self.control_timeout_s = control_timeout_s
        self._use_lane = transfer_lane_enabled() if transfer_lane is None else transfer_lane
        # The session's carriers (None until open): control calls go over _grpc;
        # transfer calls over the lane when it is open, else over _grpc_transfers
        # (_grpc, traced when tracing is on, as the lane is).
        self._grpc: GrpcCarrier | None = None
        self._grpc_transfers: Carrier | None = None
        self.lane: Carrier | None = None
        self.rings: RingRepeats | None = None  # repeats' shortcut, with the lane only
        self._idle_thread_lanes: list[ThreadLane] = []
        self._client_name = client_name or os.path.basename(sys.argv[0] or "python")
        self._channel: grpc.aio.Channel | None = None
        self._stub: client_pb2_grpc.ClientStub | None = None
        self._attach: Any = None
        self._watch: asyncio.Task[None] | None = None
        self.session_id = ""
        self.daemon_id = ""
        self.fd_socket = ""
        self.lane_socket = ""
        self.peer_address = ""
        # What linked clusters sent this session (SessionEvent.notify).
        self.notifies = NotifyInbox()

    @property
    def stub(self) -> client_pb2_grpc.ClientStub:
        """The channel's stub, for the streaming calls (unary calls: :meth:`call`)."""
        assert self._stub is not None, "not connected"
        return self._stub

    @property
    def what(self) -> str:
        """Names the daemon in error messages."""
        return f"hixl daemon at {self.target}"

    @property
    def lost(self) -> str | None:
        """Why the session ended (None while it lasts)."""
        return None if self._grpc is None else self._grpc.lost

    async def open(self) -> None:
        """Connect and attach; the session lives until close() or process exit."""
        self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        self._stub = client_pb2_grpc.ClientStub(self._channel)
        self._attach = self._stub.Attach(
            client_pb2.AttachRequest(client_pid=os.getpid(), client_name=self._client_name),
            wait_for_ready=False)
        attach_s = self.control_timeout_s + CALL_MARGIN_S
        try:
            event = await asyncio.wait_for(self._attach.read(), attach_s)
        except grpc.aio.AioRpcError as err:
            await self.close()
            raise error_from_rpc(err, self.what) from None
        except asyncio.TimeoutError:
            await self.close()
            raise LLMException(f"{self.what} did not answer within "
                               f"{attach_s:g} s",
                               status_code=LLMStatusCode.LLM_TIMEOUT) from None
        if event is grpc.aio.EOF or not event.HasField("attached"):
            await self.close()
            raise LLMException(f"{self.what} refused the session",
                               status_code=LLMStatusCode.LLM_FAILED)
        self.session_id = event.attached.session_id
        self._grpc = GrpcCarrier(self._stub, self.session_id, self.what)
        self._grpc_transfers = _tracing.traced(self._grpc)
        self.daemon_id = event.attached.daemon_id
        self.fd_socket = event.attached.fd_socket
        self.lane_socket = event.attached.lane_socket
        self.peer_address = event.attached.peer_address
        self._watch = asyncio.get_running_loop().create_task(self._watch_session(self._attach))
        if self._use_lane and event.attached.lane_socket:
            await self._open_lane(event.attached.lane_socket)
        # Traced, every call goes over the lane, where the daemon's handlers
        # continue the trace; the rings carry no trace context.
        if self.lane is not None and not _tracing.ENABLED:
            await self._open_rings(event.attached.lane_socket)

    async def _open_lane(self, path: str) -> None:
        # Without the lane every call still works over gRPC, only slower: say
        # so in the log rather than failing the session.
        try:
            self.lane = _tracing.traced(await Lane.connect_unix(path, CLIENT_METHODS, self.what,
                                                        self.control_timeout_s,
                                                        hello=self.session_id.encode(),
                                                        grace_s=LANE_GRACE_S,
                                                        spin=ReplySpin()))
        except (OSError, asyncio.TimeoutError, LLMException) as exc:
            logger.warning("hixl daemon at %s: transfer lane %s unavailable, transfers use "
                           "gRPC: %s", self.target, path, exc or type(exc).__name__)

    async def _open_rings(self, path: str) -> None:
        # Without rings repeats go over the lane as before; an older daemon
        # answers their HELLO as a lane's, without them.
        try:
            self.rings = await RingRepeats.connect(path, self.session_id, self.what,
                                                   self.control_timeout_s, LANE_GRACE_S)
        except (OSError, ValueError, asyncio.TimeoutError, hixl_native.NativeError,
                LLMException) as exc:
            logger.info("hixl daemon at %s: no rings for repeats, they use the transfer "
                        "lane: %s", self.target, exc or type(exc).__name__)

    async def _watch_session(self, attach: Any) -> None:
        # The stream carries the notifications linked clusters send; it ends
        # when the daemon goes away, which makes every later call fail clearly.
        assert self._grpc is not None
        try:
            while (event := await attach.read()) is not grpc.aio.EOF:
                if event.HasField("notify"):
                    notify = event.notify
                    await self.notifies.put(NotifyDesc(notify.name, notify.message,
                                                       notify.src_cluster_id))
            self._grpc.lost = "the daemon closed the session"
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                self._grpc.lost = f"the session ended: {err.code().name}"

    def call(self, name: str, request: Any,
             timeout: float | None = None) -> Coroutine[Any, Any, Any]:
        """Run the unary control call ``name`` (the daemon's method) over gRPC;
        failures raise LLMException.

        ``timeout``: the call's own timeout in seconds (None: the control
        timeout); the call ends CALL_MARGIN_S after it at the latest."""
        assert self._grpc is not None, "not connected"
        timeout_s = self.control_timeout_s if timeout is None else timeout
        return self._grpc.begin(name, request, timeout_s + CALL_MARGIN_S)

    @property
    def has_lane(self) -> bool:
        """Transfer calls go over the transfer lane (open, and the session alive)."""
        lane, grpc_carrier = self.lane, self._grpc
        return (lane is not None and lane.is_open and grpc_carrier is not None
                and grpc_carrier.lost is None)

    async def transfer(self, name: str, request: Any, timeout: float | None = None) -> Any:
        """Run transfer call ``name`` on the lane when it is open, else over gRPC;
        ``timeout`` as for :meth:`call`."""
        return await self.begin_transfer(name, request, timeout)

    def begin_transfer(self, name: str, request: Any,
                       timeout: float | None = None) -> Coroutine[Any, Any, Any]:
        """:meth:`transfer` as a coroutine to await later; on the lane the call
        is already sent when this returns (see :meth:`Lane.begin`)."""
        timeout_s = self.control_timeout_s if timeout is None else timeout
        return self.transfer_carrier(request).begin(name, request, timeout_s + CALL_MARGIN_S)

    def transfer_carrier(self, request: Any) -> Carrier:
        """The carrier of a transfer call with ``request``: the lane when it is
        open and the request fits one frame, else gRPC."""
        lane = self.lane
        if lane is not None and self.has_lane and request.ByteSize() <= MAX_BODY:
            return lane
        assert self._grpc_transfers is not None, "not connected"
        return self._grpc_transfers

    async def take_thread_lane(self) -> ThreadLane | None:
        """A lane connection of the session for one worker thread to write
        (``_thread_lane``): an idle one, else a new one; None without the
        transfer lane, or when the daemon refuses another connection (logged)."""
        while self._idle_thread_lanes:
            lane = self._idle_thread_lanes.pop()
            if lane.is_open:
                return lane
        if not self.has_lane:
            return None
        try:
            return await ThreadLane.connect_unix(self.lane_socket, CLIENT_METHODS, self.what,
                                                 self.control_timeout_s,
                                                 self.session_id.encode(), LANE_GRACE_S)
        except (OSError, asyncio.TimeoutError, LLMException) as exc:
            logger.warning("hixl daemon at %s: no thread lane, layers are sent from the "
                           "event loop: %s", self.target, exc or type(exc).__name__)
            return None

    def give_back_thread_lane(self, lane: ThreadLane) -> None:
        """Keep a thread lane for the next task (or close it: broken, or enough idle)."""
        if lane.is_open and self.has_lane and len(self._idle_thread_lanes) < IDLE_THREAD_LANES:
            self._idle_thread_lanes.append(lane)
        else:
            lane.close()

    async def close(self) -> None:
        """End the session: the daemon frees what it allocated for us."""
        for idle in self._idle_thread_lanes:
            idle.close()
        self._idle_thread_lanes.clear()
        if self.rings is not None:
            self.rings.close()
            self.rings = None
        if self.lane is not None:
            self.lane.close()
            self.lane = None
        if self._attach is not None:
            self._attach.cancel()
            self._attach = None
        if self._watch is not None:
            self._watch.cancel()
            try:
                await self._watch
            except asyncio.CancelledError:
                pass
            self._watch = None
        if self._grpc is not None:
            self._grpc.close()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

