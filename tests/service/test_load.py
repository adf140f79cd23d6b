"""A transfer waits inline only when nothing else is under way (``load``, ``links``)."""

from __future__ import annotations

import asyncio

import pytest

from hixl_service.completions import CompletionDispatcher
from hixl_service.load import TransferLoad


@pytest.mark.asyncio
async def test_the_dispatcher_is_idle_only_while_no_other_transfer_is_under_way() -> None:
    load = TransferLoad()
    dispatcher = CompletionDispatcher(asyncio.get_running_loop(), load)
    try:
        assert dispatcher.idle
        load.begin()  # the asking call's own
        assert dispatcher.idle
        load.begin()  # another call, read but maybe not started
        assert not dispatcher.idle
        load.end()
        assert dispatcher.idle
        request_id, _ = dispatcher.expect()  # a native request awaiting its completion
        assert not dispatcher.idle
        dispatcher.forget(request_id)
        assert dispatcher.idle
        load.end()
        assert load.running == 0
    finally:
        dispatcher.close()
