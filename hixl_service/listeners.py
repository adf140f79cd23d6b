"""Listeners the daemon can trust: where its sockets live and what it exposes.

Checks that refuse a start (``StartRefused``, exit 2), each naming what to
change (``check_start`` makes the ones that need nothing created yet, first):

* the socket directory is created 0750 and must be owned by the daemon's
  user with no group or other write, so nobody else can replace a socket in
  it (a squatted or loosened directory is refused, never "fixed");
* unix sockets are bound under a umask that gives them 0660 from the start,
  never chmod'ed after they listen;
* a client socket that another daemon serves is refused before anything is
  created; a leftover of a killed daemon is removed;
* a TCP port that is already served is refused at once (SO_REUSEPORT is off
  on every listener), before anything else of the daemon listens;
* a TCP listener off loopback that nothing authenticates is refused (peers:
  ``security.mode = "none"``; clients on TCP: any mode but "mtls")
  unless ``security.insecure = true`` (Redis' protected mode, in spirit).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from .config import DaemonConfig

logger = logging.getLogger(__name__)

SOCKET_DIR_MODE = 0o750
# Bound sockets get 0660: the daemon's user and group may connect.
_SOCKET_UMASK = 0o117


class StartRefused(Exception):
    """The daemon must not start as configured; the message says why and what to change."""


def prepare_socket_dir(directory: Path) -> None:
    """Create the socket directory (0750) or verify the one that exists."""
    try:
        directory.mkdir(mode=SOCKET_DIR_MODE, parents=True)
    except FileExistsError:
        pass
    else:
        os.chmod(directory, SOCKET_DIR_MODE)  # mkdir's mode is filtered by the umask
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise StartRefused(f"socket directory {directory} is not a directory")
    if info.st_uid != os.geteuid():
        raise StartRefused(f"socket directory {directory} is owned by uid {info.st_uid}, not "
                           f"by the daemon's user (uid {os.geteuid()}): another user could "
                           f"replace its sockets; remove it or choose another "
                           f"server.client_socket")
    if info.st_mode & 0o022:
        raise StartRefused(f"socket directory {directory} has mode "
                           f"{stat.S_IMODE(info.st_mode):04o}: group or others may write "
                           f"in it; chmod it to 0750 (or stricter)")


def check_start(config: DaemonConfig) -> None:
    """The refusals a start can make before it creates anything (exit 2 at once):
    unauthenticated exposure, and a client socket another daemon serves."""
    check_exposure(config)
    if config.server.client_socket is not None:
        clear_stale_socket(config.server.client_socket)


def clear_stale_socket(path: Path) -> None:
    """Remove a leftover socket of a killed daemon; refuse a live one."""
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: a leftover of a killed daemon
    else:
        raise StartRefused(f"another daemon already listens on {path}")
    finally:
        probe.close()


@contextlib.contextmanager
def socket_umask() -> Iterator[None]:
    """Bind unix sockets inside this block: they are created 0660."""
    old = os.umask(_SOCKET_UMASK)
    try:
        yield
    finally:
        os.umask(old)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a literal address or a name) reaches only this host."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(str(entry[4][0]).split("%")[0]).is_loopback
                               for entry in found)


def check_exposure(config: DaemonConfig) -> None:
    """Refuse listeners off loopback that nothing authenticates, unless
    ``security.insecure``; warn at every start when it allows them.

    Peers authenticate with mode "token" or "mtls"; clients on ``client_tcp``
    only with "mtls" (a token-mode daemon would link on their behalf with its
    own secret)."""
    security = config.security
    exposed: list[str] = []
    if security.mode == "none" and not is_loopback(config.server.peer_host):
        exposed.append(f"{config.server.peer_host} (peers)")
    if config.server.client_tcp and security.mode != "mtls":
        host = config.server.client_tcp.rsplit(":", 1)[0]
        if not is_loopback(host):
            exposed.append(f"{config.server.client_tcp} (clients)")
    if not exposed:
        return
    if not security.insecure:
        raise StartRefused(
            f"listening on {', '.join(exposed)}, not loopback, with security.mode = "
            f"\"{security.mode}\" would let anyone who reaches it read and overwrite caches: "
            f"set security.mode to \"mtls\" (clients on TCP need it) or \"token\" "
            f"(docs/security.md), or security.insecure = true to accept that")
    logger.warning("security.insecure: listening on %s with security.mode = \"%s\"; anyone "
                   "who reaches these ports can read and overwrite caches",
                   ", ".join(exposed), security.mode)


def refuse_busy_port(what: str, address: str, error: BaseException) -> StartRefused:
    """The refusal of a listener that could not bind ``address``."""
    return StartRefused(f"cannot listen on {address} for {what} ({error}); is another daemon "
                        f"serving it? Ports are never shared")


def unlink_all(paths: Iterable[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
