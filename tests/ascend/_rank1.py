"""Rank 1 of a two-rank communicator in a child process (``tests.ascend._peer rank1``).

The shim creates communicators one at a time per process, as CANN asks, so
a test's rank 0 (in the test process) and rank 1 cannot both be created in
one process; `Rank1` drives the other one over its stdin and stdout, every
answer awaited within a bound.
"""

from __future__ import annotations

import selectors
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.ascend.conftest import child_env

ANSWER_S = 20.0


class Rank1:
    """The child: started with the root info or rank table, joined once
    `wait_ready` returns (after rank 0's creation, which blocks until then)."""

    def __init__(self, double_dir: Path, *, root_info: bytes | None = None,
                 rank_table: str | None = None, **env: str) -> None:
        how, blob = ("root", root_info.hex()) if root_info is not None else \
            ("table", (rank_table or "").encode().hex())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.ascend._peer", "rank1", str(double_dir), how, blob],
            env=child_env(**env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )

    def _line(self, timeout_s: float = ANSWER_S) -> str:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                raise TimeoutError(f"rank 1 did not answer within {timeout_s} s")
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"rank 1 exited: {err}")
        return line.strip()

    def wait_ready(self) -> None:
        assert self._line() == "ready"

    def link_up(self, comm: Any, stream: Any) -> None:
        """Run a communicator's first operation on both ranks at once: HCCL builds
        the links inside it and blocks until the peer makes its own (the double
        does the same), so rank 0's first call must not wait for rank 1's answer."""
        from hixl_native import _ascend

        from tests.ascend._peer import WARM_BYTES

        self.tell("warm")
        item = _ascend.SendRecvItem
        with comm.device.malloc(2 * WARM_BYTES) as scratch:
            comm.batch_send_recv([item.send(scratch, 0, WARM_BYTES, 1),
                                  item.recv(scratch, WARM_BYTES, WARM_BYTES, 1)], stream)
            stream.synchronize(timeout_ms=10_000)
        assert self.answer() == "ok"

    def ask(self, command: str) -> str:
        """Send one command and return its answer."""
        self.tell(command)
        return self.answer()

    def tell(self, command: str) -> None:
        """Send one command whose answer `answer` awaits later (for calls that
        block until rank 0 makes its own, such as a prepare)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def answer(self) -> str:
        """The answer to the oldest command not yet answered (bounded)."""
        return self._line()

    def close(self) -> None:
        """Tear rank 1 down (bounded; killed if it does not finish)."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            deadline = time.monotonic() + ANSWER_S
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    self.proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    continue
            if self.proc.poll() is None:
                self.proc.kill()
        self.proc.wait(timeout=ANSWER_S)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> Rank1:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
