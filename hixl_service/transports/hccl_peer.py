"""HCCL's Peer calls, both ends: the linking daemon's HCCL link
(``hccl.HcclLink``) drives the inbound side of the link on the linked daemon
(``hccl_inbound.HcclInbound``).

`HcclPeer` makes the calls, as messages through the far daemon's
``PeerApi.transport_call``. ``HANDLERS`` maps each Peer method to its
handler on the far daemon (a ``base.PeerHandler``); the factory registers
them (``factory.PEER_HANDLERS``), and the Peer servicer and the peer lane
route those calls there by name without knowing what they do. Each handler
reads the request message, checks what the peer may ask, and builds the
reply message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import grpc

from hixl_wire._proto.hixl.v1 import peer_pb2
from hixl_wire.lane import Methods, message_method
from hixl_wire.status import LLMException, LLMStatusCode

from ..ascend.comms import CommSpec, RankInfo
from ..rpc_errors import CallRefused
from .base import InboundFacts, PeerHandler, PeerScope
from .hccl_channel import FarRegion, region_pairs
from .hccl_inbound import HcclInbound, hccl_side

if TYPE_CHECKING:
    from ..peer_api import PeerApi
    from ..regions import DeviceRegion

__all__ = ["HANDLERS", "LANE_METHODS", "LINK_CALLS", "MAX_TEARDOWN_WAIT_MS", "HcclPeer"]

# The Peer calls an hccl link needs of the far daemon beyond protocol 1's
# (issue 30: communicator creation, and the teardown of memory bound to a
# one-sided communicator). They did not bump PROTOCOL_VERSION, so that host
# links between daemons of either side of the change still work; instead each
# daemon names the Peer calls it serves in Hello (``peer_calls``) and an hccl
# daemon refuses a link, either way, to one lacking any of these
# (``HcclTransport.peer_calls``, checked by ``factory.check_peer_calls``).
LINK_CALLS = ("HcclReserve", "HcclTeardown", "HcclDestroy")

# A linking daemon's watch on an HCCL communicator (HcclTeardown) waits at most this.
MAX_TEARDOWN_WAIT_MS = 10_000


class HcclPeer:
    """The HCCL calls the linking side of a link makes of the far daemon."""

    def __init__(self, peer: PeerApi) -> None:
        self._call = peer.transport_call

    async def hccl_connect(self, token: int, spec: CommSpec, timeout_s: float) -> bool:
        """Join the link's communicator; True when the far CANN has the one-sided API."""
        request = peer_pb2.HcclConnectRequest(link_token=token, root_info=spec.root_info,
                                              rank_table=spec.rank_table,
                                              buffer_mb=spec.buffer_mb, comm_name=spec.name)
        reply = await self._call("HcclConnect", request, timeout_s)
        return bool(reply.one_sided)

    async def hccl_rank_info(self, token: int, timeout_s: float) -> RankInfo:
        """The far daemon's rank, for the link's rank table."""
        reply = await self._call("HcclRankInfo", peer_pb2.HcclRankInfoRequest(link_token=token),
                                 timeout_s)
        if not reply.super_pod:
            return RankInfo(reply.host_ip, reply.device_id, reply.device_ip, reply.soc_name)
        return RankInfo(reply.host_ip, reply.device_id, reply.device_ip, reply.soc_name,
                        reply.super_device_id, reply.super_pod_id)

    async def hccl_post(self, token: int, send: bool, region_id: int, ranges: bytes,
                        timeout_ms: int, timeout_s: float) -> None:
        """Two-sided: have the far side queue its half of a batch."""
        request = peer_pb2.HcclPostRequest(link_token=token, send=send, region_id=region_id,
                                           ranges=ranges, timeout_ms=timeout_ms)
        await self._call("HcclPost", request, timeout_s)

    async def hccl_prepare(self, token: int, timeout_ms: int, timeout_s: float) -> None:
        """Bind the far cluster's device memory to the link's communicator and prepare it."""
        request = peer_pb2.HcclPrepareRequest(link_token=token, timeout_ms=timeout_ms)
        await self._call("HcclPrepare", request, timeout_s)

    async def hccl_region(self, token: int, region_id: int, timeout_s: float) -> FarRegion:
        """Where a device region of the far cluster lies, for one-sided transfers."""
        request = peer_pb2.HcclRegionRequest(link_token=token, region_id=region_id)
        reply = await self._call("HcclRegion", request, timeout_s)
        return FarRegion(reply.address, reply.size, reply.writable, reply.bound)

    async def hccl_reserve(self, token: int, name: str, hold_ms: int, tie_break: int,
                           timeout_s: float) -> tuple[bool, int]:
        """Reserve the far daemon's communicator creation for ``name``: whether it was
        granted, and the far daemon's tie-break id (ascend/gate.py)."""
        request = peer_pb2.HcclReserveRequest(link_token=token, comm_name=name,
                                              hold_ms=hold_ms, tie_break=tie_break)
        reply = await self._call("HcclReserve", request, timeout_s)
        return bool(reply.granted), int(reply.tie_break)

    async def hccl_teardown(self, token: int, name: str, destroyed: bool, wait_ms: int,
                            timeout_s: float) -> bool:
        """Watch the far half of one-sided communicator ``name`` (True: destroy this
        half now), or (``destroyed``) say that this half is gone."""
        step = (peer_pb2.HcclTeardownRequest.STEP_DESTROYED if destroyed
                else peer_pb2.HcclTeardownRequest.STEP_WATCH)
        request = peer_pb2.HcclTeardownRequest(link_token=token, comm_name=name, step=step,
                                               wait_ms=wait_ms)
        reply = await self._call("HcclTeardown", request, timeout_s)
        return bool(reply.destroy)

    async def hccl_destroy(self, token: int, name: str, timeout_s: float) -> None:
        """Have the far daemon destroy its half of one-sided communicator ``name``
        (this daemon is about to free memory bound to it); returns once it did."""
        request = peer_pb2.HcclDestroyRequest(link_token=token, comm_name=name)
        await self._call("HcclDestroy", request, timeout_s)


