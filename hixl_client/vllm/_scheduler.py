"""The connector's scheduler half: bookkeeping only, no hixl calls.

Prefill side: a request that carries ``do_remote_decode`` keeps its blocks
after it finishes (``request_finished`` returns True) and hands out
kv_transfer_params naming them; the workers free them when the decode side
says it is done, or when the lease ends. Decode side: a request that carries
those params loads every prompt token asynchronously; the workers pull the
blocks this scheduler allocated for it.

Push mode: the decode side's loads ask for pushes when the prefill instance
pushes (its params say so); the prefill side tells its workers which
requests they may push, as each step computes a whole prompt and again when
the request finishes (``Saved``). A probe request gets the prefill
instance's identity in its params, and keeps no blocks.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ._metadata import HixlConnectorMetadata, HixlHandshake
from ._params import (
    DO_REMOTE_DECODE,
    DO_REMOTE_PREFILL,
    LOGGER_NAME,
    PROBE,
    TRANSFER,
    Load,
    RemoteBlocks,
    Saved,
    Settings,
)

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = logging.getLogger(LOGGER_NAME)


class HixlScheduler:
    """Scheduler-side state of one vLLM engine."""

    def __init__(self, engine_id: str, settings: Settings, block_size: int) -> None:
        self._engine_id = engine_id
        self._settings = settings
        self._block_size = block_size  # tokens per block here
        self._workers: dict[int, HixlHandshake] = {}   # by tp rank
        # Decode side.
        self._waiting: dict[str, RemoteBlocks] = {}    # queued, not yet allocated
        self._loads: list[Load] = []                    # allocated this step
        self._abandoned: list[RemoteBlocks] = []
        self._renewed_at = 0.0
        # Prefill side: requests whose blocks we keep for the workers to release;
        # in push mode, the requests to push (by request id: their transfer
        # key), and what the workers may push this step.
        self._holds: list[str] = []
        self._pushing: dict[str, tuple[str, int]] = {}  # (transfer key, prompt tokens)
        self._saves: list[Saved] = []

    def set_handshakes(self, handshakes: dict[int, HixlHandshake]) -> None:
        """The workers' facts (vLLM collects them once, after KV registration)."""
        self._workers = dict(handshakes)

    # -- decode side ---------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        remote = _remote_of(request)
        if remote is not None:
            self._waiting[request.request_id] = remote
        params = request.kv_transfer_params or {}
        if self._settings.mode == "push" and params.get(DO_REMOTE_DECODE) and \
                not params.get(PROBE):
            self._pushing[request.request_id] = (str(params.get(TRANSFER) or
                                                     request.request_id),
                                                 len(request.prompt_token_ids or ()))

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if not params or not params.get(DO_REMOTE_PREFILL) or _remote_of(request) is None:
            return 0, False
        count = len(request.prompt_token_ids or ()) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params or not params.get(DO_REMOTE_PREFILL):
            return
        params[DO_REMOTE_PREFILL] = False  # once: a second call is for new blocks
        remote = self._waiting.pop(request.request_id, None) or _remote_of(request)
        if remote is None:
            return
        if num_external_tokens <= 0:
            self._abandoned.append(remote)  # all cached here: nothing to pull
            return
        local = blocks.get_unhashed_block_ids()
        # Tokens cached here already are not pulled: a whole number of blocks.
        num_tokens = len(request.prompt_token_ids or ())
        first = num_tokens - num_external_tokens
        needed = -(-num_external_tokens // self._block_size)
        far_block_size = remote.kv_shape[0] if remote.kv_shape else self._block_size
        # Pushed: the prefill side knows its own blocks (the proxy's flow names none).
        push = self._settings.mode == "push" and remote.pushes
        far_needed = 0 if push else -(-num_tokens // far_block_size)
        if first % self._block_size or len(local) < needed or \
                len(remote.block_ids) < far_needed:
            logger.warning("request %s: tokens [%d, %d) in %d blocks of %d here, but the "
                           "prefill side holds %d blocks of %d; it is computed here",
                           request.request_id, first, num_tokens, len(local), self._block_size,
                           len(remote.block_ids), far_block_size)
            self._abandoned.append(remote)
            return
        self._loads.append(Load(request.request_id, tuple(local[:needed]), remote, first,
                                num_tokens, push))

    # -- prefill side (and decode requests ending early) ---------------------

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        from vllm.v1.request import RequestStatus

        request_id = request.request_id
        params = request.kv_transfer_params or {}
        waiting = self._waiting.pop(request_id, None)
        if waiting is not None:
            self._abandoned.append(waiting)  # ended before its blocks came: let them go
        transfer = self._pushing.pop(request_id, ("", 0))[0]
        # A decode request that ends while its pull runs: vLLM itself keeps its
        # blocks until the workers report the load finished.
        if not params.get(DO_REMOTE_DECODE):
            return False, None
        if params.get(PROBE):  # who this instance is, for a proxy: nothing to keep
            identity = self._identity(request_id, (), 0, "")
            return False, identity.to_params() if identity is not None else None
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                  RequestStatus.FINISHED_STOPPED) or not block_ids:
            return False, None  # aborted: nobody will pull it
        remote = self._identity(request_id, tuple(block_ids), request.num_computed_tokens,
                                transfer)
        if remote is None:
            logger.warning("request %s: no hixl worker registered its KV cache; its KV "
                           "cannot be handed to a decode instance", request_id)
            return False, None
        self._holds.append(request_id)
        if transfer:
            self._saves.append(Saved(request_id, transfer, tuple(block_ids),
                                     request.num_computed_tokens, whole=True))
        return True, remote.to_params()

    def _identity(self, request_id: str, block_ids: tuple[int, ...], num_tokens: int,
                  transfer: str) -> RemoteBlocks | None:
        """This instance as a decode instance needs it, with a request's blocks."""
        if not self._workers:
            return None
        ranks = sorted(self._workers)
        first = self._workers[ranks[0]]
        return RemoteBlocks(self._engine_id, request_id, block_ids, num_tokens,
                            first.peer_address,
                            tuple(self._workers[r].cluster_id for r in ranks), first.layout,
                            tuple(first.kv_shape), first.family, self._settings.mode, transfer)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> HixlConnectorMetadata:
        # Push mode: a prompt computed whole in this step goes layer by layer
        # as the forward saves each (a prompt cut into chunks goes at the end).
        for new in scheduler_output.scheduled_new_reqs:
            transfer, prompt = self._pushing.get(new.req_id, ("", 0))
            scheduled = scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            # Only the step that computes every prompt token: the layers it saves
            # are the whole prompt's (a first chunk's are not).
            if transfer and prompt > 0 and new.num_computed_tokens + scheduled >= prompt:
                self._saves.append(Saved(new.req_id, transfer, tuple(new.block_ids[0]), prompt,
                                         whole=False))
        meta = HixlConnectorMetadata(loads=self._loads, holds=self._holds,
                                     abandoned=self._abandoned, saves=self._saves)
        now = time.monotonic()
        if self._waiting and now - self._renewed_at >= self._settings.lease_s / 3:
            meta.waiting = list(self._waiting.values())
            self._renewed_at = now
        self._loads, self._holds, self._abandoned, self._saves = [], [], [], []
        return meta


def _remote_of(request: Request) -> RemoteBlocks | None:
    params = request.kv_transfer_params
    if not params or not params.get(DO_REMOTE_PREFILL):
        return None
    return RemoteBlocks.from_params(params)
