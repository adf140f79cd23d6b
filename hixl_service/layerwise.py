"""Layer-wise transfers (transfer_cache_async) on the daemon side.

A task is resolved once (every target's cache, one peer call each) and then
fed layer by layer: each "layer ready" signal from the client sends that
layer to every target that needs it, and reports one progress entry per
target. The first failure ends the task, as in LLM-DataDist.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hixl_wire._proto.hixl.v1 import client_pb2
from hixl_wire.status import LLMException, LLMStatusCode
from hixl_wire.status import param_invalid as _invalid

from . import tracing
from .cluster import Cluster
from .links import FarCache, OutboundLink
from .peer_client import ref_from_proto
from .planning import (
    Layout,
    Ranges,
    as_ranges,
    block_array,
    plan_blocks,
    plan_cache_pull,
    plan_slot_to_blocks,
    total_bytes,
)
from .registry import CacheEntry
from .stats import DaemonStats
from .transfer_log import failed
from .transfers import find_target
from .transports.base import Place

TENSORS_PER_LAYER = 2  # transfer_cache_async moves K and V of each layer



@dataclass(frozen=True)
class TensorStart:
    """Where one destination tensor of a TransferConfig starts."""

    place: Place
    offset: int  # inside the region (remote) or the memory (local)


@dataclass
class Target:
    """One transfer config, resolved: a cache found by key, or raw addresses."""

    index: int
    spec: client_pb2.TransferTarget
    link: OutboundLink
    peer: FarCache | None = None
    places: list[TensorStart] | None = None  # TransferConfig: K and V of each destination layer

    def dst_layer(self, layer: int) -> int:
        return self.spec.dst_layer_start + (layer - self.spec.src_layer_start)

    def needs(self, layer: int) -> bool:
        return self.spec.src_layer_start <= layer < self.spec.src_layer_stop


class LayerwiseTask:
    """The daemon's half of one transfer_cache_async call."""

    def __init__(self, cluster: Cluster, start: client_pb2.TransferStart,
                 stats: DaemonStats) -> None:
        self._cluster = cluster
        self._stats = stats
        # The task's span (tracing on): its layers are children of it, whichever
        # call (the stream, or a LayerReady on a lane) announced them.
        self._trace_context = tracing.current_context() if tracing.ENABLED else None
        self._start = start
        # Converted once, not at every layer (see planning.block_list).
        self._src_blocks = block_array(start.src_blocks)
        self._dst_blocks = block_array(start.dst_blocks)
        # Destination blocks a TransferConfig tensor spans: up to the highest named.
        self._dst_block_count = int(self._dst_blocks.max()) + 1 if len(self._dst_blocks) else 0
        self.source: CacheEntry = cluster.registry.get(start.src_cache_id)
        if self.source.num_tensors % TENSORS_PER_LAYER:
            raise _invalid(f"num_tensors {self.source.num_tensors} is not even")
        self.num_layers = self.source.num_tensors // TENSORS_PER_LAYER
        self.targets: list[Target] = []
        self.failed = False
        self.ended = False  # its stream ended: no more layers
        # Layers that arrive as LayerReady calls run one at a time, in order.
        self.layers_in_order = asyncio.Lock()

    async def prepare(self) -> list[client_pb2.TransferProgress]:
        """Resolve every target; return failure reports (empty when all resolved)."""
        deadline = asyncio.get_running_loop().time() + self._cluster.settings.sync_timeout_s
        for index, spec in enumerate(self._start.targets):
            remote = spec.dst_cluster_id
            try:
                if not spec.src_layer_start < spec.src_layer_stop <= self.num_layers:
                    raise _invalid(f"src_layer_range [{spec.src_layer_start}, "
                                   f"{spec.src_layer_stop}) is out of range for "
                                   f"{self.num_layers} layers")
                if spec.dst_addrs:
                    self.targets.append(await self._address_target(index, spec, deadline))
                    continue
                ref = ref_from_proto(spec.dst)
                if ref is None:
                    raise _invalid("the transfer config names no destination cache")
                remote = ref.cluster_id
                link = self._cluster.link_to(ref.cluster_id)
                peer = await find_target(self._cluster, link, ref, deadline, fresh=True)
                if not peer.writable:
                    raise _invalid("the destination cache is not remote-accessible")
                self.targets.append(Target(index, spec, link, peer))
            except LLMException as exc:
                self.failed = True
                failed(self._cluster, remote, f"TransferCache target {index}", exc)
                return [client_pb2.TransferProgress(target=index, status=exc.status_code,
                                                    message=str(exc))]
        return []

    def _span(self) -> int:
        """Bytes a TransferConfig destination tensor receives, from its address on."""
        src = self.source.layout
        if self.source.blocks:
            return self._dst_block_count * src.stride
        if self._dst_block_count:
            return self._dst_block_count * self._start.dst_block_memory_size
        return src.stride

    async def _address_target(self, index: int, spec: client_pb2.TransferTarget,
                              deadline: float) -> Target:
        link = self._cluster.link_to(spec.dst_cluster_id)
        addresses = list(spec.dst_addrs)
        layers = spec.src_layer_stop - spec.src_layer_start
        if len(addresses) != TENSORS_PER_LAYER * layers:
            raise _invalid(f"expect {TENSORS_PER_LAYER * layers} dst_addrs, "
                           f"got {len(addresses)}")
        span = self._span()
        remaining = deadline - asyncio.get_running_loop().time()
        found = await link.far.find_addresses(addresses, span, remaining)
        if not all(writable for _, _, writable in found):
            raise _invalid("a destination address lies in a cache that is not open to "
                           "remote writes")
        places = [TensorStart(place, offset) for place, offset, _ in found]
        return Target(index, spec, link, places=places)

    def _address_ranges(self, target: Target, layer: int) -> list[tuple[Place, Ranges]]:
        assert target.places is not None
        src = self.source.layout
        first = (layer - target.spec.src_layer_start) * TENSORS_PER_LAYER
        groups = []
        for k in range(TENSORS_PER_LAYER):
            start = target.places[first + k]
            tensor_start = src.tensor_offsets[layer * TENSORS_PER_LAYER + k]
            # The destination is one tensor at `start`: describe it as a
            # one-tensor layout so the same planners apply.
            if self.source.blocks:
                block = src.stride
                count = self._dst_block_count
                dst = Layout([start.offset], block * count, count)
                ranges = plan_blocks(Layout([tensor_start], src.tensor_size, src.batch_size),
                                     dst, [(0, 0)], self._src_blocks, self._dst_blocks)
            elif self._dst_block_count:
                size = self._start.dst_block_memory_size
                count = self._dst_block_count
                ranges = plan_slot_to_blocks(Layout([tensor_start], src.tensor_size,
                                                    src.batch_size),
                                             target.spec.src_batch_index,
                                             Layout([start.offset], size * count, count),
                                             [(0, 0)], self._dst_blocks)
            else:
                ranges = as_ranges([(tensor_start + target.spec.src_batch_index * src.stride,
                                     start.offset, src.stride)])
            groups.append((start.place, ranges))
        return groups

    def _ranges(self, target: Target, layer: int) -> Ranges:
        assert target.peer is not None
        dst_layer = target.dst_layer(layer)
        pairs = [(layer * TENSORS_PER_LAYER + k, dst_layer * TENSORS_PER_LAYER + k)
                 for k in range(TENSORS_PER_LAYER)]
        if dst_layer * TENSORS_PER_LAYER + 1 >= target.peer.layout.num_tensors:
            raise _invalid(f"destination layer {dst_layer} is out of range")
        src = self.source.layout
        if self.source.blocks:
            if not target.peer.blocks:
                raise _invalid("transfer from blocks to cache is not supported")
            return plan_blocks(src, target.peer.layout, pairs, self._src_blocks,
                               self._dst_blocks)
        if target.peer.blocks:
            if target.peer.layout.stride != self._start.dst_block_memory_size:
                raise _invalid(f"dst_block_memory_size {self._start.dst_block_memory_size} "
                               f"is not the destination block size {target.peer.layout.stride}")
            return plan_slot_to_blocks(src, target.spec.src_batch_index, target.peer.layout,
                                       pairs, self._dst_blocks)
        ranges, _ = plan_cache_pull(src, target.spec.src_batch_index, target.peer.layout,
                                    target.peer.batch_index, src.stride, pairs)
        return ranges

    async def _send(self, target: Target, layer: int) -> int:
        """Write one layer to one target; returns the bytes written."""
        source = self.source.memory
        timeout_ms = self._cluster.settings.sync_timeout_ms
        write = target.link.transport.write
        # Fenced: a source freed during the task sends nothing more (its extent
        # may hold another cache by the next layer), and waits for this write.
        with self.source.in_use():
            if target.places is not None:
                moved = 0
                for place, ranges in self._address_ranges(target, layer):
                    self.source.check_present()
                    await write(source, place, ranges, timeout_ms)
                    moved += total_bytes(ranges)
                return moved
            assert target.peer is not None
            ranges = self._ranges(target, layer)
            self.source.check_present()
            await write(source, target.peer.place, ranges, timeout_ms)
            return total_bytes(ranges)

    async def send_layer(self, layer: int) -> list[client_pb2.TransferProgress]:
        """Send one source layer to every target that needs it; report per target."""
        if not 0 <= layer < self.num_layers:
            raise _invalid(f"layer {layer} is out of range for {self.num_layers} layers")
        reports = []
        for target in self.targets:
            if not target.needs(layer):
                continue
            transport = target.link.transport.name
            try:
                if tracing.ENABLED:
                    with tracing.child_span("hixl.daemon.layer", self._trace_context,
                                            layer=layer,
                                            target=target.index, transport=transport):
                        moved = await self._send(target, layer)
                else:
                    moved = await self._send(target, layer)
            except LLMException as exc:
                self._stats.call_failed("LayerReady", exc.status_code, transport)
                self.failed = True
                failed(self._cluster, target.link.remote_cluster_id,
                       f"TransferCache target {target.index} layer {layer}", exc)
                reports.append(client_pb2.TransferProgress(
                    target=target.index, layer=layer, status=exc.status_code, message=str(exc)))
                break
            self._stats.copied("layer", transport, moved)
            reports.append(client_pb2.TransferProgress(
                target=target.index, layer=layer, status=LLMStatusCode.LLM_SUCCESS,
                target_done=layer == target.spec.src_layer_stop - 1))
        return reports
