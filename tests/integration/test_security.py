"""Trusted peers end to end: real daemons in token and mtls mode, credentials made here.

A representative set of transfers (pull by key, push into a remote slot, a
layer-wise push) runs in each mode; then the refusals: a wrong secret, a
certificate of another CA, a peer outside ``allowed_peers``, a read-only
peer's push (the owner's bytes unchanged).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hixl_client import (
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LayerSynchronizer,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    TransferWithCacheKeyConfig,
)
from hixl_service.testing import DaemonProcess
from hixl_service.testing_credentials import (
    CertificateAuthority,
    mtls_settings,
    token_settings,
    write_token,
)

from .conftest import cluster_info, daemon_process, make_pair, options

pytestmark = pytest.mark.asyncio

RNG = np.random.default_rng(19)
DECODE_ID = "spiffe://hixl.test/decode"
PREFILL_ID = "spiffe://hixl.test/prefill"


def fill(cache: Any) -> None:
    for i in range(cache.cache_desc.num_tensors):
        view = np.frombuffer(cache.tensor_view(i), dtype=np.uint8)
        view[:] = RNG.integers(0, 256, view.size, dtype=np.uint8)


def raw(cache: Any, tensor: int) -> np.ndarray:
    return np.frombuffer(cache.tensor_view(tensor), dtype=np.uint8).reshape(
        cache.cache_desc.shape[0], -1)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module", params=["token", "mtls"])
def secured(request: pytest.FixtureRequest, ca: CertificateAuthority,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, ...]]:
    """Two daemons that authenticate each other, in each mode."""
    if request.param == "token":
        token = write_token(tmp_path_factory.mktemp("token") / "secret")
        first, second = token_settings(token), token_settings(token)
    else:
        first = mtls_settings(ca.issue("prefill", spiffe=PREFILL_ID))
        second = mtls_settings(ca.issue("decode", spiffe=DECODE_ID))
    with daemon_process(security=first) as a, daemon_process(security=second) as b:
        yield a, b


@pytest.mark.parametrize("same_daemon", [False, True])
async def test_pull_by_key_in_each_mode(secured: tuple[DaemonProcess, ...],
                                        next_cluster_id: Callable[[], int],
                                        same_daemon: bool) -> None:
    prefill, decode = secured
    # A link inside one daemon also goes through its own (authenticated) Hello.
    pair = await make_pair(prefill, prefill if same_daemon else decode, next_cluster_id,
                           pool_bytes=8 * 2**20)
    try:
        desc = CacheDesc(4, [1, 64 * 1024], DataType.DT_UINT8)
        key = CacheKey(pair.prompt.cluster_id, req_id=3)
        src = await pair.prompt.cache_manager.allocate_cache(desc, [key])
        fill(src)
        dst = await pair.decoder.cache_manager.allocate_cache(desc)
        await pair.decoder.cache_manager.pull_cache(key, dst)
        for i in range(4):
            np.testing.assert_array_equal(raw(dst, i), raw(src, i))
    finally:
        await pair.decoder.finalize()
        await pair.prompt.finalize()


async def test_push_and_layerwise_in_each_mode(secured: tuple[DaemonProcess, ...],
                                               next_cluster_id: Callable[[], int]) -> None:
    prefill, decode = secured
    # make_pair links decoder -> prompt; here the linking side pushes.
    pair = await make_pair(decode, prefill, next_cluster_id, pool_bytes=8 * 2**20,
                           remote_accessible=True)
    receiver, pusher = pair.prompt, pair.decoder
    try:
        desc = CacheDesc(4, [2, 8192], DataType.DT_UINT8)
        target = await receiver.cache_manager.allocate_cache(desc)
        src = await pusher.cache_manager.allocate_cache(desc)
        fill(src)
        await pusher.cache_manager.push_cache(
            CacheKeyByIdAndIndex(receiver.cluster_id, target.cache_id, 1), src, 0)
        for i in range(4):
            np.testing.assert_array_equal(raw(target, i)[1], raw(src, i)[0])

        class Ready(LayerSynchronizer):
            def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
                return True

        fill(src)
        task = pusher.cache_manager.transfer_cache_async(
            src, Ready(), [TransferWithCacheKeyConfig(
                CacheKeyByIdAndIndex(receiver.cluster_id, target.cache_id, 0), range(0, 2),
                range(0, 2))])
        assert await task == [LLMStatusCode.LLM_SUCCESS]
        for i in range(4):
            np.testing.assert_array_equal(raw(target, i)[0], raw(src, i)[0])
    finally:
        await pusher.finalize()
        await receiver.finalize()


async def link_status(linking: DaemonProcess, linked: DaemonProcess,
                      next_cluster_id: Callable[[], int]) -> Any:
    """Link a fresh cluster of ``linking`` to one of ``linked``: the link's status."""
    target = LLMDataDist(LLMRole.PROMPT, next_cluster_id(), daemon=linked.client_target)
    source = LLMDataDist(LLMRole.DECODER, next_cluster_id(), daemon=linking.client_target)
    await target.init(options(pool_bytes=2**20))
    await source.init(options(pool_bytes=2**20))
    try:
        _, results = await source.link_clusters(
            [cluster_info(target.cluster_id, linked.peer_address)], timeout=5000)
        return results[0]
    finally:
        await source.finalize()
        await target.finalize()


