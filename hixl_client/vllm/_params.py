"""What the connector's halves agree on, without importing vLLM: its settings,
cluster ids, the ``kv_transfer_params`` a prefill instance hands out, and the
notification messages between instances."""

from __future__ import annotations

import dataclasses
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
# Push mode: the prefill instance pushes ("push") or is pulled from ("pull"),
# and the key it knows the request by (its own request id, or one the proxy
# gave both instances when it sends the decode request first).
MODE = "hixl_mode"
TRANSFER = "hixl_transfer"
# A probe: the prefill instance answers with its identity and keeps nothing.
PROBE = "hixl_probe"
MODES = ("pull", "push")

# Notification names (NotifyDesc.name); each message is request ids, one a line.
DONE = "hixl-vllm/done"    # the decode side is done with these blocks: free them
HOLD = "hixl-vllm/hold"    # the decode side still wants these blocks: renew the lease
# Push mode, messages of one JSON object each (Want, Pushed).
WANT = "hixl-vllm/want"    # decode to prefill: push this request's KV into these blocks
PUSHED = "hixl-vllm/pushed"  # prefill to decode: the push of a request ended


@dataclass(frozen=True)
class Settings:
    """``kv_connector_extra_config`` of the connector, checked.

    Args:
        daemon: the local hixl daemon's client target.
        lease_s: how long a prefill instance keeps a finished request's blocks
            for a decode instance that has not said it is done (renewed while
            the decode instance waits to pull).
        load_timeout_ms: bounds one request's pull, and each push (hixl's
            sync_kv_timeout).
        mode: "pull" (the decode instance pulls after the prefill finished)
            or "push" (the prefill instance pushes each layer as it is
            computed, once the decode instance said where: ``_push``).
        push_timeout_ms: push mode, decode side: bounds the wait for a
            request's pushes, which includes the prefill instance's compute
            when the proxy sent both requests at once.
    """

    daemon: str
    lease_s: float = 30.0
    load_timeout_ms: int = 10000
    mode: str = "pull"
    push_timeout_ms: int = 120000

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> Settings:
        """Read the extra config; unknown keys and bad values are refused.

        Raises:
            ValueError: an unknown key or a value of the wrong kind.
        """
        extra = dict(extra or {})
        known = {"daemon", "lease_s", "load_timeout_ms", "mode", "push_timeout_ms"}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"HixlConnector: unknown kv_connector_extra_config keys "
                             f"{unknown}; known: {sorted(known)}")
        daemon = extra.get("daemon") or os.environ.get("HIXL_DAEMON") or default_daemon_target()
        lease_s = extra.get("lease_s", 30.0)
        timeout_ms = extra.get("load_timeout_ms", 10000)
        push_timeout_ms = extra.get("push_timeout_ms", 120000)
        if not isinstance(daemon, str):
            raise ValueError(f"HixlConnector: daemon must be a gRPC target string, got {daemon!r}")
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or lease_s <= 0:
            raise ValueError(f"HixlConnector: lease_s must be seconds > 0, got {lease_s!r}")
        for name, value in (("load_timeout_ms", timeout_ms),
                            ("push_timeout_ms", push_timeout_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    0 < value < 2**31):
                raise ValueError(f"HixlConnector: {name} must be a positive int32, "
                                 f"got {value!r}")
        mode = extra.get("mode", "pull")
        if mode not in MODES:
            raise ValueError(f"HixlConnector: mode must be one of {list(MODES)}, got {mode!r}")
        return cls(daemon, float(lease_s), timeout_ms, mode, push_timeout_ms)


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
    mode: str = "pull"  # the prefill instance's
    transfer: str = ""  # the key the prefill instance knows the request by (push mode)

    @property
    def pushes(self) -> bool:
        """The prefill instance pushes this request when asked (a Want)."""
        return self.mode == "push" and bool(self.transfer)

    def to_params(self) -> dict[str, Any]:
        """The kv_transfer_params a decode request carries (JSON values only)."""
        return {DO_REMOTE_PREFILL: True, DO_REMOTE_DECODE: False, ENGINE: self.engine_id,
                REQUEST: self.request_id, BLOCKS: list(self.block_ids),
                TOKENS: self.num_tokens, PEER: self.peer_address,
                CLUSTERS: list(self.cluster_ids), LAYOUT: self.layout,
                KV_SHAPE: list(self.kv_shape), FAMILY: self.family, MODE: self.mode,
                TRANSFER: self.transfer}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RemoteBlocks | None:
        """Read kv_transfer_params; None when they name neither blocks to pull
        nor a prefill instance that pushes (the proxy's push flow names no
        blocks: the prefill has not run yet)."""
        try:
            blocks = tuple(int(b) for b in params.get(BLOCKS) or ())
            clusters = tuple(int(c) for c in params[CLUSTERS])
            found = cls(str(params[ENGINE]), str(params.get(REQUEST) or ""), blocks,
                        int(params.get(TOKENS) or 0), str(params[PEER]), clusters,
                        str(params[LAYOUT]), tuple(int(v) for v in params.get(KV_SHAPE) or ()),
                        str(params.get(FAMILY) or ""), str(params.get(MODE) or "pull"),
                        str(params.get(TRANSFER) or ""))
        except (KeyError, TypeError, ValueError):
            return None
        if not found.cluster_ids or not (found.block_ids or found.pushes):
            return None
        return found


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
    push: bool = False  # ask the prefill instance to push instead (push mode)


@dataclass(frozen=True)
class Saved:
    """Prefill side, push mode: a request whose KV this worker pushes when asked.

    ``whole``: every layer is computed (the request finished); otherwise its
    whole prompt is computed in this step, and each layer may go as soon as
    vLLM saves it (``save_kv_layer``).
    """

    request_id: str
    transfer: str
    block_ids: tuple[int, ...]
    num_tokens: int
    whole: bool


@dataclass(frozen=True)
class Want:
    """Decode to prefill, push mode: push ``transfer``'s KV into these blocks.

    It carries the decode worker's facts (``_sources.Worker``), so the prefill
    worker computes the pulls the decode worker would have made, and makes its
    own share of them as pushes. ``tellers``: how many decode workers want
    this prefill worker's part (it frees its blocks after the last).
    """

    transfer: str
    cluster_id: int
    peer_address: str
    rank: int
    ranks: int
    layout: str
    family: str
    kv_shape: tuple[int, ...]
    block_size: int
    block_ids: tuple[int, ...]
    first_token: int
    num_tokens: int
    tellers: int

    def to_message(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_message(cls, message: bytes) -> Want:
        """Raises ValueError on a message that is not a Want."""
        try:
            fields = json.loads(message)
            want = cls(**fields)
            return dataclasses.replace(want, kv_shape=tuple(want.kv_shape),
                                       block_ids=tuple(want.block_ids))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a push request: {exc}") from exc


@dataclass(frozen=True)
class Pushed:
    """Prefill to decode, push mode: prefill rank ``rank``'s push of
    ``transfer`` ended (``error`` empty: every byte landed)."""

    transfer: str
    rank: int
    error: str = ""

    def to_message(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_message(cls, message: bytes) -> Pushed:
        """Raises ValueError on a message that is not a Pushed."""
        try:
            return cls(**json.loads(message))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a push report: {exc}") from exc


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
