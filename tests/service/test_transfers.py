"""transfers: pulls and pushes find the far cache, plan, move and settle keys; their
errors carry LLM-DataDist's status codes; a stale remembered far cache is found
afresh; the deadline ends a silent peer or a stuck request; a cache freed
mid-transfer is fenced (in-memory wire and far daemon: tests/service/fakes.py)."""

from __future__ import annotations

import asyncio

import pytest

from hixl_service.peer_api import BlocksRef, IdRef, KeyRef
from hixl_service.registry import KeySpec
from hixl_service.transfers import PullSpec, PushSpec, pull, push
from hixl_service.transports.fault import FaultRule, FaultTransport
from hixl_wire.status import LLMException, LLMStatusCode

from .fakes import (
    BATCH,
    FAR,
    NEAR,
    MemoryTransport,
    fill,
    linked,
    same_slot,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")



def pull_spec(src: IdRef | KeyRef | BlocksRef, dst_cache_id: int, dst_slot: int = 0,
              **extra: object) -> PullSpec:
    return PullSpec(src=src, dst_cache_id=dst_cache_id, batch_index=dst_slot, size=-1,
                    src_tensor_indices=[], dst_tensor_indices=[], tensor_num_per_layer=2,
                    **extra)  # type: ignore[arg-type]


def push_spec(dst: IdRef, src_cache_id: int, src_slot: int) -> PushSpec:
    return PushSpec(dst=dst, src_cache_id=src_cache_id, src_batch_index=src_slot,
                    src_tensor_indices=[], dst_tensor_indices=[], tensor_num_per_layer=2)


async def test_a_pull_by_id_lands_the_slot_and_remembers_the_far_cache(pair) -> None:
    near, far = pair
    puller, owner, link = await linked(pair)
    src, dst = far.cache(owner), near.cache(puller)
    fill(src, seed=1)
    outcome = await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 3), dst.cache_id, 1))
    assert same_slot(src, 3, dst, 1) and not same_slot(src, 3, dst, 0)
    assert outcome.bytes == 2 * 256 and outcome.transport == "memory"
    assert outcome.far is not None and outcome.far.batch_index == 3
    await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 2), dst.cache_id, 0))
    assert same_slot(src, 2, dst, 0)
    peer = near.network.peer(far.address)
    assert peer.count("resolve") == 1  # the second pull used the remembered resolve
    assert isinstance(link.transport, MemoryTransport) and len(link.transport.requests) == 2


async def test_a_push_lands_in_a_remote_accessible_cache_only(pair) -> None:
    near, far = pair
    pusher, owner, _link = await linked(pair, remote_accessible=True)
    target, src = far.cache(owner), near.cache(pusher)
    fill(src, seed=2)
    outcome = await push(pusher, push_spec(IdRef(FAR, target.cache_id, 2), src.cache_id, 1))
    assert outcome.bytes == 2 * 256 and same_slot(src, 1, target, 2)

    closed = await far.cluster(3)  # not remote-cache-accessible
    await near.link(pusher, far, 3)
    shut = far.cache(closed)
    with pytest.raises(LLMException) as refused:
        await push(pusher, push_spec(IdRef(3, shut.cache_id, 0), src.cache_id, 1))
    assert refused.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    assert "remote-accessible" in str(refused.value)
    assert not same_slot(src, 1, shut, 0)


@pytest.mark.parametrize(("case", "status"), [
    ("own cluster", LLMStatusCode.LLM_PARAM_INVALID),
    ("not linked", LLMStatusCode.LLM_NOT_YET_LINK),
    ("no destination", LLMStatusCode.LLM_KV_CACHE_NOT_EXIST),
    ("no source", LLMStatusCode.LLM_KV_CACHE_NOT_EXIST),
    ("blocks destination", LLMStatusCode.LLM_PARAM_INVALID),
    ("slot out of range", LLMStatusCode.LLM_PARAM_INVALID),
])
async def test_invalid_pulls_fail_with_llm_datadists_codes_and_move_nothing(
        pair, case: str, status: LLMStatusCode) -> None:
    near, far = pair
    puller, owner, link = await linked(pair)
    src, dst = far.cache(owner), near.cache(puller)
    blocks = near.cache(puller, blocks=True, blocks_model_id=9)
    spec = {
        "own cluster": pull_spec(IdRef(NEAR, dst.cache_id, 0), dst.cache_id),
        "not linked": pull_spec(IdRef(77, src.cache_id, 0), dst.cache_id),
        "no destination": pull_spec(IdRef(FAR, src.cache_id, 0), 99),
        "no source": pull_spec(IdRef(FAR, 99, 0), dst.cache_id),
        "blocks destination": pull_spec(IdRef(FAR, src.cache_id, 0), blocks.cache_id),
        "slot out of range": pull_spec(IdRef(FAR, src.cache_id, BATCH), dst.cache_id),
    }[case]
    with pytest.raises(LLMException) as failed:
        await pull(puller, spec)
    assert failed.value.status_code == status
    assert isinstance(link.transport, MemoryTransport) and link.transport.requests == []


