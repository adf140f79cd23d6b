"""Layer-wise transfers (transfer_cache_async) on the daemon side.

A task is resolved once (every target's cache, one peer call each) and then
fed layer by layer: each "layer ready" signal from the client sends that
layer to every target that needs it, and reports one progress entry per
target. The first failure ends the task, as in LLM-DataDist.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hixl_client._proto.hixl.v1 import client_pb2
from hixl_client.status import LLMException, LLMStatusCode

from .cluster import Cluster
from .engine import Engine
from .links import OutboundLink
from .peer_client import ref_from_proto
from .planning import Range, plan_blocks, plan_cache_pull, plan_slot_to_blocks
from .registry import CacheEntry
from .transfers import Peer, entry_layout, find_target

TENSORS_PER_LAYER = 2  # transfer_cache_async moves K and V of each layer


def _invalid(message: str) -> LLMException:
    return LLMException(message, status_code=LLMStatusCode.LLM_PARAM_INVALID)


@dataclass
class Target:
    """One transfer config, resolved."""

    index: int
    spec: client_pb2.TransferTarget
    link: OutboundLink
    peer: Peer

    def dst_layer(self, layer: int) -> int:
        return self.spec.dst_layer_start + (layer - self.spec.src_layer_start)

    def needs(self, layer: int) -> bool:
        return self.spec.src_layer_start <= layer < self.spec.src_layer_stop


class LayerwiseTask:
    """The daemon's half of one transfer_cache_async call."""

    def __init__(self, engine: Engine, cluster: Cluster, start: client_pb2.TransferStart) -> None:
        self._engine = engine
        self._cluster = cluster
        self._start = start
        self.source: CacheEntry = cluster.registry.get(start.src_cache_id)
        if self.source.num_tensors % TENSORS_PER_LAYER:
            raise _invalid(f"num_tensors {self.source.num_tensors} is not even")
        self.num_layers = self.source.num_tensors // TENSORS_PER_LAYER
        self.targets: list[Target] = []
        self.failed = False

    async def prepare(self) -> list[client_pb2.TransferProgress]:
        """Resolve every target; return failure reports (empty when all resolved)."""
        deadline = asyncio.get_running_loop().time() + self._cluster.settings.sync_timeout_s
        for index, spec in enumerate(self._start.targets):
            try:
                if spec.dst_addrs:
                    raise LLMException(
                        "TransferConfig with raw dst_addrs is not supported by this daemon yet; "
                        "enable_remote_cache_accessible and use TransferWithCacheKeyConfig",
                        status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
                if not spec.src_layer_start < spec.src_layer_stop <= self.num_layers:
                    raise _invalid(f"src_layer_range [{spec.src_layer_start}, "
                                   f"{spec.src_layer_stop}) is out of range for "
                                   f"{self.num_layers} layers")
                ref = ref_from_proto(spec.dst)
                if ref is None:
                    raise _invalid("the transfer config names no destination cache")
                link = self._cluster.link_to(ref.cluster_id)
                peer = await find_target(self._engine, self._cluster, link, ref, deadline)
                if not peer.writable:
                    raise _invalid("the destination cache is not remote-accessible")
                self.targets.append(Target(index, spec, link, peer))
            except LLMException as exc:
                self.failed = True
                return [client_pb2.TransferProgress(target=index, status=exc.status_code,
                                                    message=str(exc))]
        return []

    def _ranges(self, target: Target, layer: int) -> list[Range]:
        dst_layer = target.dst_layer(layer)
        pairs = [(layer * TENSORS_PER_LAYER + k, dst_layer * TENSORS_PER_LAYER + k)
                 for k in range(TENSORS_PER_LAYER)]
        if dst_layer * TENSORS_PER_LAYER + 1 >= target.peer.layout.num_tensors:
            raise _invalid(f"destination layer {dst_layer} is out of range")
        src = entry_layout(self.source)
        if self.source.blocks:
            if not target.peer.blocks:
                raise _invalid("transfer from blocks to cache is not supported")
            return plan_blocks(src, target.peer.layout, pairs, self._start.src_blocks,
                               self._start.dst_blocks)
        if target.peer.blocks:
            if target.peer.layout.stride != self._start.dst_block_memory_size:
                raise _invalid(f"dst_block_memory_size {self._start.dst_block_memory_size} "
                               f"is not the destination block size {target.peer.layout.stride}")
            return plan_slot_to_blocks(src, target.spec.src_batch_index, target.peer.layout,
                                       pairs, self._start.dst_blocks)
        ranges, _ = plan_cache_pull(src, target.spec.src_batch_index, target.peer.layout,
                                    target.peer.batch_index, src.stride, pairs)
        return ranges

    async def _send(self, target: Target, layer: int) -> None:
        ranges = self._ranges(target, layer)
        source = self.source.memory
        if target.peer.memory is not None:
            await self._engine.deps.copier.copy(target.peer.memory, source, ranges)
            return
        timeout_ms = self._cluster.settings.sync_timeout_ms
        await target.link.write(self._engine.deps.dispatcher, source, target.peer.region_id,
                                ranges, timeout_ms)

    async def send_layer(self, layer: int) -> list[client_pb2.TransferProgress]:
        """Send one source layer to every target that needs it; report per target."""
        if not 0 <= layer < self.num_layers:
            raise _invalid(f"layer {layer} is out of range for {self.num_layers} layers")
        reports = []
        for target in self.targets:
            if not target.needs(layer):
                continue
            try:
                await self._send(target, layer)
            except LLMException as exc:
                self.failed = True
                reports.append(client_pb2.TransferProgress(
                    target=target.index, layer=layer, status=exc.status_code, message=str(exc)))
                break
            reports.append(client_pb2.TransferProgress(
                target=target.index, layer=layer, status=LLMStatusCode.LLM_SUCCESS,
                target_done=layer == target.spec.src_layer_stop - 1))
        return reports
