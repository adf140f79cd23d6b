"""Moving KV between instances whose blocks differ in size, a run at a time.

vLLM's CPU attention keeps, per layer, ``[num_blocks, num_kv_heads,
block_size, 2 * head_size]`` (``cpu_attn.py``), and inside one (block, head)
its kernels write K transposed, ``[head_size][block_size]``, then V,
``[block_size][head_size]`` (what ``ops.cpu_attn_reshape_and_cache`` does
with the vec and vec16 kernels; ``tests/vllm`` checks it against vLLM
itself). A (block, head) is contiguous, but a token range of it is not: each
of K's rows holds ``block_size`` tokens of one dimension. So when the prefill
and decode instances use different block sizes, a span of tokens maps to
one run per K row and one per V chunk, never to whole blocks.

Both sides therefore register a second view of the same memory, the *run
view*: a blocks cache whose blocks are runs of ``RUN_TOKENS`` elements.
vLLM's CPU kernels take block sizes in multiples of 32 tokens, so every
span of 32 tokens of a head is a whole number of runs on either side: K's
row ``d`` of the span is one run, and the span's V is ``head_size``
consecutive runs. A pull names runs by index in each view; the daemon
merges the ranges that lie end to end (the V runs), and nothing is staged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Tokens per run: the block-size multiple vLLM's CPU attention kernels accept.
RUN_TOKENS = 32


@dataclass(frozen=True)
class KvShape:
    """One worker's KV blocks in vLLM's CPU layout (see the module)."""

    block_size: int  # tokens per block
    num_kv_heads: int  # this worker's
    head_size: int
    itemsize: int  # bytes per element

    @property
    def block_bytes(self) -> int:
        return self.num_kv_heads * 2 * self.block_size * self.head_size * self.itemsize

    @property
    def run_bytes(self) -> int:
        return RUN_TOKENS * self.itemsize

    @property
    def runs_per_head(self) -> int:
        """Runs in one (block, head): K's and V's."""
        return 2 * self.head_size * self.block_size // RUN_TOKENS

    def check(self) -> None:
        """Raises ValueError unless the run view fits this shape."""
        if self.block_size <= 0 or self.block_size % RUN_TOKENS:
            raise ValueError(f"block size {self.block_size} is not a multiple of {RUN_TOKENS} "
                             "tokens, which a run view needs")
        if min(self.num_kv_heads, self.head_size, self.itemsize) <= 0:
            raise ValueError(f"not a KV shape: {self}")

    def to_list(self) -> list[int]:
        return [self.block_size, self.num_kv_heads, self.head_size, self.itemsize]

    @classmethod
    def from_list(cls, values: object) -> KvShape:
        """The inverse of :meth:`to_list` (kv_transfer_params carry JSON).

        Raises:
            ValueError: not four positive ints.
        """
        if not isinstance(values, (list, tuple)) or len(values) != 4 or not all(
                type(v) is int and v > 0 for v in values):
            raise ValueError(f"not a KV shape: {values!r}")
        return cls(*values)


def _span_runs(shape: KvShape, blocks: np.ndarray, chunks: np.ndarray,
               heads: np.ndarray) -> np.ndarray:
    """Run indices of every 32-token span (block ``blocks[i]``, its ``chunks[i]``-th
    span) of each of ``heads``: shape (spans, heads, 2 * head_size), in the order
    both sides agree on (per head, K's rows, then V's runs)."""
    per_block_chunks = shape.block_size // RUN_TOKENS
    rows = np.arange(shape.head_size, dtype=np.int64)
    head_base = (blocks[:, None] * shape.num_kv_heads + heads[None, :]) * shape.runs_per_head
    # K row d of span c: run d * chunks_per_block + c of the head.
    k = head_base[:, :, None] + rows[None, None, :] * per_block_chunks + chunks[:, None, None]
    # V of span c: head_size runs from head_size * (chunks_per_block + c).
    v = head_base[:, :, None] + shape.head_size * (per_block_chunks + chunks[:, None, None]) \
        + rows[None, None, :]
    return np.concatenate([k, v], axis=2)


def run_ids(src: KvShape, dst: KvShape, src_blocks: Sequence[int], dst_blocks: Sequence[int],
            first_token: int, num_tokens: int,
            heads: Sequence[tuple[int, int]] | None = None) -> tuple[list[int], list[int]]:
    """The runs that carry tokens ``[first_token, num_tokens)`` from ``src``'s
    blocks (``src_blocks[i]`` holds tokens from ``i * src.block_size``) into
    ``dst``'s (``dst_blocks[j]`` from ``first_token + j * dst.block_size``):
    (source run ids, destination run ids), pairwise.

    Args:
        heads: (source head, destination head) pairs, each side's own head
            numbers: which heads move where (another tensor-parallel split
            gives each side other heads). None: every head to the same one.

    Raises:
        ValueError: the shapes differ in more than block size and heads,
            ``first_token`` is not on a destination block's start, either side
            holds too few blocks for the tokens, or a head is not there.
    """
    src.check()
    dst.check()
    if (src.head_size, src.itemsize) != (dst.head_size, dst.itemsize):
        raise ValueError(f"KV shapes {src} and {dst} differ in head size or item size")
    if heads is None:
        if src.num_kv_heads != dst.num_kv_heads:
            raise ValueError(f"KV shapes {src} and {dst} hold different heads; name them")
        heads = [(h, h) for h in range(src.num_kv_heads)]
    if not heads or any(not (0 <= s < src.num_kv_heads and 0 <= d < dst.num_kv_heads)
                        for s, d in heads):
        raise ValueError(f"heads {list(heads)} are not heads of {src} and {dst}")
    if first_token < 0 or first_token % dst.block_size or num_tokens <= first_token:
        raise ValueError(f"tokens [{first_token}, {num_tokens}) do not start a block of "
                         f"{dst.block_size}")
    if len(src_blocks) * src.block_size < num_tokens or \
            first_token + len(dst_blocks) * dst.block_size < num_tokens:
        raise ValueError(f"{len(src_blocks)} blocks of {src.block_size} and "
                         f"{len(dst_blocks)} of {dst.block_size} from token {first_token} "
                         f"cannot hold {num_tokens} tokens")
    starts = np.arange(first_token, num_tokens, RUN_TOKENS, dtype=np.int64)
    src_table = np.asarray(src_blocks, dtype=np.int64)
    dst_table = np.asarray(dst_blocks, dtype=np.int64)
    pairs = np.asarray(heads, dtype=np.int64)
    src_runs = _span_runs(src, src_table[starts // src.block_size],
                          (starts % src.block_size) // RUN_TOKENS, pairs[:, 0])
    dst_runs = _span_runs(dst, dst_table[(starts - first_token) // dst.block_size],
                          (starts % dst.block_size) // RUN_TOKENS, pairs[:, 1])
    return src_runs.ravel().tolist(), dst_runs.ravel().tolist()


def head_sources(src_heads: int, src_ranks: int, dst_heads: int,
                 dst_rank: int) -> dict[int, list[tuple[int, int]]]:
    """Where one destination worker's KV heads are under another tensor-parallel
    split: for each source rank that holds some, (its head, ours) pairs.

    Each side's ``heads`` are one rank's, its ranks hold consecutive ones
    (vLLM's split); both must hold every head once.

    Raises:
        ValueError: the two splits do not cover the same heads once each
            (vLLM replicates KV heads across ranks when there are fewer heads
            than ranks).
    """
    total = src_heads * src_ranks
    if dst_rank < 0 or (dst_rank + 1) * dst_heads > total:
        raise ValueError(f"{src_ranks} source ranks of {src_heads} KV heads do not hold "
                         f"rank {dst_rank}'s {dst_heads} (heads replicated across ranks?)")
    sources: dict[int, list[tuple[int, int]]] = {}
    for ours in range(dst_heads):
        head = dst_rank * dst_heads + ours
        sources.setdefault(head // src_heads, []).append((head % src_heads, ours))
    return sources


def blocks_needed(shape: KvShape, first_token: int, num_tokens: int) -> int:
    """How many of ``shape``'s blocks hold tokens ``[first_token, num_tokens)``
    when the first starts at ``first_token``."""
    return -(-(num_tokens - first_token) // shape.block_size)
