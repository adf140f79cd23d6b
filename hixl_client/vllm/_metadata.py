"""What the scheduler half tells the worker half each step, and what the workers
tell the scheduler once at start-up (vLLM's connector metadata types)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
)

from ._params import Load, RemoteBlocks, Saved


@dataclass
class HixlHandshake(KVConnectorHandshakeMetadata):
    """One worker's facts for the prefill side's kv_transfer_params."""

    peer_address: str
    cluster_id: int
    layout: str
    kv_shape: tuple[int, ...] = ()  # KvShape.to_list(); () without a run view
    family: str = ""


@dataclass
class HixlConnectorMetadata(KVConnectorMetadata):
    """One step's work for the workers."""

    # Decode side: requests whose blocks were allocated, to pull now.
    loads: list[Load] = field(default_factory=list)
    # Prefill side: finished requests whose blocks the scheduler keeps until a
    # worker reports them in finished_sending (their decode side is done, or
    # their lease ended).
    holds: list[str] = field(default_factory=list)
    # Decode side: requests still queued here whose prefill blocks must stay
    # (lease renewal), and requests that ended without pulling (release now).
    waiting: list[RemoteBlocks] = field(default_factory=list)
    abandoned: list[RemoteBlocks] = field(default_factory=list)
    # Prefill side, push mode: requests whose KV may be pushed, whole or as
    # this step computes each layer.
    saves: list[Saved] = field(default_factory=list)
