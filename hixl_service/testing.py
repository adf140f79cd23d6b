"""Real hixl daemons as subprocesses, for tests.

:class:`DaemonProcess` runs ``python -m hixl_service`` in a private temporary
directory with its own client socket, ephemeral peer and data ports, a ready
file and a log file, and waits until the daemon reports that it listens.
:func:`start_daemon` does the same from async code without blocking the loop.

The daemon writes its ready file atomically once it listens, as one JSON
object::

    {"pid": 1234, "client_target": "unix:/tmp/hixl-x/hixl.sock",
     "peer_address": "127.0.0.1:40123", "data_address": "127.0.0.1:40124",
     "daemon_id": "9f0c..."}

This module imports only the standard library at import time, so test
collection stays cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["READY_FIELDS", "DaemonProcess", "package_roots", "shareable_bytes_mapped",
           "start_daemon", "unused_port"]

# Field name -> type of the daemon's ready record.
READY_FIELDS: Mapping[str, type] = {
    "pid": int,
    "client_target": str,
    "peer_address": str,
    "data_address": str,
    "daemon_id": str,
}
_SECTIONS = ("server", "pool", "transfer", "ascend", "logging", "security", "limits",
             "metrics", "tracing", "links")
_POLL_S = 0.02
_LOG_TAIL_BYTES = 4000
_MAX_SOCKET_PATH = 100
# Inherited variables that would reconfigure or misdirect the child daemon.
_SCRUBBED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                 "LISTEN_FDNAMES")


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is in the stopped state (Linux /proc)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # nothing left to stop
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", encoding="ascii") as stat:
                # The state follows the command name, which is in parentheses.
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue  # the thread ended meanwhile
        if state not in ("T", "t"):
            return False
    return True


class DaemonProcess:
    """One hixl daemon running as a child process.

    Overrides are keyword arguments, either a whole section
    (``pool={"max_bytes": "64MiB"}``) or one field (``pool__max_bytes=64 << 20``);
    both may be mixed and later ones win. ``None`` means "unset" (for example
    ``server__client_socket=None`` with ``server__client_tcp="127.0.0.1:0"``).
    The TOML file is written at construction, so :attr:`config_path` can be
    read before :meth:`start`.

    Example:
        ``with DaemonProcess(pool__max_bytes="64MiB") as daemon: ...``

    Args:
        env: Extra environment variables for the daemon. The test process's
            ``HIXL_<SECTION>*`` config variables and ``NOTIFY_SOCKET`` are not
            inherited.
        user: Run the daemon as this uid (and gid), e.g. 65534 from a test
            run as root; its directory is given to that user.

        netns: Run the daemon in this network namespace (``ip netns exec``,
            root only); its unix sockets stay reachable from the test process.
        **overrides: Config overrides, as described above.

    Raises:
        TypeError: An override names no config section.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None, user: int | None = None,
                 netns: str | None = None,
                 **overrides: Any) -> None:
        sections = _merge_overrides(overrides)
        self._tmpdir = _make_tmpdir()
        # Run the daemon as another user (a test run as root): it owns its directory.
        self._user = user
        if user is not None:
            os.chown(self._tmpdir, user, user)
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmpdir, ignore_errors=True)
        server = sections["server"]
        server.setdefault("client_socket", str(self._tmpdir / "hixl.sock"))
        server.setdefault("ready_file", str(self._tmpdir / "ready.json"))
        self._settings = sections
        self._ready_path = Path(server["ready_file"])
        self._config_path = self._tmpdir / "hixl.toml"
        self._log_path = self._tmpdir / "daemon.log"
        self._env = _child_env(env)
        self._netns = netns

        from hixl_service.config import dump_toml  # keeps this module's import cheap

        self._config_path.write_text(dump_toml(sections), encoding="utf-8")
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready: dict[str, Any] | None = None
        self._paused = False

    # -- configuration and state -------------------------------------------------

    @property
    def settings(self) -> Mapping[str, Mapping[str, Any]]:
        """The sections written to the config file (after defaults and overrides)."""
        return self._settings

    @property
    def config_path(self) -> Path:
        """The generated TOML file."""
        return self._config_path

    @property
    def log_path(self) -> Path:
        """The file receiving the daemon's stdout and stderr."""
        return self._log_path

    @property
    def tmpdir(self) -> Path:
        """The private directory (removed by :meth:`close`)."""
        return self._tmpdir

    @property
    def ready(self) -> Mapping[str, Any]:
        """The ready record of the running daemon.

        Raises:
            RuntimeError: The daemon has not been started.
        """
        if self._ready is None:
            raise RuntimeError("the daemon has not been started")
        return self._ready

    @property
    def pid(self) -> int:
        """Process id of the daemon."""
        return int(self.ready["pid"])

    @property
    def client_target(self) -> str:
        """gRPC target clients dial, e.g. ``unix:/tmp/hixl-x/hixl.sock``."""
        return str(self.ready["client_target"])

    @property
    def peer_address(self) -> str:
        """``host:port`` of the peer gRPC server."""
        return str(self.ready["peer_address"])

    @property
    def data_address(self) -> str:
        """``host:port`` of the native data plane."""
        return str(self.ready["data_address"])

    @property
    def daemon_id(self) -> str:
        """Hex id the daemon chose for itself."""
        return str(self.ready["daemon_id"])

    @property
    def returncode(self) -> int | None:
        """Exit code once the daemon exited (negative: killed by that signal), else None."""
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, limit: int = _LOG_TAIL_BYTES) -> str:
        """Return the last ``limit`` bytes of the daemon's log, decoded."""
        try:
            with self._log_path.open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - limit))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    # -- lifecycle -----------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> Self:
        """Start the daemon and wait until its ready file appears.

        A stopped daemon may be started again, with the same config.

        Args:
            timeout: Seconds to wait for readiness.

        Returns:
            ``self``.

        Raises:
            RuntimeError: The daemon is already running, exited before it was
                ready (the message holds its log tail), wrote a bad ready
                record, or :meth:`close` was called meanwhile.
            TimeoutError: Not ready in time; the daemon has been killed.
        """
        with self._lock:
            if self._closing.is_set():
                raise RuntimeError("the daemon has been closed")
            if self._proc is not None and self._proc.poll() is None:
                raise RuntimeError("the daemon is already running")
            self._ready = None
            self._paused = False
            self._ready_path.unlink(missing_ok=True)
            with self._log_path.open("ab") as log:
                proc = subprocess.Popen(
                    self._command(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._tmpdir,
                    env=self._env,
                )
            self._proc = proc
        try:
            self._ready = self._wait_ready(proc, timeout)
        except BaseException:
            self._kill_and_reap(proc)
            raise
        return self

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the daemon with SIGTERM, or SIGKILL after ``timeout`` seconds.

        Args:
            timeout: Seconds to wait for a clean exit.

        Returns:
            The exit code (negative: killed by that signal), or ``None`` if the
            daemon was never started.
        """
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            if self._paused:
                proc.send_signal(signal.SIGCONT)
                self._paused = False
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        return self._kill_and_reap(proc)

    def kill(self) -> int | None:
        """Kill the daemon with SIGKILL and reap it.

        Returns:
            The exit code, or ``None`` if the daemon was never started.
        """
        return None if self._proc is None else self._kill_and_reap(self._proc)

    def pause(self, timeout_s: float = 5.0) -> None:
        """Freeze the daemon (SIGSTOP), e.g. to make its peers time out.

        Returns once every thread of the daemon has stopped: the signal takes
        effect on a thread only when it next enters the kernel, so a busy
        thread could otherwise still answer a request sent right after.
        """
        self._signal(signal.SIGSTOP)
        self._paused = True
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while not _all_threads_stopped(self._proc.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not stop within {timeout_s} s of SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        """Let a paused daemon continue (SIGCONT)."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def close(self) -> None:
        """Stop the daemon if it runs and remove the temporary directory.

        Safe to call more than once, and from another thread while
        :meth:`start` waits (which then fails).
        """
        self._closing.set()
        with self._lock:
            self.stop()
        self._finalizer()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "not started" if self._proc is None else f"pid {self._proc.pid}"
        return f"<DaemonProcess {state} in {self._tmpdir}>"

    # -- internals -----------------------------------------------------------------

    def _command(self) -> list[str]:
        command = [sys.executable, "-m", "hixl_service", "--config", str(self._config_path)]
        if self._user is not None:
            # setpriv (util-linux) drops to the user with no capabilities left.
            command = ["setpriv", f"--reuid={self._user}", f"--regid={self._user}",
                       "--clear-groups", "--inh-caps=-all", *command]
        # ip execs the daemon in place: the child's pid stays the daemon's.
        return ["ip", "netns", "exec", self._netns, *command] if self._netns else command

    def _signal(self, signum: int) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("the daemon is not running")
        self._proc.send_signal(signum)

    def _kill_and_reap(self, proc: subprocess.Popen[bytes]) -> int:
        if proc.poll() is None:
            proc.kill()
        self._paused = False
        return proc.wait()

    def _wait_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            record = self._read_ready()
            if record is not None:
                return _check_ready(record, proc.pid)
            code = proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"the daemon exited with code {code} before it was ready; "
                    f"log tail:\n{self.log_tail()}"
                )
            if self._closing.is_set():
                raise RuntimeError("the daemon was closed while starting")
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"the daemon was not ready within {timeout} s; log tail:\n{self.log_tail()}"
                )
            time.sleep(_POLL_S)

    def _read_ready(self) -> object:
        try:
            text = self._ready_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RuntimeError(
                f"the ready file is not JSON ({exc}); the daemon must write it atomically "
                f"(temporary file, then os.replace): {text[:200]!r}"
            ) from exc
        return record


