"""A link's state machine and counters, kept on both daemons of the link.

States (docs/daemon.md, "Link states"):

* ``connecting``: the link handshakes (Hello, data streams), at first or
  again after its far daemon restarted;
* ``up``: heartbeats are answered and every data stream is connected;
* ``degraded``: some data streams were lost and are being reopened, or
  heartbeats go unanswered, but for less than ``links.down_after_s``;
* ``down``: the far daemon answered nothing for ``links.down_after_s`` (or
  it dropped the link); transfers fail with ``LLM_LINK_FAILED`` until it
  answers again, and ``link_clusters`` replaces the link;
* ``closed``: unlinked, finalized or reaped; the end.

Every transition is logged once, with the link's id, which is the same on
both daemons: ``<linking cluster>-><linked cluster>``.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


class LinkState(enum.Enum):
    CONNECTING = "connecting"
    UP = "up"
    DEGRADED = "degraded"
    DOWN = "down"
    CLOSED = "closed"


# Transitions that are news to an operator go to WARNING, recoveries to INFO.
_WARNED = (LinkState.DEGRADED, LinkState.DOWN)


def link_id(src_cluster_id: int, dst_cluster_id: int) -> str:
    """The id both daemons log a link under."""
    return f"{src_cluster_id}->{dst_cluster_id}"


@dataclass
class LinkHealth:
    """One side's view of one link: its state since when, why, and its counters."""

    link_id: str
    state: LinkState = LinkState.CONNECTING
    since: float = field(default_factory=time.time)  # wall clock: shown to operators
    last_error: str = ""
    bytes: int = 0
    transfers: int = 0
    failed_transfers: int = 0
    # Told every state entered (the daemon's counters of transitions, for /metrics).
    on_change: Callable[[LinkState], None] | None = field(default=None, repr=False,
                                                          compare=False)

    def move_to(self, state: LinkState, why: str = "") -> bool:
        """Enter ``state`` (a no-op if already there, except that ``why`` is kept);
        True when the state changed. ``closed`` is final."""
        if self.state is LinkState.CLOSED:
            return False
        if why and state is not LinkState.UP:
            self.last_error = why
        if state is self.state:
            return False
        previous, self.state, self.since = self.state, state, time.time()
        if self.on_change is not None:
            self.on_change(state)
        level = logging.WARNING if state in _WARNED else logging.INFO
        logger.log(level, "link %s: %s -> %s%s", self.link_id, previous.value, state.value,
                   f" ({why})" if why else "")
        return True

    def record(self, moved: int, error: str = "") -> None:
        """Count one ended transfer: ``moved`` bytes, or the failure ``error``."""
        self.transfers += 1
        if error:
            self.failed_transfers += 1
            self.last_error = error
        else:
            self.bytes += moved