async def test_a_far_cache_freed_and_replaced_is_resolved_afresh_after_the_refusal(pair) -> None:
    near, far = pair
    puller, owner, _link = await linked(pair)
    old, dst = far.cache(owner), near.cache(puller)
    await pull(puller, pull_spec(IdRef(FAR, old.cache_id, 0), dst.cache_id))
    # The owner frees the cache; the puller still remembers its region.
    await far.caches.deallocate(owner, old.cache_id, blocks=False)
    with pytest.raises(LLMException) as gone:
        await pull(puller, pull_spec(IdRef(FAR, old.cache_id, 0), dst.cache_id))
    assert gone.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    peer = near.network.peer(far.address)
    assert peer.count("resolve") == 2  # refused by the data server, then asked afresh

    new = far.cache(owner)
    fill(new, seed=3)
    await pull(puller, pull_spec(IdRef(FAR, new.cache_id, 1), dst.cache_id, 2))
    assert same_slot(new, 1, dst, 2)


async def test_a_stale_remembered_region_is_found_afresh_and_pulled_once_more(pair) -> None:
    near, far = pair
    puller, owner, link = await linked(pair)
    src, dst = far.cache(owner), near.cache(puller)
    fill(src, seed=4)
    await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 0), dst.cache_id))
    # The far region goes away under the same cache (as after a re-registration):
    # the data server refuses the remembered region, nothing moves, and a fresh
    # resolve finds the cache's new region.
    await far.regions.remove(src.region_id)
    src.region_id = far.regions.add(src.memory, src.extent_offset, src.extent_size, FAR, False)
    await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 3), dst.cache_id, 3))
    assert same_slot(src, 3, dst, 3)
    assert near.network.peer(far.address).count("resolve") == 2
    assert isinstance(link.transport, MemoryTransport)
    assert [r.region_id for r in link.transport.requests][-2:] == [src.region_id - 1,
                                                                   src.region_id]


async def test_a_pull_by_key_tells_the_owner_which_frees_the_slots_cache(pair) -> None:
    near, far = pair
    puller, owner, _link = await linked(pair)
    key = KeySpec(req_id=5, model_id=0)
    src, dst = far.cache(owner, keys=[key]), near.cache(puller)
    fill(src, seed=5)
    await far.caches.deallocate(owner, src.cache_id, blocks=False)  # the key keeps it
    pool = owner.pools[next(iter(owner.pools))]
    held = pool.allocator.used_bytes
    await pull(puller, pull_spec(KeyRef(FAR, key), dst.cache_id, 2))
    assert same_slot(src, 0, dst, 2)
    assert near.network.peer(far.address).count("release_key") == 1
    with pytest.raises(LLMException) as released:
        owner.registry.lookup_key(key)
    assert released.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    assert pool.allocator.used_bytes < held  # its last reference went with the key


async def test_a_release_the_owner_cannot_take_does_not_fail_a_landed_pull(pair) -> None:
    near, far = pair
    puller, owner, _link = await linked(pair)
    key = KeySpec(req_id=6, model_id=0)
    src, dst = far.cache(owner, keys=[key]), near.cache(puller)
    fill(src, seed=6)
    near.network.peer(far.address).fail_next("release_key", LLMStatusCode.LLM_LINK_FAILED)
    await pull(puller, pull_spec(KeyRef(FAR, key), dst.cache_id, 1))
    assert same_slot(src, 0, dst, 1)
    assert owner.registry.lookup_key(key).cache is src  # untold, the owner keeps the key


async def test_a_pull_of_blocks_lands_the_named_blocks(pair) -> None:
    near, far = pair
    puller, owner, _link = await linked(pair)
    src = far.cache(owner, blocks=True, blocks_model_id=4)
    dst = near.cache(puller, blocks=True, blocks_model_id=4)
    fill(src, seed=7)
    spec = pull_spec(BlocksRef(FAR, 4), dst.cache_id, blocks=True, src_blocks=[3, 0],
                     dst_blocks=[1, 2])
    outcome = await pull(puller, spec)
    assert outcome.bytes == 2 * 2 * 256
    assert same_slot(src, 3, dst, 1) and same_slot(src, 0, dst, 2)
    await pull(puller, spec)
    assert near.network.peer(far.address).count("resolve") == 1  # a blocks key is remembered