async def test_a_wrong_secret_is_refused(tmp_path: Path,
                                         next_cluster_id: Callable[[], int]) -> None:
    with daemon_process(security=token_settings(write_token(tmp_path / "a"))) as owner, \
            daemon_process(security=token_settings(write_token(tmp_path / "b"))) as other:
        assert await link_status(other, owner, next_cluster_id) == LLMStatusCode.LLM_LINK_FAILED


async def test_a_certificate_of_another_ca_is_refused(
        ca: CertificateAuthority, tmp_path: Path, next_cluster_id: Callable[[], int]) -> None:
    stranger_ca = CertificateAuthority(tmp_path / "stranger")
    with daemon_process(security=mtls_settings(ca.issue("owner"))) as owner, \
            daemon_process(security=mtls_settings(stranger_ca.issue("stranger"))) as stranger:
        assert await link_status(stranger, owner,
                                 next_cluster_id) == LLMStatusCode.LLM_LINK_FAILED


async def test_a_peer_outside_allowed_peers_is_refused(
        ca: CertificateAuthority, next_cluster_id: Callable[[], int]) -> None:
    allowed = [{"identity": DECODE_ID, "clusters": [], "write": True}]
    owner_settings = mtls_settings(ca.issue("owner2", spiffe=PREFILL_ID),
                                   allowed_peers=allowed)
    with daemon_process(security=owner_settings) as owner, \
            daemon_process(security=mtls_settings(ca.issue("other", spiffe="spiffe://x/y"))
                           ) as other, \
            daemon_process(security=mtls_settings(ca.issue("decode2", spiffe=DECODE_ID))
                           ) as decode:
        assert await link_status(other, owner, next_cluster_id) == LLMStatusCode.LLM_LINK_FAILED
        assert await link_status(decode, owner, next_cluster_id) == LLMStatusCode.LLM_SUCCESS


async def test_a_read_only_peer_cannot_push_a_byte(
        ca: CertificateAuthority, next_cluster_id: Callable[[], int]) -> None:
    allowed = [{"identity": DECODE_ID, "clusters": [], "write": False}]
    owner_settings = mtls_settings(ca.issue("owner3", spiffe=PREFILL_ID),
                                   allowed_peers=allowed)
    with daemon_process(security=owner_settings) as owner, \
            daemon_process(security=mtls_settings(ca.issue("decode3", spiffe=DECODE_ID))
                           ) as reader:
        # make_pair links decoder (on reader) -> prompt (on owner)
        pair = await make_pair(owner, reader, next_cluster_id, pool_bytes=2**20,
                               remote_accessible=True)
        receiver, pusher = pair.prompt, pair.decoder
        try:
            desc = CacheDesc(2, [1, 4096], DataType.DT_UINT8)
            target = await receiver.cache_manager.allocate_cache(desc)
            fill(target)
            before = [raw(target, i).copy() for i in range(2)]
            src = await pusher.cache_manager.allocate_cache(desc)
            fill(src)
            with pytest.raises(LLMException):
                await pusher.cache_manager.push_cache(
                    CacheKeyByIdAndIndex(receiver.cluster_id, target.cache_id, 0), src, 0)
            for i in range(2):
                np.testing.assert_array_equal(raw(target, i), before[i])
            # reading is still allowed
            dst = await pusher.cache_manager.allocate_cache(desc)
            await pusher.cache_manager.pull_cache(
                CacheKeyByIdAndIndex(receiver.cluster_id, target.cache_id, 0), dst)
            np.testing.assert_array_equal(raw(dst, 0), before[0])
        finally:
            await pusher.finalize()
            await receiver.finalize()
