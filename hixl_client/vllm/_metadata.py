"""What the scheduler half tells the worker half each step, and what the workers
tell the scheduler once at start-up (vLLM's connector metadata types)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
)

from ._params import RemoteBlocks


@dataclass
class HixlHandshake(KVConnectorHandshakeMetadata):
    """One worker's facts for the prefill side's kv_transfer_params."""

    peer_address: str
    cluster_id: int
    layout: str
    kv_shape: tuple[int, ...] = ()  # KvShape.to_list(); () without a run view
    family: str = ""


@dataclass(frozen=True)
class Load:
    """Pull ``remote``'s blocks into ``block_ids`` (this instance's, in order).

    With ``num_tokens`` 0 the two lists pair up block for block. Otherwise the
    blocks differ in size: ``block_ids`` hold tokens ``[first_token,
    num_tokens)`` and ``remote.block_ids`` every token from the first, and
    they move as runs (``_kv_map``).
    """

    request_id: str
    block_ids: tuple[int, ...]
    remote: RemoteBlocks
    first_token: int = 0
    num_tokens: int = 0


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
