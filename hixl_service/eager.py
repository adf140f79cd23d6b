"""Start a coroutine at once, and give it a task only if it has to wait.

A small transfer alone in the daemon often runs to its end without waiting
for anything: a local copy of up to 1 MiB on the loop's thread, or a TCP
read whose reply is awaited inline. For such a call a task is pure cost:
creating it, a loop iteration before its first step, its done callbacks and
a deadline timer were about a third of the daemon's CPU for a tiny local
pull. So a lane call that arrives alone runs its first step in the
frame's own callback, as Python 3.12's eager tasks do (this module does it
on 3.10 and 3.11 too); only if it suspends does it continue in a task,
which then looks like any other.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
from collections.abc import Coroutine, Generator
from typing import Any


def start_eagerly(loop: asyncio.AbstractEventLoop,
                  coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` up to its first wait; None if it ended there, else its task.

    The coroutine runs in a copy of the current context, as a task's would, and
    the task continues in that context. It must not raise (the lane's calls
    answer their own errors).

    Before Python 3.12 the first step runs with no current task, so code that
    a lane call may run before its first wait must not need one:
    ``asyncio.timeout`` does (use ``asyncio.wait_for``), futures do not.
    """
    if sys.version_info >= (3, 12):
        task = asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
        return None if task.done() else task
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration:
        return None
    return context.run(loop.create_task, _resume(coro, waiting_on))


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None],
            waiting_on: Any) -> Generator[Any, Any, None]:
    """Drive ``coro`` from where its eager step stopped: hand its future to the
    task, then pass results and exceptions (a cancel included) through."""
    while True:
        try:
            sent = yield waiting_on
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # the task throws what its future raised, or a cancel
            try:
                waiting_on = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                waiting_on = coro.send(sent)
            except StopIteration:
                return
