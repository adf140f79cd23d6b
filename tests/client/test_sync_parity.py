"""The blocking facade against the async client: every public method and its
blocking twin take the same parameters.

httpcore generates its sync code from the async code and checks in CI that
the two agree (``unasync --check``). hixl writes the facade by hand, with
LLM-DataDist's names, so this test does the checking: parameters compare by
name, kind and default (annotations may differ: the facade spells
LLM-DataDist's types), and a public member found on one side only, or twins
that differ, must be listed below with the reason.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import hixl_client
from hixl_client import sync

TWINS: list[tuple[type, type]] = [
    (hixl_client.LLMDataDist, sync.LLMDataDist),
    (hixl_client.CacheManager, sync.CacheManager),
    (hixl_client.CacheTask, sync.CacheTask),
]

ASYNC_ONLY = {
    ("LLMDataDist", "role"): "the cluster's role as constructed; LLM-DataDist's LLMDataDist "
                             "has no such property, and the facade adds none",
    ("LLMDataDist", "daemon"): "the facade finds its daemon with set_daemon or $HIXL_DAEMON: "
                               "LLM-DataDist's constructor has no daemon=",
    ("LLMDataDist", "is_initialized"): "the facade keeps LLM-DataDist's one-instance rule "
                                       "(llm_engine_instance) instead",
    ("LLMDataDist", "link_transports"): "an async-only diagnostic of the links' transports",
    ("LLMDataDist", "wait_notifies"): "waits on the session's event stream; a blocking "
                                      "thread polls get_notifies",
    ("CacheTask", "cancel"): "asyncio task control; LLM-DataDist's CacheTask has "
                             "synchronize and get_results only",
    ("CacheTask", "done"): "asyncio task control, as cancel",
}
SYNC_ONLY = {
    ("LLMDataDist", "llm_engine_instance"): "LLM-DataDist's class attribute: one initialized "
                                            "instance per process (the async API allows "
                                            "several)",
}
DIFFERENT = {
    ("LLMDataDist", "__init__"): "LLM-DataDist's (role, cluster_id): the async client's "
                                 "keyword-only daemon= and transfer_lane= are not the "
                                 "facade's (set_daemon, $HIXL_TRANSFER_LANE)",
    ("CacheManager", "__init__"): "neither is made by users (LLMDataDist.cache_manager): "
                                  "the facade's wraps the async one",
    ("CacheTask", "__init__"): "LLM-DataDist's CacheTask(transfer_async_task) wraps the "
                               "async task; the async task is made from the configs",
}


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")} | {"__init__"}


def parameters(member: Any) -> list[tuple[str, str, Any]]:
    """Name, kind and default of each parameter, ``self`` included."""
    if isinstance(member, property):
        return [("property", "", None)]
    if not callable(member):
        return [("attribute", "", None)]
    return [(param.name, param.kind.name, param.default)
            for param in inspect.signature(member).parameters.values()]


def twin_members() -> list[tuple[type, type, str]]:
    return [(async_cls, sync_cls, name) for async_cls, sync_cls in TWINS
            for name in sorted(public(async_cls) & public(sync_cls))]


@pytest.mark.parametrize(("async_cls", "sync_cls", "name"), twin_members(),
                         ids=lambda value: value if isinstance(value, str) else value.__name__)
def test_a_blocking_twin_takes_the_async_parameters(async_cls: type, sync_cls: type,
                                                    name: str) -> None:
    async_params = parameters(inspect.getattr_static(async_cls, name))
    sync_params = parameters(inspect.getattr_static(sync_cls, name))
    if (sync_cls.__name__, name) in DIFFERENT:
        assert async_params != sync_params, f"{name}: no longer differs, unlist it"
    else:
        assert sync_params == async_params


@pytest.mark.parametrize(("async_cls", "sync_cls"), TWINS, ids=lambda cls: cls.__name__)
def test_every_public_member_has_a_twin_or_a_reason(async_cls: type, sync_cls: type) -> None:
    owner = sync_cls.__name__
    assert public(async_cls) - public(sync_cls) == {
        name for cls_name, name in ASYNC_ONLY if cls_name == owner}
    assert public(sync_cls) - public(async_cls) == {
        name for cls_name, name in SYNC_ONLY if cls_name == owner}


def test_the_lists_name_real_classes() -> None:
    owners = {sync_cls.__name__ for _, sync_cls in TWINS}
    for listed in (ASYNC_ONLY, SYNC_ONLY, DIFFERENT):
        assert {owner for owner, _ in listed} <= owners
