"""Where a client and its local daemon meet when nobody says otherwise.

The daemon and the client both derive the default socket path from here, so
a newcomer can start `hixl-serviced` and `LLMDataDist(...)` with no
configuration at all and have them meet. A call names its session by the
metadata entry :data:`SESSION_METADATA_KEY` (over gRPC; a lane connection is
bound to its session by its HELLO frame instead).

Only the standard library: the daemon's ``--check`` imports this without gRPC.
"""

from __future__ import annotations

import os
from pathlib import Path

SOCKET_NAME = "hixl.sock"
SESSION_METADATA_KEY = "hixl-session"
"""Call metadata key whose value is the caller's session id (from Attach)."""


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
