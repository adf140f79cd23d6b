"""The sd_notify protocol, without libsystemd.

systemd passes a datagram socket in ``$NOTIFY_SOCKET`` to a ``Type=notify``
service; the service sends newline-separated ``KEY=VALUE`` assignments such
as ``READY=1``, ``STOPPING=1`` or ``STATUS=...`` to it. A name starting with
``@`` is a socket in the abstract namespace.

With ``WatchdogSec=`` in the unit, systemd also sets ``$WATCHDOG_USEC`` and
kills the service (SIGABRT) unless it sends ``WATCHDOG=1`` at least that
often. :func:`keep_alive` sends those pings, and ``STATUS=`` summaries, from
a task on the daemon's event loop: a loop wedged by a blocking call stops
the pings, and systemd restarts the daemon.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

__all__ = ["keep_alive", "monotonic_usec", "notify", "watchdog_interval"]

logger = logging.getLogger(__name__)

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
# Without a watchdog, STATUS= is refreshed this often (it is what `systemctl
# status` shows, so a few seconds old is fine).
STATUS_PERIOD_S = 5.0


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


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, as ``MONOTONIC_USEC=`` of ``RELOADING=1`` wants."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings, or None when systemd expects none.

    Half of ``$WATCHDOG_USEC``, as sd_watchdog_enabled(3) advises, so a ping
    that is a little late still arrives in time. None when the variable is
    unset or zero, or when ``$WATCHDOG_PID`` names another process (the
    variables were inherited from a parent that systemd watches).
    """
    environ = os.environ if environ is None else environ
    usec = environ.get("WATCHDOG_USEC", "").strip()
    if not usec:
        return None
    pid = environ.get("WATCHDOG_PID", "").strip()
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        logger.warning("ignoring WATCHDOG_USEC=%r: not a number of microseconds", usec)
        return None
    return value / 2e6 if value > 0 else None


async def keep_alive(summary: Callable[[], str], interval_s: float | None) -> None:
    """Tell systemd, until cancelled, that the loop runs and what the daemon does.

    Wakes every ``interval_s`` seconds, or :data:`STATUS_PERIOD_S` if that is
    shorter or there is no watchdog; each time it sends ``WATCHDOG=1`` (when
    ``interval_s`` is not None; a ping sooner than needed is harmless) and
    ``STATUS=<summary()>`` if the summary changed. Returns at once when not
    run by a service manager (``$NOTIFY_SOCKET`` unset).
    """
    if not os.environ.get(NOTIFY_SOCKET_ENV):
        return
    period = STATUS_PERIOD_S if interval_s is None else min(interval_s, STATUS_PERIOD_S)
    last_status = ""
    while True:
        lines = ["WATCHDOG=1"] if interval_s is not None else []
        try:
            status = summary()
        except Exception:  # a bug in the summary must not stop the pings
            logger.exception("cannot summarize the daemon's state for systemd")
            status = last_status
        if status != last_status:
            lines.append(f"STATUS={status}")
            last_status = status
        if lines:
            notify("\n".join(lines))
        await asyncio.sleep(period)