def _comm_name(name: str) -> str:
    """An HCCL communicator name a peer may send (HCCL's limit: 128 bytes)."""
    if not name or len(name) >= 128 or not name.isascii():
        raise LLMException(f"not a communicator name: {name[:140]!r}",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    return name


def _side(scope: PeerScope) -> HcclInbound:
    return hccl_side(scope.link.side if scope.link is not None else None)


async def _connect(scope: PeerScope, request: peer_pb2.HcclConnectRequest
                   ) -> peer_pb2.HcclConnectReply:
    """Join the communicator the linking daemon created; whether this side can go
    one-sided."""
    spec = CommSpec(root_info=request.root_info, rank_table=request.rank_table,
                    buffer_mb=request.buffer_mb, name=request.comm_name)
    return peer_pb2.HcclConnectReply(one_sided=await _side(scope).connect(spec))


async def _rank_info(scope: PeerScope, request: peer_pb2.HcclRankInfoRequest
                     ) -> peer_pb2.HcclRank:
    """This daemon's rank, for the linking daemon's table."""
    info = await _side(scope).rank_info()
    super_pod = info.super_device_id is not None and info.super_pod_id is not None
    return peer_pb2.HcclRank(host_ip=info.host_ip, device_id=info.device_id,
                             device_ip=info.device_ip, soc_name=info.soc,
                             super_pod=super_pod, super_device_id=info.super_device_id or 0,
                             super_pod_id=info.super_pod_id or 0)


async def _prepare(scope: PeerScope, request: peer_pb2.HcclPrepareRequest
                   ) -> peer_pb2.HcclPrepareReply:
    """One-sided: bind the cluster's memory, prepare the link."""
    await _side(scope).prepare(max(1, request.timeout_ms))
    return peer_pb2.HcclPrepareReply()


async def _reserve(scope: PeerScope, request: peer_pb2.HcclReserveRequest
                   ) -> peer_pb2.HcclReserveReply:
    """The link's build: reserve this daemon's communicator creation."""
    name = _comm_name(request.comm_name)
    granted, tie_break = _side(scope).reserve(name, request.hold_ms)
    return peer_pb2.HcclReserveReply(granted=granted, tie_break=tie_break)


async def _teardown(scope: PeerScope, request: peer_pb2.HcclTeardownRequest
                    ) -> peer_pb2.HcclTeardownReply:
    """One-sided: the linking daemon's watch on its communicator (destroy: do it
    now), or its word that it did."""
    name = _comm_name(request.comm_name)
    side = _side(scope)
    if request.step == peer_pb2.HcclTeardownRequest.STEP_DESTROYED:
        side.destroyed(name)
        return peer_pb2.HcclTeardownReply(destroy=False)
    wait_ms = min(request.wait_ms, MAX_TEARDOWN_WAIT_MS)
    return peer_pb2.HcclTeardownReply(destroy=await side.watch(name, wait_ms))


async def _destroy(scope: PeerScope, request: peer_pb2.HcclDestroyRequest
                   ) -> peer_pb2.HcclDestroyReply:
    """One-sided: the linking daemon frees memory bound to the communicator;
    destroy this side's half first."""
    name = _comm_name(request.comm_name)
    await _side(scope).destroy_half(name)
    return peer_pb2.HcclDestroyReply()


def _device_region(scope: PeerScope, link: InboundFacts, region_id: int) -> DeviceRegion:
    region = scope.regions.device(region_id)
    if region is None or region.cluster_id != link.dst_cluster_id:
        raise LLMException(f"region {region_id} is not a device cache of cluster "
                           f"{link.dst_cluster_id} (freed, or never there)",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    return region


async def _region(scope: PeerScope, request: peer_pb2.HcclRegionRequest
                  ) -> peer_pb2.HcclRegionReply:
    """One-sided: where a device region lies, and whether the link may reach it
    (its memory was bound when the link was prepared)."""
    side = _side(scope)
    assert scope.link is not None
    region = _device_region(scope, scope.link, request.region_id)
    assert region.memory.device is not None
    return peer_pb2.HcclRegionReply(address=region.memory.device.address + region.offset,
                                    size=region.size, writable=region.writable,
                                    bound=side.bound(region.memory))


async def _post(scope: PeerScope, request: peer_pb2.HcclPostRequest) -> peer_pb2.HcclPostReply:
    """Two-sided: check the ranges, queue this side's half of the batch."""
    side = _side(scope)
    link = scope.link
    assert link is not None
    region_id, send = request.region_id, request.send
    region = _device_region(scope, link, region_id)
    if not send and not region.writable:
        raise LLMException(f"region {region_id} of cluster {link.dst_cluster_id} is not "
                           f"writable by linked peers",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    if not send and not link.may_write:
        raise CallRefused(f"peer {link.identity!r} may not write into cluster "
                          f"{link.dst_cluster_id} (security.allowed_peers)",
                          LLMStatusCode.LLM_PARAM_INVALID, grpc.StatusCode.PERMISSION_DENIED,
                          reason="write_denied")
    pairs = region_pairs(request.ranges, region_id, region.offset, region.size)
    await side.post(send, region.memory, pairs, max(1, request.timeout_ms))
    return peer_pb2.HcclPostReply()


HANDLERS: Mapping[str, PeerHandler] = {
    "HcclConnect": _connect,
    "HcclRankInfo": _rank_info,
    "HcclPrepare": _prepare,
    "HcclReserve": _reserve,
    "HcclTeardown": _teardown,
    "HcclDestroy": _destroy,
    "HcclRegion": _region,
    "HcclPost": _post,
}

# The calls of each transfer, carried by the peer lane (``factory.PEER_LANE_METHODS``
# merges them with the lane's own); the kinds are wire, fixed.
LANE_METHODS: Methods = {
    "HcclPost": message_method(3, peer_pb2.HcclPostRequest, peer_pb2.HcclPostReply),
    "HcclRegion": message_method(4, peer_pb2.HcclRegionRequest, peer_pb2.HcclRegionReply),
}
