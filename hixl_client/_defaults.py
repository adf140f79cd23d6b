"""Where a client finds its local daemon, and whether it uses the transfer lane,
when nobody says otherwise (the default socket itself: ``hixl_wire.defaults``,
which the daemon shares)."""

from __future__ import annotations

import os

from hixl_wire.defaults import default_socket_path

DAEMON_ENV = "HIXL_DAEMON"
# "0" keeps every transfer call on gRPC (see docs/daemon.md, "The transfer lane").
TRANSFER_LANE_ENV = "HIXL_TRANSFER_LANE"


def default_daemon_target() -> str:
    """Return the gRPC target of the local daemon: ``$HIXL_DAEMON`` or the default socket."""
    return os.environ.get(DAEMON_ENV) or f"unix:{default_socket_path()}"


def transfer_lane_enabled() -> bool:
    """Whether clients use the daemon's transfer lane: yes unless ``$HIXL_TRANSFER_LANE=0``."""
    return os.environ.get(TRANSFER_LANE_ENV, "1").strip() not in ("0", "false", "no", "off")
