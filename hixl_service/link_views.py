"""Links as the Admin status and ``QueryLinkStates`` show them (one builder for both)."""

from __future__ import annotations

from hixl_wire._proto.hixl.v1 import common_pb2

from .inbound import InboundLinks
from .links import InboundLink, OutboundLink


def outbound_health(link: OutboundLink) -> common_pb2.LinkHealth:
    health, info = link.health, link.info()
    return common_pb2.LinkHealth(
        link_id=health.link_id, state=health.state.value, since_unix_s=health.since,
        last_error=health.last_error, streams_up=info.connected, streams=info.streams,
        bytes=health.bytes, transfers=health.transfers,
        failed_transfers=health.failed_transfers)


def inbound_health(inbound: InboundLink, links: InboundLinks) -> common_pb2.LinkHealth:
    # The owner moves no bytes of its own on a link (the data server serves
    # the linker's requests): counters are the linking side's.
    health = inbound.health
    return common_pb2.LinkHealth(
        link_id=health.link_id, state=health.state.value, since_unix_s=health.since,
        last_error=health.last_error, lease_left_s=links.lease_left_s(inbound))