@contextlib.asynccontextmanager
async def start_daemon(
    *, start_timeout: float = 15.0, env: Mapping[str, str] | None = None, **overrides: Any
) -> AsyncIterator[DaemonProcess]:
    """Run a :class:`DaemonProcess` for the duration of an ``async with`` block.

    Starting and stopping run in worker threads, so the event loop keeps
    serving other tasks meanwhile.

    Args:
        start_timeout: Seconds to wait for readiness.
        env: Extra environment variables for the daemon.
        **overrides: Config overrides, as for :class:`DaemonProcess`.

    Yields:
        The ready daemon; it is stopped and its directory removed on exit.
    """
    daemon = await asyncio.to_thread(lambda: DaemonProcess(env=env, **overrides))
    try:
        await asyncio.to_thread(daemon.start, start_timeout)
        yield daemon
    finally:
        await asyncio.shield(asyncio.to_thread(daemon.close))


def shareable_bytes_mapped(pid: int) -> int:
    """Bytes of clients' shareable buffers (the memfds hixl_client names
    ``hixl-shareable``) that process ``pid`` maps: what a daemon reaches
    directly rather than through cross-memory calls."""
    total = 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if "memfd:hixl-shareable" in line:
            low, high = (int(bound, 16) for bound in line.split()[0].split("-"))
            total += high - low
    return total


