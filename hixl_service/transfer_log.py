"""How a transfer call ended, told once: the link's counters, and a WARNING per failure.

A failed transfer is logged here and nowhere else, whichever path served it
(gRPC, the transfer lane, a repeat by handle, answered at once or not), with
the request id both daemons log it under, the link, the status and the cause.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from hixl_wire.status import LLMException

from .interceptors import request_id
from .link_health import link_id

if TYPE_CHECKING:
    from .cluster import Cluster
    from .transfers import Outcome

logger = logging.getLogger(__name__)


def succeeded(cluster: Cluster, remote_cluster_id: int, outcome: Outcome) -> Outcome:
    link = cluster.links.get(remote_cluster_id)
    if link is not None:
        link.health.record(outcome.bytes)
    return outcome


def failed(cluster: Cluster, remote_cluster_id: int, call: str, exc: LLMException) -> None:
    link = cluster.links.get(remote_cluster_id)
    name = link.link_id if link is not None else link_id(cluster.cluster_id, remote_cluster_id)
    cause = str(exc)
    logger.warning("%s failed: request %s, link %s, %s: %s", call, request_id.get(), name,
                   exc.status_code.name, cause)
    if link is not None:
        link.health.record(0, f"{call} {exc.status_code.name}: {cause}")


async def settled(cluster: Cluster, remote_cluster_id: int, call: str,
                  work: Awaitable[Outcome]) -> Outcome:
    """Await a transfer and tell how it ended."""
    try:
        outcome = await work
    except LLMException as exc:
        failed(cluster, remote_cluster_id, call, exc)
        raise
    return succeeded(cluster, remote_cluster_id, outcome)
