"""What a link needs from a transport: the one seam every data path fits.

A transport moves planned byte ranges between memory of a local cluster and
the far end of one link. Three exist, each in a module of its own, and one
factory (``factory.open_transport``) picks one when the link is made:

* ``local.LocalTransport``: both clusters live in this daemon (memcpy);
* ``tcp.TcpTransport``: the far cluster lives in another daemon (the native
  multi-stream data plane);
* ``hccl.HcclTransport``: the far cluster lives in another daemon on an
  Ascend host (HCCL batches between device memories).

``fault.FaultTransport`` wraps any of them in tests. Nothing outside the
factory asks which transport a link has: the engine, the transfers and the
copier hold a ``Transport`` and call it, and whoever needs to know what a
link can do (the self-test, ``hixlctl doctor``) asks its capabilities
(`TransportInfo.capabilities`, or ``factory.capabilities_of`` for a name the
Admin status reported), never its name. Each transport translates its own
failures into ``LLMException`` with LLM-DataDist's status codes (through
``native_errors``); a range the far end refused raises ``RegionRefused``,
with nothing moved.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hixl_wire.status import LLMException, LLMStatusCode

__all__ = ["ONE_SIDED", "REACHES_HOST_MEMORY", "TCP_STREAMS", "InboundFacts", "InboundSide",
           "PeerHandler", "PeerScope", "Place", "PlainInbound", "Prepared", "Transport",
           "TransportInfo", "check_peer_calls"]

if TYPE_CHECKING:
    from ..memory.base import Memory
    from ..planning import Ranges
    from ..regions import Regions


@dataclass(frozen=True, slots=True)
class Place:
    """Where the far end's bytes are: a region of the far daemon's data server,
    or, for an end in this daemon, its memory."""

    region_id: int = 0
    memory: Memory | None = None


# What a transport can do (`TransportInfo.capabilities`), for whoever must
# know it rather than the transport's name:
REACHES_HOST_MEMORY = "reaches host memory"  # its far end may be host memory (a self-test)
# It has a one-sided data path; a link that runs another (its `data_path`)
# fell back to a slower one than the hardware offers.
ONE_SIDED = "one-sided"
# It moves bytes over TCP streams (``transfer.streams_per_link`` of them),
# through the loopback stack when the far daemon is on this host.
TCP_STREAMS = "tcp streams"


@dataclass(frozen=True, slots=True)
class TransportInfo:
    """A transport as the admin status shows it."""

    name: str
    streams: int = 0
    alive: bool = True
    # hccl: "one-sided" or "two-sided" (the fallback); "" for the others
    data_path: str = ""
    # Streams connected now; None: every stream while alive (the transport
    # keeps no connections of its own to lose).
    streams_up: int | None = None
    capabilities: frozenset[str] = frozenset()  # REACHES_HOST_MEMORY, ONE_SIDED, ...

    @property
    def connected(self) -> int:
        """Streams connected now."""
        if self.streams_up is not None:
            return self.streams_up
        return self.streams if self.alive else 0


class Prepared(Protocol):
    """One planned transfer, ready to be started again between other slots.

    ``prepare`` does once what every start of the same ranges would repeat
    (NIXL's prepared request handles, in the same spirit): a repeat adds the
    two slots' offsets, natively where the transport can.
    """

    def start(self, src_shift: int, dst_shift: int,
              timeout_ms: int) -> Awaitable[None] | None:
        """Start the ranges with every source offset shifted by ``src_shift`` and
        every destination offset by ``dst_shift``.

        Returns None when the bytes already landed (a small transfer alone in
        the daemon ends inside the call), else an awaitable that ends when
        they land. Raises, with nothing moved, when the link is down or the
        far end refused the ranges (``RegionRefused``).
        """


class Transport(Protocol):
    """Moves bytes between local memory and one far end."""

    @property
    def name(self) -> str:
        """``local``, ``tcp`` or ``hccl``: reported to the user, never switched on
        (``info().capabilities`` says what the transport can do)."""

    @property
    def alive(self) -> bool:
        """False once the transport knows the far end is unreachable."""

    def info(self) -> TransportInfo:
        """The transport as the admin status shows it."""

    async def read(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                   checksum: bool = False) -> None:
        """Move (far offset, local offset, length) ranges into ``local``.

        ``checksum``: the bytes carry a CRC-32C over the wire (the TCP transport;
        the others move nothing over a network and ignore it), and a transfer
        whose bytes arrive changed fails with ``LLM_LINK_FAILED``."""

    async def write(self, local: Memory, far: Place, ranges: Ranges, timeout_ms: int,
                    checksum: bool = False) -> None:
        """Move (local offset, far offset, length) ranges out of ``local``."""

    def prepare(self, writing: bool, local: Memory, far: Place, ranges: Ranges,
                nbytes: int, checksum: bool = False) -> Prepared:
        """Make ``read`` (or ``write``) of ``ranges`` repeatable between slots."""

    async def close(self) -> None:
        """Release the transport's connections; transfers in flight fail."""


class InboundSide(Protocol):
    """What a transport keeps on the linked daemon for one inbound link (HCCL
    keeps its half of the communicator); the other transports keep nothing."""

    @property
    def name(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    @property
    def data_path(self) -> str:
        """As `TransportInfo.data_path`."""
        ...

    async def close(self) -> None: ...


class PlainInbound:
    """The linked side of a link whose transport keeps nothing there (local, TCP:
    the data server checks each request against the link's token)."""

    alive = True
    data_path = ""

    def __init__(self, name: str) -> None:
        self.name = name

    async def close(self) -> None:
        return None


class InboundFacts(Protocol):
    """What a transport's peer handler knows of the inbound link a call names
    (``links.InboundLink``)."""

    @property
    def side(self) -> InboundSide: ...

    @property
    def dst_cluster_id(self) -> int: ...

    @property
    def identity(self) -> str: ...

    @property
    def may_write(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class PeerScope:
    """Where a transport's peer call runs: the inbound link its token names
    (None: no such link, or no longer) and the daemon's regions."""

    link: InboundFacts | None
    regions: Regions


# A Peer call a transport's linking side makes of the far daemon, answered by
# its inbound side there: the call's request message in, its reply out
# (``factory.PEER_HANDLERS`` holds every transport's, by Peer method name).
PeerHandler = Callable[[PeerScope, Any], Awaitable[Any]]


def check_peer_calls(transport: str, required: Sequence[str], daemon_id: str,
                     calls: Collection[str]) -> None:
    """Refuse a ``transport`` link to a daemon that does not serve every Peer call
    of ``required`` (the transport's ``peer_calls``; a daemon from before a call
    was added names none, see ``factory.check_peer_calls``).

    Raises:
        LLMException: ``LLM_LINK_FAILED``, naming the missing calls.
    """
    missing = [call for call in required if call not in calls]
    if missing:
        raise LLMException(
            f"daemon {daemon_id} lacks the Peer call{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} that {transport} links need; it runs an older hixl: "
            f"run the same hixl on both daemons",
            status_code=LLMStatusCode.LLM_LINK_FAILED)
