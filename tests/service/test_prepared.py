"""prepared: a repeat by handle starts the transfer its shape prepared between other
slots, and whatever no longer holds (a slot out of range, a far region gone, the
local cache freed, the link gone, another checksum) falls back to the full call,
with its result or its error (in-memory wire and far daemon: tests/service/fakes.py)."""

from __future__ import annotations

import asyncio

import pytest

from hixl_service import prepared
from hixl_service.cluster import Cluster
from hixl_service.peer_api import BlocksRef, IdRef, KeyRef
from hixl_service.registry import CacheEntry, KeySpec
from hixl_service.repeats import Repeat
from hixl_service.transfers import Outcome, PullSpec, PushSpec, pull, push
from hixl_wire._proto.hixl.v1.client_pb2 import CHECKSUM_DEFAULT
from hixl_wire.status import LLMException, LLMStatusCode

from .fakes import (
    BATCH,
    FAR,
    InMemoryDaemon,
    MemoryTransport,
    Pair,
    fill,
    linked,
    same_slot,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")



def pull_spec(src_cache_id: int, src_slot: int, dst_cache_id: int, dst_slot: int) -> PullSpec:
    return PullSpec(src=IdRef(FAR, src_cache_id, src_slot), dst_cache_id=dst_cache_id,
                    batch_index=dst_slot, size=-1, src_tensor_indices=[],
                    dst_tensor_indices=[], tensor_num_per_layer=2)


class Shaped:
    """A pull between two caches whose shape got a repeat handle."""

    def __init__(self, pair: Pair, puller: Cluster, src: CacheEntry, dst: CacheEntry,
                 repeat: Repeat) -> None:
        self.near, self.far = pair
        self.puller, self.src, self.dst, self.repeat = puller, src, dst, repeat

    @property
    def transport(self) -> MemoryTransport:
        transport = self.puller.links[FAR].transport
        assert isinstance(transport, MemoryTransport)
        return transport

    def resolves(self) -> int:
        return self.near.network.peer(self.far.address).count("resolve")


async def _shaped(pair: Pair) -> Shaped:
    near, far = pair
    puller, owner, _ = await linked(pair)
    src, dst = far.cache(owner), near.cache(puller)
    fill(src, seed=11)
    spec = pull_spec(src.cache_id, 0, dst.cache_id, 0)
    handle = prepared.repeat_handle(puller, spec, await pull(puller, spec), CHECKSUM_DEFAULT)
    assert handle
    repeat = puller.repeats.get(handle, push=False)
    assert repeat.found is not None
    return Shaped(pair, puller, src, dst, repeat)


def _move_region(far: InMemoryDaemon, entry: CacheEntry) -> None:
    """Give a far cache a new region (the old one's id is never reused)."""
    far.data_server.unregister_region(entry.region_id)
    entry.region_id = far.regions.add(entry.memory, entry.extent_offset, entry.extent_size,
                                      FAR, False)


async def test_only_pulls_and_pushes_by_cache_id_have_a_shape() -> None:
    by_id = pull_spec(3, 1, 5, 2)
    shape = prepared.shape_of(by_id, CHECKSUM_DEFAULT)
    assert shape is not None and not shape.push
    assert (shape.remote_cluster_id, shape.remote_cache_id, shape.local_cache_id) == (FAR, 3, 5)
    assert prepared.shape_of(pull_spec(3, 0, 5, 0), CHECKSUM_DEFAULT) == shape  # slots aside
    by_key = PullSpec(src=KeyRef(FAR, KeySpec(1, 0)), dst_cache_id=5, batch_index=0, size=-1,
                      src_tensor_indices=[], dst_tensor_indices=[], tensor_num_per_layer=2)
    blocks = PullSpec(src=BlocksRef(FAR, 0), dst_cache_id=5, batch_index=0, size=-1,
                      src_tensor_indices=[], dst_tensor_indices=[], tensor_num_per_layer=2,
                      blocks=True, src_blocks=[0], dst_blocks=[1])
    assert prepared.shape_of(by_key, CHECKSUM_DEFAULT) is None
    assert prepared.shape_of(blocks, CHECKSUM_DEFAULT) is None
    pushed = prepared.shape_of(PushSpec(dst=IdRef(FAR, 3, 0), src_cache_id=5, src_batch_index=1,
                                        src_tensor_indices=[], dst_tensor_indices=[],
                                        tensor_num_per_layer=2), CHECKSUM_DEFAULT)
    assert pushed is not None and pushed.push and pushed != shape


async def test_a_repeat_moves_other_slots_without_resolving_or_planning_again(pair) -> None:
    shaped = await _shaped(pair)
    requests = len(shaped.transport.requests)
    outcome = await prepared.again(shaped.puller, shaped.repeat, 3, 1, checksum=False)
    assert outcome.bytes == 2 * 256 and outcome.transport == "memory"
    assert same_slot(shaped.src, 3, shaped.dst, 1)
    assert shaped.puller.repeats.repeated == 1 and shaped.resolves() == 1
    assert len(shaped.transport.requests) == requests + 1
    # The template shifted by the two slots' offsets, as the planner plans them.
    sent = shaped.transport.requests[-1].ranges
    assert (sent[:, 0] % shaped.src.stride == 0).all()
    assert same_slot(shaped.src, 2, shaped.dst, 2) is False
    await prepared.again(shaped.puller, shaped.repeat, 2, 2, checksum=False)
    assert same_slot(shaped.src, 2, shaped.dst, 2)


async def test_a_repeat_ends_at_once_or_returns_what_to_await(pair) -> None:
    shaped = await _shaped(pair)
    done = prepared.again_at_once(shaped.puller, shaped.repeat, 1, 3, checksum=False)
    assert isinstance(done, Outcome) and same_slot(shaped.src, 1, shaped.dst, 3)
    shaped.transport.hold()
    moving = prepared.again_at_once(shaped.puller, shaped.repeat, 2, 0, checksum=False)
    assert moving is not None and not isinstance(moving, Outcome)
    waiting = asyncio.ensure_future(moving)
    await shaped.transport.in_flight.wait()
    assert not same_slot(shaped.src, 2, shaped.dst, 0)
    shaped.transport.release()
    outcome = await waiting
    assert outcome.bytes == 2 * 256 and same_slot(shaped.src, 2, shaped.dst, 0)
    assert shaped.puller.repeats.repeated == 2


async def test_a_slot_out_of_range_gives_the_full_calls_error(pair) -> None:
    shaped = await _shaped(pair)
    with pytest.raises(LLMException) as full:
        await pull(shaped.puller, pull_spec(shaped.src.cache_id, BATCH, shaped.dst.cache_id, 0))
    with pytest.raises(LLMException) as repeated:
        await prepared.again(shaped.puller, shaped.repeat, BATCH, 0, checksum=False)
    assert repeated.value.status_code == full.value.status_code == \
        LLMStatusCode.LLM_PARAM_INVALID
    assert str(repeated.value) == str(full.value)
    assert shaped.repeat.found is None  # found again by the next transfer of the shape
    await prepared.again(shaped.puller, shaped.repeat, 1, 1, checksum=False)
    assert shaped.repeat.found is not None and same_slot(shaped.src, 1, shaped.dst, 1)


async def test_a_far_region_gone_runs_the_full_call_which_finds_it_again(pair) -> None:
    shaped = await _shaped(pair)
    before = shaped.repeat.found
    _move_region(shaped.far, shaped.src)
    outcome = await prepared.again(shaped.puller, shaped.repeat, 2, 3, checksum=False)
    assert outcome.bytes == 2 * 256 and same_slot(shaped.src, 2, shaped.dst, 3)
    assert shaped.resolves() == 2 and shaped.puller.repeats.repeated == 0
    found = shaped.repeat.found
    assert found is not None and found is not before
    assert found.far.place.region_id == shaped.src.region_id
    await prepared.again(shaped.puller, shaped.repeat, 1, 0, checksum=False)
    assert shaped.puller.repeats.repeated == 1 and shaped.resolves() == 2


async def test_a_region_refused_in_flight_runs_the_full_call(pair) -> None:
    shaped = await _shaped(pair)
    shaped.transport.hold()
    again = asyncio.ensure_future(
        prepared.again(shaped.puller, shaped.repeat, 3, 2, checksum=False))
    await shaped.transport.in_flight.wait()
    _move_region(shaped.far, shaped.src)
    shaped.transport.release()  # the request reaches the far server: refused
    outcome = await again
    assert outcome.bytes == 2 * 256 and same_slot(shaped.src, 3, shaped.dst, 2)
    assert shaped.resolves() == 2 and shaped.puller.repeats.repeated == 0


@pytest.mark.parametrize(("change", "status"), [
    ("destination freed", LLMStatusCode.LLM_KV_CACHE_NOT_EXIST),
    ("source freed", LLMStatusCode.LLM_KV_CACHE_NOT_EXIST),
    ("unlinked", LLMStatusCode.LLM_NOT_YET_LINK),
    ("link down", LLMStatusCode.LLM_LINK_FAILED),
])
async def test_what_no_longer_holds_gives_the_full_calls_error(pair, change: str,
                                                               status: LLMStatusCode) -> None:
    shaped = await _shaped(pair)
    near, far = shaped.near, shaped.far
    if change == "destination freed":
        await near.caches.deallocate(shaped.puller, shaped.dst.cache_id, blocks=False)
    elif change == "source freed":
        await far.caches.deallocate(far.clusters[FAR], shaped.src.cache_id, blocks=False)
    elif change == "unlinked":
        await near.outbound.unlink(shaped.puller, FAR, force=False)
    else:
        far.data_server.revoke(shaped.puller.links[FAR].token)
    with pytest.raises(LLMException) as failed:
        await prepared.again(shaped.puller, shaped.repeat, 1, 1, checksum=False)
    assert failed.value.status_code == status
    assert shaped.puller.repeats.repeated == 0


async def test_another_checksum_runs_the_full_call_and_prepares_for_it(pair) -> None:
    shaped = await _shaped(pair)
    outcome = await prepared.again(shaped.puller, shaped.repeat, 1, 2, checksum=True)
    assert same_slot(shaped.src, 1, shaped.dst, 2) and outcome.bytes == 2 * 256
    assert shaped.transport.requests[-1].checksum
    assert shaped.puller.repeats.repeated == 0
    found = shaped.repeat.found
    assert found is not None and found.checksum
    await prepared.again(shaped.puller, shaped.repeat, 0, 3, checksum=True)
    assert shaped.puller.repeats.repeated == 1 and shaped.transport.requests[-1].checksum


async def test_repeat_at_once_declines_unknown_handles_and_counts_answers(pair) -> None:
    shaped = await _shaped(pair)
    puller, handle = shaped.puller, shaped.repeat.handle

    def plain(asked: int) -> bool:
        return False

    assert prepared.repeat_at_once(puller, 10**9, False, 0, 0, plain) is None
    assert prepared.repeat_at_once(puller, handle, True, 0, 0, plain) is None  # a pull's
    answered = prepared.repeat_at_once(puller, handle, False, 3, 3, plain)
    assert answered is not None and answered[0] is shaped.repeat
    assert isinstance(answered[1], Outcome) and puller.repeats.answered_at_once == 1
    assert same_slot(shaped.src, 3, shaped.dst, 3)
    shaped.transport.hold()
    started = prepared.repeat_at_once(puller, handle, False, 1, 0, plain)
    assert started is not None and not isinstance(started[1], Outcome)
    shaped.transport.release()
    await started[1]
    assert puller.repeats.answered_at_once == 1 and same_slot(shaped.src, 1, shaped.dst, 0)
    # What was prepared no longer holds: the call runs as usual.
    assert prepared.repeat_at_once(puller, handle, False, BATCH, 0, plain) is None


async def test_a_push_repeats_into_other_far_slots(pair) -> None:
    near, far = pair
    pusher, owner, _ = await linked(pair, remote_accessible=True)
    target, src = far.cache(owner), near.cache(pusher)
    fill(src, seed=12)
    spec = PushSpec(dst=IdRef(FAR, target.cache_id, 0), src_cache_id=src.cache_id,
                    src_batch_index=0, src_tensor_indices=[], dst_tensor_indices=[],
                    tensor_num_per_layer=2)
    handle = prepared.repeat_handle(pusher, spec, await push(pusher, spec), CHECKSUM_DEFAULT)
    repeat = pusher.repeats.get(handle, push=True)
    outcome = await prepared.again(pusher, repeat, 2, 3, checksum=False)
    assert outcome.bytes == 2 * 256 and same_slot(src, 2, target, 3)
    assert pusher.repeats.repeated == 1


async def test_a_local_link_repeats_as_a_copy(pair) -> None:
    near, _ = pair
    puller, owner, _ = await linked((near, near))
    src, dst = near.cache(owner), near.cache(puller)
    fill(src, seed=13)
    spec = pull_spec(src.cache_id, 0, dst.cache_id, 0)
    handle = prepared.repeat_handle(puller, spec, await pull(puller, spec), CHECKSUM_DEFAULT)
    repeat = puller.repeats.get(handle, push=False)
    outcome = await prepared.again(puller, repeat, 3, 2, checksum=False)
    assert outcome.transport == "local" and same_slot(src, 3, dst, 2)
    assert puller.repeats.repeated == 1
    await near.caches.deallocate(owner, src.cache_id, blocks=False)
    with pytest.raises(LLMException) as gone:
        await prepared.again(puller, repeat, 1, 1, checksum=False)
    assert gone.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
