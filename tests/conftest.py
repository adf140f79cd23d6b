"""Shared fixtures: real daemons, unique cluster ids, loop-error guard.

The kind of event loop the async tests (and async fixtures) run on is chosen
by ``HIXL_TEST_LOOP``: ``uvloop`` (the default, as for the daemon) or
``asyncio`` (asyncio's default loop). grpc.aio binds to one loop per process,
so one kind serves a whole pytest process; ``scripts/test.sh`` runs the async
tests a second time, in a second process, on the other kind. The choice is
made through pytest-asyncio's ``pytest_asyncio_loop_factories`` hook (the
``event_loop_policy`` fixture is deprecated); with a single factory the test
ids stay as they are. Daemons started as subprocesses choose their own loop
(``server.use_uvloop``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import pytest
import pytest_asyncio

_cluster_ids = itertools.count(1000)

LOOP_ENV = "HIXL_TEST_LOOP"
LOOP_KINDS = ("uvloop", "asyncio")


def selected_loop_kind() -> str:
    """The loop kind this process runs its async tests on (``HIXL_TEST_LOOP``)."""
    kind = os.environ.get(LOOP_ENV, "").strip().lower() or "uvloop"
    if kind not in LOOP_KINDS:
        raise pytest.UsageError(f"{LOOP_ENV}={kind!r}: expected one of {', '.join(LOOP_KINDS)}")
    return kind


def _loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if kind == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        raise pytest.UsageError(f"{LOOP_ENV}=uvloop but uvloop is not installed "
                                f"(set {LOOP_ENV}=asyncio)") from exc
    return uvloop.new_event_loop


# One mapping, one factory object: every item gets the same (hidden) parameter,
# so the session-scoped runner, and its loop, are made once.
_loop_factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {}


def pytest_configure(config: pytest.Config) -> None:
    kind = selected_loop_kind()
    _loop_factories.clear()
    _loop_factories[kind] = _loop_factory(kind)


def pytest_asyncio_loop_factories(config: pytest.Config,
                                  item: pytest.Item) -> Mapping[str, Any]:
    return _loop_factories


def pytest_report_header(config: pytest.Config) -> str:
    return f"hixl test loop: {selected_loop_kind()} ({LOOP_ENV})"


@pytest.fixture
def next_cluster_id() -> Iterator[Any]:
    """Cluster ids unique across the session, so tests can share daemons."""
    yield lambda: next(_cluster_ids)


@pytest_asyncio.fixture(autouse=True)
async def fail_on_loop_errors() -> AsyncIterator[None]:
    """Fail a test whose event loop reported an unhandled error (asyncpg, uvloop)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield
    loop.set_exception_handler(previous)
    assert not errors, f"the event loop reported errors: {errors}"
