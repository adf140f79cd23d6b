"""The sd_notify protocol, without libsystemd.

systemd passes a datagram socket in ``$NOTIFY_SOCKET`` to a ``Type=notify``
service; the service sends newline-separated ``KEY=VALUE`` assignments such
as ``READY=1``, ``STOPPING=1`` or ``STATUS=...`` to it. A name starting with
``@`` is a socket in the abstract namespace.
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["notify"]

logger = logging.getLogger(__name__)

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"


def notify(state: str) -> bool:
    """Send ``state`` to the service manager, if there is one.

    Sending never blocks for long: the socket is a local datagram socket and
    systemd reads it from its own event loop.

    Args:
        state: One or more newline-separated assignments, e.g. ``"READY=1"``.

    Returns:
        True if the message was sent; False when ``$NOTIFY_SOCKET`` is unset
        (not running under systemd), names an unsupported socket family, or
        sending failed (logged as a warning).
    """
    target = os.environ.get(NOTIFY_SOCKET_ENV)
    if not target:
        return False
    if target.startswith("@"):
        address = "\0" + target[1:]
    elif target.startswith("/"):
        address = target
    else:
        # systemd may also hand out vsock:CID:PORT addresses (VMs); hixl does not run there.
        logger.warning("ignoring unsupported %s=%r", NOTIFY_SOCKET_ENV, target)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        logger.warning("cannot notify the service manager at %r: %s", target, exc)
        return False
    return True
