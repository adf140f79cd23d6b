"""vLLM's KV tensors as one hixl blocks cache.

Every attention backend vLLM's CPU and GPU builds use keeps, per layer,
either one tensor whose first dimension is the block (``[num_blocks, ...]``,
K and V inside each block) or a K and a V half ahead of it
(``[2, num_blocks, ...]``). Either way each region below is block-major:
block ``b`` of a region starts at ``base + b * block_bytes``. The regions
become the tensors of one ``register_blocks_cache`` call, so the daemon
reaches the whole KV space as one cache and a request's pull names only
block ids, never per-block addresses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import logging
import mmap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hixl_native import NativeError

from ..shareable import ShareableBuffer, adopt_shareable
from ..status import LLMException
from ._params import LOGGER_NAME

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(LOGGER_NAME)

# Linux 5.14: fault pages in, writable, without changing what they hold.
MADV_POPULATE_WRITE = 23


@dataclass(frozen=True)
class KvLayout:
    """The engine's KV memory: ``regions`` block-major spans of equal shape."""

    # Each region's first byte, in vLLM's layer order (the same on both sides).
    addresses: tuple[int, ...]
    num_blocks: int
    block_bytes: int
    dtype: str

    @property
    def nbytes(self) -> int:
        return len(self.addresses) * self.num_blocks * self.block_bytes


def share_in_place(layout: KvLayout) -> ShareableBuffer | None:
    """Move the KV memory onto shared memory where it lies, so both daemons
    move its bytes directly (the zero-copy path) rather than through bounce
    buffers and cross-memory calls. None when the regions are not one span
    (several allocations) or the memory cannot move; the engine-memory path
    serves those.
    """
    span = layout.num_blocks * layout.block_bytes
    starts = sorted(layout.addresses)
    if any(b - a != span for a, b in itertools.pairwise(starts)):
        logger.info("hixl: the KV regions are not one span; the daemon reaches them as "
                    "engine memory")
        return None
    try:
        return adopt_shareable(starts[0], span * len(starts))
    except (LLMException, NativeError) as exc:
        logger.info("hixl: the KV memory stays engine memory: %s", exc)
        return None


def prefault(layout: KvLayout) -> None:
    """Fault the KV memory in now, once, rather than page by page inside the
    daemon's first transfers into each block (vLLM's CPU KV cache is zeroed
    lazily by the kernel, and a page fault taken by a cross-memory write costs
    as much as the copy). On kernels without MADV_POPULATE_WRITE the first
    transfers pay it, as before.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    page = mmap.PAGESIZE
    span = layout.num_blocks * layout.block_bytes
    for address in layout.addresses:
        start = address - address % page
        end = -(-(address + span) // page) * page
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start),
                        MADV_POPULATE_WRITE) != 0:
            logger.info("hixl: KV memory not faulted in ahead (madvise: errno %d); the "
                        "first transfers into each block pay it", ctypes.get_errno())
            return


def kv_layout_of(kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> KvLayout:
    """Describe ``register_kv_caches``' tensors.

    Raises:
        ValueError: a layout this connector cannot move (not on the CPU, not
            contiguous, or regions of different block sizes).
    """
    regions: dict[int, tuple[int, str]] = {}  # address -> (block bytes, dtype)
    for name, tensor in kv_caches.items():
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"HixlConnector moves contiguous host tensors; layer {name} is "
                             f"{tensor.device.type}, contiguous={tensor.is_contiguous()}")
        halves = [tensor] if tensor.shape[0] == num_blocks else (
            [tensor[0], tensor[1]] if tensor.dim() > 1 and tensor.shape[0] == 2
            and tensor.shape[1] == num_blocks else [])
        if not halves:
            raise ValueError(f"layer {name}: KV shape {tuple(tensor.shape)} has no block "
                             f"dimension of {num_blocks} first")
        for half in halves:
            block_bytes = half.stride(0) * half.element_size()
            # Layers may share one tensor (KV sharing): it is one region.
            regions[half.data_ptr()] = (block_bytes, str(half.dtype).removeprefix("torch."))
    sizes = {block_bytes for block_bytes, _ in regions.values()}
    if len(sizes) != 1:
        raise ValueError(f"HixlConnector needs one block size for every layer, got {sizes}")
    dtypes = {dtype for _, dtype in regions.values()}
    return KvLayout(tuple(regions), num_blocks, sizes.pop(), "/".join(sorted(dtypes)))
