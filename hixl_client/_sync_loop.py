"""The private event loop behind ``hixl_client.sync``.

One daemon thread per process runs one event loop (uvloop when it can be
imported) for every blocking call of the facade. grpc.aio binds its channels
to a single loop per process, so the facade must never run the async client on
loops of its own callers: each blocking call submits a coroutine to this loop
with ``asyncio.run_coroutine_threadsafe`` and waits on the concurrent future.
The coroutine is created on the loop thread too, so the async objects are only
ever touched from there.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .status import LLMException, LLMStatusCode

__all__ = ["THREAD_NAME", "LoopThread", "call_method", "ensure_not_in_loop", "loop_thread", "run"]

THREAD_NAME = "hixl-sync-loop"

P = ParamSpec("P")
T = TypeVar("T")


def ensure_not_in_loop() -> None:
    """Refuse to block a thread that runs an event loop (it could never finish).

    Raises:
        RuntimeError: the calling thread is running an event loop, which
            includes the facade's own loop thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        "hixl_client.sync blocks the calling thread and cannot be called from a running "
        "event loop; in async code use the async API (`from hixl_client import ...`) and "
        "await its coroutines, or make the blocking call from a worker thread "
        "(asyncio.to_thread)")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


async def _invoke(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = fn(*args, **kwargs)
    # Only coroutines are awaited: a plain method may return an awaitable object
    # (the async CacheTask) that the caller wants as it is, not its outcome.
    if asyncio.iscoroutine(result):
        return await result
    return result


class LoopThread:
    """One event loop in a named daemon thread, started on first use.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str = THREAD_NAME) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread, or None before the first call."""
        return self._thread

    def loop(self) -> asyncio.AbstractEventLoop:
        """Return the running loop, starting its thread if there is none yet."""
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = _new_loop()
                thread = threading.Thread(target=_serve, args=(loop,), name=self._name,
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, fn: Callable[P, Coroutine[Any, Any, T]], /, *args: P.args,
            **kwargs: P.kwargs) -> T:
        """Run the coroutine ``fn(*args, **kwargs)`` on the loop thread and wait for it.

        Returns:
            What the coroutine returned.

        Raises:
            RuntimeError: called from a thread that runs an event loop.
            BaseException: whatever ``fn`` raised, unchanged.
        """
        result: T = self.call(fn, *args, **kwargs)
        return result

    def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(*args, **kwargs)`` on the loop thread and wait for the outcome.

        A coroutine it returns is awaited on the loop; any other result is
        returned as it is.

        Returns:
            The coroutine's result, or what ``fn`` returned when that is no coroutine.

        Raises:
            RuntimeError: called from a thread that runs an event loop.
            BaseException: whatever ``fn`` raised, unchanged.
        """
        ensure_not_in_loop()
        future = asyncio.run_coroutine_threadsafe(_invoke(fn, args, kwargs), self.loop())
        try:
            return future.result()
        except BaseException:
            # Interrupted while waiting (KeyboardInterrupt): stop the coroutine
            # rather than leave it running unobserved.
            if not future.done():
                future.cancel()
            raise

    def _forget(self) -> None:
        # A forked child has no loop thread; start a fresh one if it ever needs it.
        self._lock = threading.Lock()
        self._loop = None
        self._thread = None


_LOOP_THREAD = LoopThread()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_LOOP_THREAD._forget)


def loop_thread() -> LoopThread:
    """The process-wide loop thread shared by the whole facade."""
    return _LOOP_THREAD


def run(fn: Callable[P, Coroutine[Any, Any, T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn(*args, **kwargs)`` on the process-wide loop thread; see `LoopThread.run`."""
    return _LOOP_THREAD.run(fn, *args, **kwargs)


def call_method(obj: object, owner: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """Call the method ``name`` of an async object on the loop thread.

    A coroutine it returns is awaited there; any other result (such as an
    awaitable task) is returned as it is.

    Args:
        obj: the async object.
        owner: its public class name, for the error message.
        name: the method's name.
        *args: positional arguments, passed unchanged.
        **kwargs: keyword arguments, passed unchanged.

    Raises:
        RuntimeError: called from a thread that runs an event loop.
        LLMException: the async object has no such method in this release
            (``LLM_FEATURE_NOT_ENABLED``).
    """
    ensure_not_in_loop()
    method = getattr(obj, name, None)
    if method is None:
        raise LLMException(f"{owner}.{name} is not available in this release of hixl",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
    return _LOOP_THREAD.call(method, *args, **kwargs)