async def test_a_silent_peer_ends_the_pull_at_sync_kv_timeout(pair) -> None:
    near, far = pair
    puller, owner, _link = await linked(pair, sync_timeout_ms=30)
    src, dst = far.cache(owner), near.cache(puller)
    near.network.peer(far.address).silent.add("resolve")
    with pytest.raises(LLMException) as late:
        await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 0), dst.cache_id))
    assert late.value.status_code == LLMStatusCode.LLM_TIMEOUT
    assert "sync_kv_timeout" in str(late.value)


async def test_a_request_not_answered_ends_with_the_transfers_deadline(pair) -> None:
    near, far = pair
    puller, owner, link = await linked(pair, sync_timeout_ms=40)
    src, dst = far.cache(owner), near.cache(puller)
    assert isinstance(link.transport, MemoryTransport)
    link.transport.hold()
    with pytest.raises(LLMException) as late:
        await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 0), dst.cache_id))
    assert late.value.status_code == LLMStatusCode.LLM_TIMEOUT
    request = link.transport.requests[-1]
    assert 0 < request.timeout_ms <= 40  # the transport got what was left of the deadline


@pytest.mark.parametrize(("fault", "status"), [
    ("peer down", LLMStatusCode.LLM_LINK_FAILED),
    ("link severed", LLMStatusCode.LLM_LINK_FAILED),
    ("request failed", LLMStatusCode.LLM_SUSPECT_REMOTE_ERROR),
    ("unlinked on the owner", LLMStatusCode.LLM_NOT_YET_LINK),
    ("token revoked", LLMStatusCode.LLM_LINK_FAILED),
])
async def test_failures_of_the_link_or_the_peer_reach_the_caller_with_their_status(
        pair, fault: str, status: LLMStatusCode) -> None:
    near, far = pair
    puller, owner, link = await linked(pair)
    src, dst = far.cache(owner), near.cache(puller)
    fill(src, seed=8)
    faulty = link.transport = FaultTransport(link.transport)
    if fault == "peer down":
        near.network.peer(far.address).down = True
    elif fault == "link severed":
        faulty.sever()
    elif fault == "request failed":
        faulty.add(FaultRule("fail", status=LLMStatusCode.LLM_SUSPECT_REMOTE_ERROR))
    elif fault == "unlinked on the owner":  # the resolve learns it
        far.inbound.drop_inbound_link(link.token)
    else:  # with the far cache remembered, the data plane learns it
        await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 1), dst.cache_id, 1))
        far.inbound.drop_inbound_link(link.token)
    with pytest.raises(LLMException) as failed:
        await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 0), dst.cache_id))
    assert failed.value.status_code == status
    assert not same_slot(src, 0, dst, 0)


async def test_a_destination_freed_while_its_bytes_move_is_fenced(pair) -> None:
    near, far = pair
    puller, owner, link = await linked(pair)
    src, dst = far.cache(owner), near.cache(puller)
    pool = dst.memory
    assert isinstance(link.transport, MemoryTransport)
    link.transport.hold()
    pulling = asyncio.ensure_future(
        pull(puller, pull_spec(IdRef(FAR, src.cache_id, 0), dst.cache_id)))
    await link.transport.in_flight.wait()
    used = pool.allocator.used_bytes  # type: ignore[attr-defined]
    freeing = asyncio.ensure_future(near.caches.deallocate(puller, dst.cache_id, blocks=False))
    await asyncio.to_thread(lambda: None)  # the region's removal runs in a thread
    for _ in range(5):
        await asyncio.sleep(0)
    assert dst.gone and dst.moving == 1 and not freeing.done()
    assert pool.allocator.used_bytes == used  # type: ignore[attr-defined]
    link.transport.release()
    with pytest.raises(LLMException) as freed:
        await pulling
    assert freed.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    await freeing
    assert pool.allocator.used_bytes < used  # type: ignore[attr-defined]


async def test_a_local_link_copies_between_clusters_of_one_daemon(pair) -> None:
    near, _ = pair
    owner = await near.cluster(FAR)
    puller = await near.cluster(NEAR)
    link = await near.link(puller, near, FAR)
    assert link.transport.name == "local"
    src, dst = near.cache(owner), near.cache(puller)
    fill(src, seed=9)
    outcome = await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 2), dst.cache_id, 3))
    assert outcome.transport == "local" and same_slot(src, 2, dst, 3)
    await near.caches.deallocate(owner, src.cache_id, blocks=False)
    with pytest.raises(LLMException) as gone:
        await pull(puller, pull_spec(IdRef(FAR, src.cache_id, 2), dst.cache_id, 3))
    assert gone.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
