"""Where a decode worker's KV comes from: which prefill workers, and which ids.

Between instances of one layout and one tensor-parallel split, decode rank r
pulls whole blocks from prefill rank r. Otherwise (another block size,
another split, or both) it pulls runs (``_kv_map``) of the KV heads it owns
from each prefill rank that holds some of them. Every prefill rank it pulls
from is told when the request is done, with how many decode ranks will tell
it, so that it frees its blocks only after the last of them has pulled.
No vLLM and no hixl call here: the worker acts on what this decides.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..status import LLMException, LLMStatusCode
from ._kv_map import KvShape, head_sources, run_ids
from ._params import Load, RemoteBlocks


@dataclass(frozen=True)
class Worker:
    """A decode worker's own KV facts, as its handshake gives them."""

    layout: str  # the fingerprint (_params.layout_fingerprint)
    family: str  # "" without a run view (_params.layout_family)
    shape: KvShape | None  # None without a run view
    block_size: int
    rank: int
    ranks: int  # the instance's tensor-parallel size


@dataclass(frozen=True)
class Pull:
    """One pull of a load: from prefill rank ``rank``'s block view, or its run view."""

    rank: int
    runs: bool
    src: list[int]
    dst: list[int]


def _refused(message: str) -> LLMException:
    return LLMException(message, status_code=LLMStatusCode.LLM_PARAM_INVALID)


def _same_split_and_size(here: Worker, remote: RemoteBlocks) -> bool:
    far_block_size = remote.kv_shape[0] if remote.kv_shape else here.block_size
    return len(remote.cluster_ids) == here.ranks and far_block_size == here.block_size


def pulls_of(here: Worker, load: Load) -> list[Pull]:
    """The pulls that fill ``load``'s blocks, one per prefill rank involved.

    Raises:
        LLMException: LLM_PARAM_INVALID when the two layouts cannot trade KV,
            saying what differs.
    """
    remote = load.remote
    if _same_split_and_size(here, remote):
        if remote.layout != here.layout:
            raise _refused(f"the prefill instance's KV layout {remote.layout} is not this "
                           f"one's {here.layout} (another model, dtype or attention kernel?)")
        if here.rank >= len(remote.cluster_ids):
            raise _refused(f"the prefill instance has {len(remote.cluster_ids)} workers; "
                           f"this is rank {here.rank}")
        first = load.first_token // here.block_size
        return [Pull(here.rank, False, list(remote.block_ids[first:first + len(load.block_ids)]),
                     list(load.block_ids))]
    far = f"{len(remote.cluster_ids)} workers with blocks of " \
          f"{remote.kv_shape[0] if remote.kv_shape else here.block_size} tokens"
    mine = f"{here.ranks} with blocks of {here.block_size}"
    if not remote.family or not here.family or here.shape is None:
        raise _refused(f"the prefill instance has {far}, this one {mine}, and its KV cannot "
                       "move as runs between them: one side's attention kernel has no run "
                       "view")
    if remote.family != here.family:
        raise _refused(f"the prefill instance has {far}, this one {mine}, and its KV cannot "
                       f"move as runs between them: another model, dtype, KV head count or "
                       f"head size, or attention kernel ({remote.family} against "
                       f"{here.family})")
    try:
        far_shape = KvShape.from_list(remote.kv_shape)
        sources = head_sources(far_shape.num_kv_heads, len(remote.cluster_ids),
                               here.shape.num_kv_heads, here.rank)
        return [Pull(rank, True, *run_ids(far_shape, here.shape, remote.block_ids,
                                          load.block_ids, load.first_token, load.num_tokens,
                                          heads=pairs))
                for rank, pairs in sorted(sources.items())]
    except ValueError as exc:
        raise _refused(f"the prefill instance's KV ({far}) cannot fill this request's "
                       f"({mine}): {exc}") from exc


def tellers_of(here: Worker, remote: RemoteBlocks) -> dict[int, int]:
    """The prefill ranks this worker tells about ``remote`` (done, hold), each
    with how many decode ranks tell it in all."""
    far_ranks = len(remote.cluster_ids)
    if _same_split_and_size(here, remote) or len(remote.kv_shape) != 4 or here.shape is None:
        return {here.rank: 1} if here.rank < far_ranks else {}
    far_heads, heads = remote.kv_shape[1], here.shape.num_kv_heads
    try:
        tellers = Counter(rank for decode_rank in range(here.ranks)
                          for rank in head_sources(far_heads, far_ranks, heads, decode_rank))
        mine = head_sources(far_heads, far_ranks, heads, here.rank)
    except ValueError:  # a split that cannot pair: its load fails, as pulls_of says
        return {here.rank: 1} if here.rank < far_ranks else {}
    return {rank: tellers[rank] for rank in mine}
