"""The async tests run on the loop kind ``HIXL_TEST_LOOP`` selects (tests/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from tests.conftest import selected_loop_kind


def is_uvloop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    return isinstance(loop, uvloop.Loop)


def assert_selected_kind(loop: asyncio.AbstractEventLoop) -> None:
    kind = selected_loop_kind()
    if kind == "uvloop":
        assert is_uvloop(loop), f"{type(loop)!r} is not uvloop's loop"
    else:
        assert not is_uvloop(loop), f"{type(loop)!r} is uvloop's loop, not asyncio's"
        assert isinstance(loop, asyncio.BaseEventLoop)
        assert type(loop).__module__.startswith("asyncio."), type(loop)


@pytest_asyncio.fixture(scope="session")
async def session_fixture_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


@pytest.mark.asyncio
async def test_tests_run_on_the_selected_loop_kind(
        session_fixture_loop: asyncio.AbstractEventLoop) -> None:
    loop = asyncio.get_running_loop()
    assert_selected_kind(loop)
    # Session-scoped async fixtures (the shared daemons' clients) share it.
    assert session_fixture_loop is loop
