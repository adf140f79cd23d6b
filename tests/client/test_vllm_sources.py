"""Which prefill workers a decode worker pulls from, what it pulls, and whom it
tells (``hixl_client.vllm._sources``; no vLLM needed). The bytes these ids move
are checked in tests/integration/test_kv_runs.py and with vLLM in tests/vllm."""

from __future__ import annotations

import pytest

from hixl_client import LLMException, LLMStatusCode
from hixl_client.vllm._kv_map import KvShape, run_ids
from hixl_client.vllm._params import (
    Load,
    RemoteBlocks,
    Settings,
    requests_message,
    requests_of,
)
from hixl_client.vllm._sources import Pull, Worker, pulls_of, tellers_of

HEADS, HEAD_SIZE = 4, 32  # the model's KV heads


def shape(block_size: int, ranks: int) -> KvShape:
    return KvShape(block_size, HEADS // ranks, HEAD_SIZE, 2)


def worker(rank: int = 0, ranks: int = 1, block_size: int = 32, family: str = "fam",
           layout: str = "L32") -> Worker:
    return Worker(layout, family, shape(block_size, ranks) if family else None, block_size,
                  rank, ranks)


def remote(ranks: int = 1, block_size: int = 32, family: str = "fam", layout: str = "L32",
           blocks: tuple[int, ...] = (7, 3, 9, 4)) -> RemoteBlocks:
    return RemoteBlocks("P", "req-1", blocks, 100, "127.0.0.1:1", tuple(range(10, 10 + ranks)),
                        layout, tuple(shape(block_size, ranks).to_list()) if family else (),
                        family)


def test_one_layout_and_split_pulls_whole_blocks_from_the_same_rank() -> None:
    here = worker(rank=1, ranks=2)
    # Tokens [64, 100): the decode side had the first two blocks cached.
    load = Load("req-1", (20, 21), remote(ranks=2), 64, 100)
    assert pulls_of(here, load) == [Pull(1, False, [9, 4], [20, 21])]
    assert tellers_of(here, load.remote) == {1: 1}


def test_another_block_size_pulls_runs_from_the_same_rank() -> None:
    here = worker(block_size=64, layout="L64")
    load = Load("req-1", (5, 6), remote(), 0, 100)
    [pull] = pulls_of(here, load)
    assert pull.runs and pull.rank == 0
    assert (pull.src, pull.dst) == run_ids(shape(32, 1), shape(64, 1), (7, 3, 9, 4), (5, 6),
                                           0, 100)


@pytest.mark.parametrize(("far_ranks", "ranks", "expected"), [
    (2, 1, [{0: 1, 1: 1}]),        # one decode worker pulls from both prefill workers
    (1, 2, [{0: 2}, {0: 2}]),      # both decode workers pull from the one prefill worker
    (4, 2, [{0: 1, 1: 1}, {2: 1, 3: 1}]),
])
def test_another_split_pulls_each_rank_from_those_that_hold_its_heads(
        far_ranks: int, ranks: int, expected: list[dict[int, int]]) -> None:
    far = remote(ranks=far_ranks)
    for rank in range(ranks):
        here = worker(rank=rank, ranks=ranks)
        pulls = pulls_of(here, Load("req-1", (5, 6, 8, 1), far, 0, 100))
        assert {pull.rank for pull in pulls} == set(expected[rank])
        assert all(pull.runs and len(pull.src) == len(pull.dst) for pull in pulls)
        # Every head of this rank comes from one pull, once.
        assert sum(len(pull.dst) for pull in pulls) == len(set().union(*(
            pull.dst for pull in pulls)))
        assert tellers_of(here, far) == expected[rank]


@pytest.mark.parametrize(("here", "far", "says"), [
    (worker(layout="L32"), remote(layout="other"), "another model, dtype or attention kernel"),
    (worker(block_size=64), remote(family="other"), "another model, dtype, KV head count"),
    (worker(block_size=64, family=""), remote(), "has no run view"),
    (worker(ranks=2), remote(ranks=1, family=""), "has no run view"),
])
def test_layouts_that_cannot_trade_kv_are_refused_saying_what_differs(
        here: Worker, far: RemoteBlocks, says: str) -> None:
    with pytest.raises(LLMException, match=says) as raised:
        pulls_of(here, Load("req-1", (1, 2, 3, 4), far, 0, 100))
    assert raised.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


def test_a_split_that_replicates_heads_is_refused() -> None:
    # Eight decode workers for four KV heads: vLLM would replicate them.
    here = Worker("L", "fam", KvShape(32, 1, HEAD_SIZE, 2), 32, 5, 8)
    with pytest.raises(LLMException, match="replicated"):
        pulls_of(here, Load("req-1", (1, 2, 3, 4), remote(ranks=1), 0, 100))


def test_done_messages_say_how_many_decode_workers_tell() -> None:
    requests = [("cmpl-a-0", 1), ("cmpl-b-0", 2), ("cmpl-c-0", 3)]
    assert requests_message(requests) == b"cmpl-a-0\ncmpl-b-0\t2\ncmpl-c-0\t3"
    assert requests_of(requests_message(requests)) == requests
    # An older decode instance's lines (no count), empty lines, a bad count.
    assert requests_of(b"x\ny\t2\n\nz\tjunk\nw\t0") == [("x", 1), ("y", 2), ("z", 1),
                                                           ("w", 1)]


def test_settings_refuse_an_unknown_mode_and_bad_bounds() -> None:
    settings = Settings.from_extra_config({"daemon": "unix:/x", "mode": "push",
                                           "push_timeout_ms": 5000})
    assert (settings.mode, settings.push_timeout_ms, settings.load_timeout_ms) == (
        "push", 5000, 10000)
    assert Settings.from_extra_config({"daemon": "unix:/x"}).mode == "pull"
    for extra, says in (({"mode": "stream"}, "mode must be one of"),
                        ({"push_timeout_ms": 0}, "push_timeout_ms must be"),
                        ({"push_timeout_ms": True}, "push_timeout_ms must be"),
                        ({"pushing": 1}, "unknown kv_connector_extra_config keys")):
        with pytest.raises(ValueError, match=says):
            Settings.from_extra_config({"daemon": "unix:/x", **extra})


def test_params_of_a_pushing_prefill_need_no_blocks() -> None:
    pushing = RemoteBlocks("P", "", (), 0, "127.0.0.1:1", (10,), "L32", (), "", "push", "t1")
    assert RemoteBlocks.from_params(pushing.to_params()) == pushing and pushing.pushes
    pulled = RemoteBlocks("P", "r", (), 0, "127.0.0.1:1", (10,), "L32")
    assert RemoteBlocks.from_params(pulled.to_params()) is None  # nothing to pull, no push
