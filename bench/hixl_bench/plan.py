"""The sweeps: which cases a quick or a full run measures, and the KV model presets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hixl_bench.model import KIB, MIB, Budget, Case, ceiling_shape

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


# Serving-pattern memory: registered shareable memory, blocks caches from the
# cluster's pool, and memory the engine allocated itself (a plain numpy array).
SERVE_MEMORY = ("shareable", "pool", "engine")
SERVE_CLIENTS = ("async", "sync")
# Small layouts of the serving suite, for the shapes issue 20 measured: one
# layer (K and V), 16-token blocks of 16 KiB and of 4 KiB.
SERVE_LAYOUTS = {
    preset.name: preset
    for preset in (
        ModelPreset("kv-2x16k", layers=1, kv_heads=4, head_dim=128),
        ModelPreset("kv-2x4k", layers=1, kv_heads=1, head_dim=128),
    )
}
# A serving cache holds this much more than the requests in flight need: the
# blocks of other requests and the free ones among which a request's lie.
SERVE_SLACK = 1.25
SERVE_SLACK_BLOCKS = 8
SERVE_POOL_MAX_BYTES = 1 << 30
SERVE_BUDGET = Budget(0.5, 5, 2000, 2)
SERVE_QUICK_BUDGET = Budget(0.3, 3, 500, 1)


@dataclass(frozen=True)
class ServeCase:
    """A decode instance pulling prompts from a prefill instance, as serving engines do.

    Both sides hold a paged KV cache of ``pool_blocks`` blocks per tensor; each
    request pulls one prompt's blocks, listed in block tables drawn at random
    from each side's cache (see ``serve.block_tables``), every layer at once.

    Attributes:
        model: the KV layout (``2 * layers`` tensors).
        dtype: ``fp16`` or ``bf16``.
        tokens: prompt length.
        block_tokens: tokens per block.
        conc: requests in flight.
        memory: one of SERVE_MEMORY, on both sides.
        client: ``async`` (hixl_client) or ``sync`` (the blocking facade, in a
            process of its own).
    """

    model: ModelPreset
    dtype: str
    tokens: int
    block_tokens: int
    conc: int = 1
    memory: str = "shareable"
    client: str = "async"

    @property
    def blocks(self) -> int:
        """Blocks of one prompt, per tensor."""
        return math.ceil(self.tokens / self.block_tokens)

    @property
    def tensors(self) -> int:
        return 2 * self.model.layers

    @property
    def block_bytes(self) -> int:
        """One block of one tensor: the contiguous range a request moves."""
        m = self.model
        return self.block_tokens * m.kv_heads * m.head_dim * m.dtype_bytes

    @property
    def ranges(self) -> int:
        return self.tensors * self.blocks

    @property
    def request_bytes(self) -> int:
        return self.ranges * self.block_bytes

    @property
    def pool_blocks(self) -> int:
        """Blocks per tensor of each side's cache (a multiple of ``conc``)."""
        need = math.ceil(self.blocks * self.conc * SERVE_SLACK) + SERVE_SLACK_BLOCKS
        return -(-need // self.conc) * self.conc

    @property
    def cache_bytes(self) -> int:
        return self.tensors * self.pool_blocks * self.block_bytes

    def ceiling_shape(self, cold_bytes: int) -> tuple[int, int]:
        """The raw TCP ceiling's shape: the bytes of every request in flight as
        ranges of the same size, as many as half the cold buffers hold."""
        block, count = ceiling_shape(self.block_bytes, self.ranges, self.conc)
        return block, max(1, min(count, cold_bytes // 2 // block))

    def label(self) -> str:
        return f"{self.model.name} {self.dtype} {self.tokens} tok/{self.block_tokens}"


@dataclass(frozen=True)
class Plan:
    """Everything one run measures."""

    cases: tuple[Case, ...]
    kv_cases: tuple[KvCase, ...]
    cold_bytes: int
    budget: Budget
    kv_budget: Budget
    serve_cases: tuple[ServeCase, ...] = ()
    serve_budget: Budget = SERVE_BUDGET

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


def _serve(models: list[str], dtype: str, tokens: list[int], block_tokens: list[int],
           **fields: object) -> list[ServeCase]:
    return [ServeCase(_layout(m), dtype, t, b, **fields)  # type: ignore[arg-type]
            for m in models for t in tokens for b in block_tokens]


def _layout(name: str) -> ModelPreset:
    return SERVE_LAYOUTS.get(name) or PRESETS[name]


def serve_plan(quick: bool, models: list[str] | None = None,
               tokens: list[int] | None = None) -> tuple[tuple[ServeCase, ...], Budget]:
    """The serving suite's cases and per-row budget.

    The default cases hold the target rows of issue 20 (point 5) and the
    shapes it measured; ``models`` / ``tokens`` replace them by every
    combination of those (both block sizes, each memory and client, one and
    four in flight), for a narrower or a tiny run."""
    if models or tokens:
        chosen = models or ["llama3-8b"]
        lengths = tokens or [1024]
        cases = [c for memory in SERVE_MEMORY for client in SERVE_CLIENTS
                 for c in _serve(chosen, "fp16", lengths, [16, 128], memory=memory,
                                 client=client)]
        cases += [c for client in SERVE_CLIENTS
                  for c in _serve(chosen, "bf16", lengths, [16], conc=4, client=client)]
        # Pools are allocated whole and pre-faulted in both daemons: only small ones.
        cases = [c for c in cases if c.memory != "pool" or c.cache_bytes <= SERVE_POOL_MAX_BYTES]
        return tuple(cases), SERVE_QUICK_BUDGET
    small = "kv-2x16k"
    cases = []
    for memory in SERVE_MEMORY:
        for client in SERVE_CLIENTS:
            # 16 random blocks x 2 tensors x 16 KiB (512 KiB) and a 1k-token Llama-3-8B prompt.
            cases += _serve([small], "fp16", [256], [16], memory=memory, client=client)
            cases += _serve(["llama3-8b"], "fp16", [1024], [16, 128], memory=memory,
                            client=client)
    if quick:
        cases += _serve(["kv-2x4k"], "fp16", [2048], [16])  # 128 x 2 x 4 KiB
        cases += _serve(["llama3-70b"], "bf16", [128], [16, 128])
        cases += _serve([small], "fp16", [256], [16], conc=16)
        cases += _serve(["llama3-8b"], "fp16", [1024], [16], conc=4)
        return tuple(cases), SERVE_QUICK_BUDGET
    cases += _serve([small], "fp16", [1024], [16])  # 64 x 2 x 16 KiB
    cases += _serve(["kv-2x4k"], "fp16", [2048], [16])
    cases += _serve(["llama3-8b"], "fp16", [128, 4096], [16, 128])
    cases += _serve(["llama3-8b"], "fp16", [32768], [128])
    cases += _serve(["llama3-8b"], "bf16", [1024], [16, 128])
    cases += _serve(["llama3-70b"], "bf16", [128, 1024, 4096], [16, 128])
    for conc in (4, 16):
        cases += _serve([small], "fp16", [256], [16], conc=conc)
        cases += _serve(["llama3-8b"], "fp16", [1024], [16, 128], conc=conc)
        cases += _serve(["llama3-8b"], "fp16", [1024], [128], conc=conc, client="sync")
    cases += _serve(["llama3-70b"], "bf16", [1024], [128], conc=4)
    return tuple(cases), SERVE_BUDGET


# The serving suite's ceilings move up to this many bytes per request (the
# cold buffers hold two): larger add nothing to the raw TCP pair's GB/s here.
SERVE_CEILING_MAX_BYTES = 128 * MIB


def cold_bytes_for(plan: Plan) -> int:
    """Cold buffers hold at least two of the largest request, so rotation never repeats at once."""
    serve = [min(SERVE_CEILING_MAX_BYTES, c.request_bytes * c.conc) for c in plan.serve_cases]
    need = 2 * max([plan.max_request_bytes(), *serve])
    return max(plan.cold_bytes, ((need + MIB - 1) // MIB) * MIB)
