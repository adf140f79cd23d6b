"""HixlConnector: vLLM's KV connector interface (``KVConnectorBase_V1``) over hixl.

vLLM builds one instance per role: the scheduler's holds no hixl session and
only keeps books (``_scheduler``); each worker's moves the bytes
(``_worker``). The worker's facts reach the scheduler through vLLM's
handshake metadata, once, after the KV cache is registered.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ._kv_layout import KvLayout, kv_layout_of
from ._kv_map import RUN_TOKENS, KvShape
from ._metadata import HixlConnectorMetadata, HixlHandshake
from ._params import LOGGER_NAME, Settings, cluster_id_of, layout_family, layout_fingerprint
from ._scheduler import HixlScheduler
from ._stats import HixlConnectorStats
from ._worker import HixlWorker

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


def _attention_kernel(vllm_config: VllmConfig) -> str:
    """The kernel whose layout vLLM's CPU attention keeps inside each block.

    Its ISA-specific kernels (vec, vec16, AMX, NEON...) each order a block's
    bytes their own way (vllm/v1/attention/backends/cpu_attn.py chooses one
    by CPU, dtype, block size and head size), so blocks move only between
    instances that chose the same kernel: an AMX host and one without AMX
    must not trade blocks. "" where the backend is not vLLM's CPU one.
    """
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except ImportError:
        return ""
    model, cache = vllm_config.model_config, vllm_config.cache_config
    try:
        return str(_get_attn_isa(model.dtype, cache.block_size, model.get_head_size(),
                                 cache.cache_dtype))
    except (NotImplementedError, TypeError):
        return ""


# The kernels whose block interiors _kv_map knows (K transposed, then V).
RUN_VIEW_KERNELS = frozenset({"vec", "vec16"})

logger = logging.getLogger(LOGGER_NAME)


def _kv_shape(vllm_config: VllmConfig, layout: KvLayout, kernel: str) -> KvShape | None:
    """This worker's KV shape, when its blocks can also move as runs (``_kv_map``)
    to and from instances with another block size; None otherwise."""
    model, cache = vllm_config.model_config, vllm_config.cache_config
    try:
        import torch

        itemsize = torch.empty((), dtype=getattr(torch, layout.dtype)).element_size()
        shape = KvShape(cache.block_size, model.get_num_kv_heads(vllm_config.parallel_config),
                        model.get_head_size(), itemsize)
    except (AttributeError, TypeError):  # a dtype mix, or no such model facts
        return None
    if kernel not in RUN_VIEW_KERNELS or shape.block_bytes != layout.block_bytes or \
            shape.block_size % RUN_TOKENS:
        logger.info("hixl: KV blocks of %d bytes (kernel %r) move only between instances of "
                    "the same block size", layout.block_bytes, kernel)
        return None
    return shape


def _tensor_parallel_rank() -> int:
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    try:
        return int(get_tensor_model_parallel_rank())
    except AssertionError:  # no parallel group (a single worker)
        return 0


class HixlConnector(KVConnectorBase_V1):
    """Disaggregated prefill/decode on hixl: the decode instance pulls a finished
    prefill's KV blocks straight into its own, and the prefill instance frees
    them when told (or when their lease ends).

    vLLM loads it with ``--kv-transfer-config '{"kv_connector": "HixlConnector",
    "kv_connector_module_path": "hixl_client.vllm", "kv_role": "kv_both",
    "kv_connector_extra_config": {"daemon": "unix:/run/hixl/hixl.sock"}}'``.
    Extra config keys: ``daemon`` (default ``$HIXL_DAEMON``, then the default
    socket), ``lease_s`` (30), ``load_timeout_ms`` (10000), ``mode`` ("pull",
    or "push": the prefill instance pushes each layer as it is computed),
    ``push_timeout_ms`` (120000: a decode request's wait for its pushes).
    """

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        transfer_config = vllm_config.kv_transfer_config
        settings = Settings.from_extra_config(transfer_config.kv_connector_extra_config)
        self._engine_id = str(transfer_config.engine_id)
        self._scheduler: HixlScheduler | None = None
        self._worker: HixlWorker | None = None
        self._layer_index: dict[str, int] = {}  # vLLM's layer names, in KV order
        self._saves_of: KVConnectorMetadata | None = None  # the step push mode knows
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = HixlScheduler(self._engine_id, settings,
                                            vllm_config.cache_config.block_size)
        else:
            rank = _tensor_parallel_rank()
            self._worker = HixlWorker(settings, cluster_id_of(self._engine_id, rank), rank,
                                      vllm_config.parallel_config.tensor_parallel_size,
                                      vllm_config.cache_config.block_size)

    # -- worker side -------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        layout = kv_layout_of(kv_caches, self._kv_cache_config.num_blocks)
        model = self._vllm_config.model_config
        architecture = str(getattr(model, "architecture", ""))
        kernel = _attention_kernel(self._vllm_config)
        fingerprint = layout_fingerprint(
            architecture, layout.dtype, self._vllm_config.cache_config.block_size,
            len(layout.addresses), layout.block_bytes, kernel)
        shape = _kv_shape(self._vllm_config, layout, kernel)
        family = "" if shape is None else layout_family(
            architecture, layout.dtype, len(layout.addresses),
            model.get_total_num_kv_heads(), shape.head_size, kernel)
        self._layer_index = {name: index for index, name in enumerate(kv_caches)}
        self._worker.register(layout, fingerprint, shape, family, len(kv_caches))

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return self._worker.handshake() if self._worker is not None else None

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        # vLLM calls this after the forward when the step has no sync loads.
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, HixlConnectorMetadata)
        self._begin_saves(meta)
        self._worker.start(meta)

    def _begin_saves(self, meta: HixlConnectorMetadata) -> None:
        """Hand push mode the step's requests once, before its first saved layer."""
        if meta is not self._saves_of:
            self._saves_of = meta
            assert self._worker is not None
            self._worker.begin_saves(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # whole requests load before vLLM schedules them

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        # Push mode: the layer's KV is written; it may go to the decode side now.
        if self._worker is not None and layer_name in self._layer_index:
            meta = self._get_connector_metadata()
            assert isinstance(meta, HixlConnectorMetadata)
            self._begin_saves(meta)
            self._worker.layer_saved(self._layer_index[layer_name])

    def wait_for_save(self) -> None:
        if self._worker is not None:
            self._worker.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None,
                                                                set[str] | None]:
        assert self._worker is not None
        sending, recving = self._worker.finished()
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_failed_blocks() if self._worker is not None else set()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self._worker.take_stats() if self._worker is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> KVConnectorStats | None:
        return HixlConnectorStats(data=data) if data is not None else HixlConnectorStats()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()

    # -- scheduler side ------------------------------------------------------------

    def set_xfer_handshake_metadata(
            self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        assert self._scheduler is not None
        self._scheduler.set_handshakes({rank: meta for rank, meta in metadata.items()
                                        if isinstance(meta, HixlHandshake)})

    def on_new_request(self, request: Request) -> None:
        assert self._scheduler is not None
        self._scheduler.on_new_request(request)

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request, block_ids)