_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_PORTS_BELOW_EPHEMERAL = 8192
_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def unused_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` for a server a test starts on a fixed port.

    Ports come from just below the kernel's ephemeral range, which the kernel
    never picks for a socket bound to port 0: the daemons and clients a test
    starts meanwhile cannot take it between this call and the server's bind
    (a port picked by binding port 0 and closing again could be). Each is free
    when handed out and never handed out twice by this process; the start is
    random, so concurrent test processes rarely meet.

    Raises:
        RuntimeError: no free port is left in that band.
    """
    import random
    import socket

    try:
        with open(_EPHEMERAL_RANGE) as text:
            first_ephemeral = int(text.read().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32768  # Linux's default
    low = max(1024, first_ephemeral - _PORTS_BELOW_EPHEMERAL)
    band = first_ephemeral - low
    start = random.randrange(band)
    with _ports_lock:
        for step in range(band):
            port = low + (start + step) % band
            if port in _handed_out:
                continue
            with socket.socket() as probe:
                try:
                    probe.bind((host, port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port on {host} in {low}-{first_ephemeral - 1}")


def _merge_overrides(overrides: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    sections: dict[str, dict[str, Any]] = {
        "server": {"peer_host": "127.0.0.1", "peer_port": 0, "data_port": 0},
        "pool": {"populate": False},
    }
    for key, value in overrides.items():
        section, sep, field = key.partition("__")
        if section not in _SECTIONS or (sep and not field):
            raise TypeError(
                f"unexpected override {key!r}: use a section ({', '.join(_SECTIONS)}) "
                "or section__field"
            )
        target = sections.setdefault(section, {})
        if sep:
            target[field] = value
        elif isinstance(value, Mapping):
            target.update(value)
        else:
            raise TypeError(f"override {key!r} must be a mapping of fields, got {value!r}")
    return {name: sections[name] for name in _SECTIONS if name in sections}


def _make_tmpdir() -> Path:
    tmpdir = Path(tempfile.mkdtemp(prefix="hixl-"))
    if len(os.fsencode(tmpdir / "hixl.sock")) > _MAX_SOCKET_PATH:
        # A long $TMPDIR would overflow sun_path; /tmp is short everywhere.
        os.rmdir(tmpdir)
        tmpdir = Path(tempfile.mkdtemp(prefix="hixl-", dir="/tmp"))
    return tmpdir


def package_roots() -> list[str]:
    """Where this process imports hixl's packages from: a daemon it starts must
    import the same."""
    roots: list[str] = []
    for name in ("hixl_service", "hixl_client", "hixl_wire", "hixl_native"):
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            root = str(Path(location).resolve().parent)
            if root not in roots:
                roots.append(root)
    return roots


def _child_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    # The test's own HIXL_<SECTION>__* settings would beat the generated file.
    config_prefixes = tuple(f"HIXL_{section.upper()}" for section in _SECTIONS)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.upper().startswith(config_prefixes) and key not in _SCRUBBED_ENV
    }
    # The child must import the same packages as this process, whatever its cwd.
    roots = package_roots()
    if env.get("PYTHONPATH"):
        roots.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(roots)
    env.update(extra or {})
    return env


def _check_ready(record: object, pid: int) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise RuntimeError(f"bad ready record {record!r}: not a JSON object")
    problems = [
        f"{name} should be {kind.__name__}"
        for name, kind in READY_FIELDS.items()
        if not isinstance(record.get(name), kind) or isinstance(record.get(name), bool)
    ]
    if not problems and record["pid"] != pid:
        problems.append(f"pid is {record['pid']}, the child is {pid}")
    if problems:
        raise RuntimeError(f"bad ready record {record!r}: {'; '.join(problems)}")
    return record
