"""Where a client finds its local daemon when nobody says otherwise.

The daemon and the client both derive the default socket path from here, so
a newcomer can start `hixl-serviced` and `LLMDataDist(...)` with no
configuration at all and have them meet.
"""

from __future__ import annotations

import os
from pathlib import Path

DAEMON_ENV = "HIXL_DAEMON"
# "0" keeps every transfer call on gRPC (see README, "The transfer lane").
TRANSFER_LANE_ENV = "HIXL_TRANSFER_LANE"
SOCKET_NAME = "hixl.sock"


def default_runtime_dir() -> Path:
    """Return the directory that holds the daemon's sockets.

    systemd's ``RUNTIME_DIRECTORY`` wins, then ``$XDG_RUNTIME_DIR/hixl``, then
    ``/run/hixl`` for root, then a per-user directory under ``/tmp``.
    """
    systemd_dir = os.environ.get("RUNTIME_DIRECTORY")
    if systemd_dir:
        return Path(systemd_dir.split(":")[0])
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "hixl"
    if os.geteuid() == 0:
        return Path("/run/hixl")
    return Path(f"/tmp/hixl-{os.geteuid()}")


def default_socket_path() -> Path:
    """Return the unix socket path the daemon listens on by default."""
    return default_runtime_dir() / SOCKET_NAME


def default_daemon_target() -> str:
    """Return the gRPC target of the local daemon: ``$HIXL_DAEMON`` or the default socket."""
    return os.environ.get(DAEMON_ENV) or f"unix:{default_socket_path()}"


def transfer_lane_enabled() -> bool:
    """Whether clients use the daemon's transfer lane: yes unless ``$HIXL_TRANSFER_LANE=0``."""
    return os.environ.get(TRANSFER_LANE_ENV, "1").strip() not in ("0", "false", "no", "off")
