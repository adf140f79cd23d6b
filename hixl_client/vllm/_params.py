"""What the connector's halves agree on, without importing vLLM: its settings,
cluster ids, the ``kv_transfer_params`` a prefill instance hands out, and the
notification messages between instances."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._defaults import default_daemon_target

# vLLM configures its "vllm" logger only: the connector logs under it, so its
# lines land in the engine's log with vLLM's own.
LOGGER_NAME = "vllm.hixl_connector"

# kv_transfer_params keys of vLLM's own P/D flow (its proxies read and pass them).
DO_REMOTE_DECODE = "do_remote_decode"
DO_REMOTE_PREFILL = "do_remote_prefill"
# kv_transfer_params keys of this connector: where the prefill instance's blocks lie.
ENGINE = "remote_engine_id"
REQUEST = "remote_request_id"
BLOCKS = "remote_block_ids"
TOKENS = "remote_num_tokens"
PEER = "hixl_peer_address"
CLUSTERS = "hixl_cluster_ids"
LAYOUT = "hixl_layout"
# The KV shape ([block size, KV heads, head size, item size]) and its layout
# family (every part of the layout but the block size): blocks of another
# size move as runs (``_kv_map``) within one family.
KV_SHAPE = "hixl_kv_shape"
FAMILY = "hixl_layout_family"

# Notification names (NotifyDesc.name); each message is request ids, one a line.
DONE = "hixl-vllm/done"    # the decode side is done with these blocks: free them
HOLD = "hixl-vllm/hold"    # the decode side still wants these blocks: renew the lease


@dataclass(frozen=True)
class Settings:
    """``kv_connector_extra_config`` of the connector, checked.

    Args:
        daemon: the local hixl daemon's client target.
        lease_s: how long a prefill instance keeps a finished request's blocks
            for a decode instance that has not said it is done (renewed while
            the decode instance waits to pull).
        load_timeout_ms: bounds one request's pull (hixl's sync_kv_timeout).
    """

    daemon: str
    lease_s: float = 30.0
    load_timeout_ms: int = 10000

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> Settings:
        """Read the extra config; unknown keys and bad values are refused.

        Raises:
            ValueError: an unknown key or a value of the wrong kind.
        """
        extra = dict(extra or {})
        known = {"daemon", "lease_s", "load_timeout_ms"}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"HixlConnector: unknown kv_connector_extra_config keys "
                             f"{unknown}; known: {sorted(known)}")
        daemon = extra.get("daemon") or os.environ.get("HIXL_DAEMON") or default_daemon_target()
        lease_s = extra.get("lease_s", 30.0)
        timeout_ms = extra.get("load_timeout_ms", 10000)
        if not isinstance(daemon, str):
            raise ValueError(f"HixlConnector: daemon must be a gRPC target string, got {daemon!r}")
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or lease_s <= 0:
            raise ValueError(f"HixlConnector: lease_s must be seconds > 0, got {lease_s!r}")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not (
                0 < timeout_ms < 2**31):
            raise ValueError(f"HixlConnector: load_timeout_ms must be a positive int32, "
                             f"got {timeout_ms!r}")
        return cls(daemon, float(lease_s), timeout_ms)


def cluster_id_of(engine_id: str, rank: int) -> int:
    """The hixl cluster id of one worker (its rank) of a vLLM engine: a stable
    63-bit hash, so both instances name it without asking anyone."""
    digest = hashlib.blake2b(f"{engine_id}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(frozen=True)
class RemoteBlocks:
    """Where a request's KV lies on the prefill instance (its kv_transfer_params)."""

    engine_id: str
    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int
    peer_address: str
    cluster_ids: tuple[int, ...]  # one per worker rank
    layout: str
    kv_shape: tuple[int, ...] = ()  # KvShape.to_list(); () when it has no run view
    family: str = ""

    def to_params(self) -> dict[str, Any]:
        """The kv_transfer_params a decode request carries (JSON values only)."""
        return {DO_REMOTE_PREFILL: True, DO_REMOTE_DECODE: False, ENGINE: self.engine_id,
                REQUEST: self.request_id, BLOCKS: list(self.block_ids),
                TOKENS: self.num_tokens, PEER: self.peer_address,
                CLUSTERS: list(self.cluster_ids), LAYOUT: self.layout,
                KV_SHAPE: list(self.kv_shape), FAMILY: self.family}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RemoteBlocks | None:
        """Read kv_transfer_params; None when they do not name blocks to pull."""
        try:
            blocks = tuple(int(b) for b in params[BLOCKS])
            clusters = tuple(int(c) for c in params[CLUSTERS])
            found = cls(str(params[ENGINE]), str(params[REQUEST]), blocks,
                        int(params.get(TOKENS) or 0), str(params[PEER]), clusters,
                        str(params[LAYOUT]), tuple(int(v) for v in params.get(KV_SHAPE) or ()),
                        str(params.get(FAMILY) or ""))
        except (KeyError, TypeError, ValueError):
            return None
        return found if found.block_ids and found.cluster_ids else None


@dataclass(frozen=True)
class Load:
    """Pull the prompt's tokens ``[first_token, num_tokens)`` from ``remote``'s
    blocks (``remote.block_ids[i]`` holds tokens from ``i`` blocks of its size on)
    into ``block_ids`` (this instance's, the first from ``first_token``)."""

    request_id: str
    block_ids: tuple[int, ...]
    remote: RemoteBlocks
    first_token: int
    num_tokens: int


def layout_fingerprint(model: str, dtype: str, block_size: int, regions: int,
                       block_bytes: int, kernel: str) -> str:
    """A short name for a KV layout: two instances may move whole blocks only
    when theirs are equal (same model, dtype, block size, tensor layout and the
    attention kernel that orders each block's bytes)."""
    text = json.dumps([model, dtype, block_size, regions, block_bytes, kernel])
    return f"{regions}x{block_bytes}B-" + hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def layout_family(model: str, dtype: str, regions: int, kv_heads: int, head_size: int,
                  kernel: str) -> str:
    """A short name for every part of a KV layout but its block size and
    tensor-parallel split (``kv_heads`` is the model's, not a rank's): two
    instances of one family move KV as runs (``_kv_map``) whatever theirs."""
    text = json.dumps([model, dtype, regions, kv_heads, head_size, kernel])
    return f"{regions}x{kv_heads}h{head_size}-" + \
        hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def requests_message(requests: Iterable[tuple[str, int]]) -> bytes:
    """A notification's message: one request a line, each with how many decode
    workers tell this prefill worker about it (after a tab, when more than one)."""
    return "\n".join(request_id if tellers == 1 else f"{request_id}\t{tellers}"
                     for request_id, tellers in requests).encode()


def requests_of(message: bytes) -> list[tuple[str, int]]:
    """The inverse of :func:`requests_message` (a count that is not a positive
    number counts as one)."""
    found = []
    for line in message.decode(errors="replace").split("\n"):
        request_id, _, count = line.partition("\t")
        if request_id:
            found.append((request_id, int(count) if count.isdigit() and int(count) > 0 else 1))
    return found
