"""The sweeps: which cases a quick or a full run measures, and the KV model presets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hixl_bench.model import KIB, MIB, Budget, Case

OPS = ("pull", "push")
PATHS = ("local", "tcp")


@dataclass(frozen=True)
class ModelPreset:
    """The KV shape of one model: per layer, K and V tensors of ``[tokens, kv_heads, head_dim]``."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # fp16 / bf16

    def token_bytes(self) -> int:
        """KV bytes of one token over all layers (K and V)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def prompt_bytes(self, tokens: int) -> int:
        return tokens * self.token_bytes()


PRESETS = {
    preset.name: preset
    for preset in (
        ModelPreset("llama3-8b", layers=32, kv_heads=8, head_dim=128),
        ModelPreset("llama3-70b", layers=80, kv_heads=8, head_dim=128),
        ModelPreset("tiny", layers=4, kv_heads=2, head_dim=64),  # tests only
    )
}

KV_MODES = ("pull_cache", "pull_cache_layers", "pull_blocks", "transfer_cache_async")


@dataclass(frozen=True)
class KvCase:
    """One prompt's KV moved one way.

    Attributes:
        model: the preset.
        tokens: prompt length.
        page_tokens: tokens per block of a paged cache.
        mode: ``pull_cache`` (one continuous pull), ``pull_cache_layers`` (one
            pull per layer), ``pull_blocks`` (paged), ``transfer_cache_async``
            (layer-wise push).
        path: ``local`` or ``tcp``.
    """

    model: ModelPreset
    tokens: int
    page_tokens: int
    mode: str
    path: str = "tcp"

    @property
    def prompt_bytes(self) -> int:
        return self.model.prompt_bytes(self.tokens)

    @property
    def num_pages(self) -> int:
        return math.ceil(self.tokens / self.page_tokens)

    def ceiling_shape(self, cold_bytes: int) -> tuple[int, int]:
        """The (block, nblocks) the ceilings measure for this case: same block size,
        as many blocks as half the cold buffers hold."""
        m = self.model
        if self.mode == "pull_blocks":
            block, count = self.page_tokens * m.kv_heads * m.head_dim * m.dtype_bytes, \
                2 * m.layers * self.num_pages
        else:
            block, count = self.tokens * m.kv_heads * m.head_dim * m.dtype_bytes, 2 * m.layers
        return block, max(1, min(count, cold_bytes // 2 // block))


@dataclass(frozen=True)
class Plan:
    """Everything one run measures."""

    cases: tuple[Case, ...]
    kv_cases: tuple[KvCase, ...]
    cold_bytes: int
    budget: Budget
    kv_budget: Budget

    def peer_cases(self) -> list[Case]:
        """The cases peers run: every shape of the block and batch sweeps, one in flight."""
        return [c for c in self.cases if c.conc == 1 and c.path == "tcp"
                and c.suite in ("block", "batch")]

    def max_request_bytes(self) -> int:
        """The largest request of a hixl row or of its ceiling."""
        return max([max(c.request_bytes, c.ceiling_key[0] * c.ceiling_key[1])
                    for c in self.cases] or [0])


def _block_suite(blocks: list[int], ops: tuple[str, ...], paths: tuple[str, ...]) -> list[Case]:
    return [Case("block", op, path, b, 1) for op in ops for path in paths for b in blocks]


def _batch_suite(shapes: list[tuple[int, int]], ops: tuple[str, ...],
                 paths: tuple[str, ...]) -> list[Case]:
    return [Case("batch", op, path, b, n) for op in ops for path in paths for b, n in shapes]


def _conc_suite(shapes: list[tuple[int, int]], concs: list[int],
                paths: tuple[str, ...]) -> list[Case]:
    return [Case("conc", "pull", path, b, n, c) for path in paths for b, n in shapes
            for c in concs]


def quick_plan(models: list[str] | None = None, tokens: list[int] | None = None,
               page_tokens: int = 128, budget_scale: float = 1.0) -> Plan:
    """A smoke run (well under two minutes): a few points of each sweep."""
    cases = (_block_suite([4 * KIB, 64 * KIB, MIB, 16 * MIB], ("pull", "push"), PATHS)
             + _batch_suite([(4 * KIB, 128), (64 * KIB, 128)], ("pull",), PATHS)
             + _conc_suite([(4 * KIB, 1)], [8], ("tcp",)))
    kv = [KvCase(PRESETS[m], t, page_tokens, mode)
          for m in (models or ["llama3-8b"]) for t in (tokens or [1024]) for mode in KV_MODES]
    budget = Budget(0.15, 3, 2000, 2).scaled(budget_scale)
    return Plan(tuple(cases), tuple(kv), 64 * MIB, budget,
                Budget(0.2, 2, 20, 1).scaled(budget_scale))


def full_plan(models: list[str] | None = None, tokens: list[int] | None = None,
              page_tokens: int = 128, budget_scale: float = 1.0) -> Plan:
    """The sweep recorded in bench/RESULTS.md."""
    blocks = [4 * KIB << (2 * i) for i in range(8)]  # 4 KiB, 16 KiB, ... 64 MiB
    batch = [(b, n) for b in (4 * KIB, 64 * KIB) for n in (1, 8, 32, 128, 512, 1024)
             if b * n <= 64 * MIB]
    cases = (_block_suite(blocks, OPS, PATHS) + _batch_suite(batch, OPS, PATHS)
             + _conc_suite([(4 * KIB, 1), (4 * KIB, 128), (64 * KIB, 128), (MIB, 1)],
                           [1, 4, 16, 64], PATHS))
    if models is None and tokens is None:
        pairs = [("llama3-8b", t) for t in (1024, 4096, 16384, 32768)]
        pairs += [("llama3-70b", t) for t in (1024, 4096, 8192)]
    else:
        pairs = [(m, t) for m in (models or ["llama3-8b", "llama3-70b"])
                 for t in (tokens or [1024, 4096, 16384])]
    kv = [KvCase(PRESETS[m], t, page_tokens, mode) for m, t in pairs for mode in KV_MODES]
    budget = Budget(0.5, 5, 20000, 4).scaled(budget_scale)
    return Plan(tuple(cases), tuple(kv), 512 * MIB, budget,
                Budget(1.0, 3, 10, 1).scaled(budget_scale))


def cold_bytes_for(plan: Plan) -> int:
    """Cold buffers hold at least two of the largest request, so rotation never repeats at once."""
    need = 2 * plan.max_request_bytes()
    return max(plan.cold_bytes, ((need + MIB - 1) // MIB) * MIB)
