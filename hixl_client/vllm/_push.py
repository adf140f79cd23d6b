"""Push mode, prefill side: each layer goes to the decode instance as soon as
vLLM has computed it and the decode instance has said where it goes.

The decode worker asks (a ``Want``: its blocks and facts) as soon as its
scheduler has allocated the blocks. That can come before the prefill runs
(the proxy sends the decode request first, and names the prefill instance),
during it, or after it (vLLM's own proxy sends P first; then every layer is
saved already and all go at once). So a request's push advances whenever
either side moves: a layer saved (``layer_saved``) or a want come (``want``).

Each push is this worker's share of the pulls the decode worker would have
made (``_sources.pulls_of``, computed from the decode worker's facts), so
block sizes and tensor-parallel splits map as they do for pulls. When every
layer has landed, or a push failed, the decode worker is told (``Pushed``),
and the request counts one of its decode workers done (the blocks go after
the last, as for pulls).

Everything here runs on the worker's event loop: the step thread hands its
events over with ``call_soon_threadsafe``, so no state is shared between
threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ..status import LLMException
from ._kv_map import KvShape
from ._params import LOGGER_NAME, Load, RemoteBlocks, Saved, Want
from ._sources import Pull, Worker, pulls_of

logger = logging.getLogger(LOGGER_NAME)

# push(want, pull, layers): one push of layers (None: every layer) of a share.
PushFn = Callable[[Want, Pull, "range | None"], Coroutine[Any, Any, None]]
# report(want, error): tell the decode worker its push ended ("" when it landed).
ReportFn = Callable[[Want, str], Coroutine[Any, Any, None]]
# done(request_id, tellers): one decode worker of the request is done.
DoneFn = Callable[[str, int], None]


@dataclass
class _Share:
    """One decode worker's want of a request, and how far its push got."""

    want: Want
    pull: Pull | None  # this worker's share; None when the want cannot be served
    error: str = ""
    pushed: int = 0  # layers handed to pushes so far
    running: set[asyncio.Task[None]] = field(default_factory=set)
    ended: bool = False


@dataclass
class _Request:
    saved: Saved
    layers: int  # layers computed so far, in order
    shares: dict[tuple[int, int], _Share] = field(default_factory=dict)  # by (cluster, rank)


class Pusher:
    """The prefill side of push mode for one worker (see the module).

    Args:
        me: this worker's facts (its layout, shape, rank...).
        num_layers: layers of the KV, when each is its own tensors of the
            caches (then layers go one by one); None: only whole requests go.
        lease_s: how long a want waits for its request to appear here.
        push, report, done: the worker's hixl calls and its step thread's
            books (see the module).
    """

    def __init__(self, me: Worker, num_layers: int | None, lease_s: float, push: PushFn,
                 report: ReportFn, done: DoneFn) -> None:
        self._me = me
        self._num_layers = num_layers
        self._lease_s = lease_s
        self._push, self._report, self._done = push, report, done
        self._requests: dict[str, _Request] = {}  # by transfer key
        self._early: dict[str, list[tuple[Want, float]]] = {}  # wants before their request
        self._step: list[asyncio.Task[None]] = []  # pushes started during this step
        self._step_requests: list[_Request] = []  # requests whose layers this step saves

    # -- from the step thread (through the loop) ------------------------------

    def begin_step(self, saves: list[Saved]) -> None:
        """The step's requests to push: whole ones, and ones computed in this step."""
        self._step, self._step_requests = [], []
        for saved in saves:
            request = self._requests.get(saved.transfer)
            if request is None:
                request = self._requests[saved.transfer] = _Request(saved, 0)
                for want, _ in self._early.pop(saved.transfer, []):
                    self._add_want(request, want)
            request.saved = saved
            if saved.whole:
                request.layers = self._total()
            elif self._num_layers is not None:  # layers go one by one as vLLM saves them
                self._step_requests.append(request)
            self._advance(request)
            self._drop_if_served(request)

    def layer_saved(self, layer: int) -> None:
        """vLLM saved layer ``layer`` (its index) of this step's requests."""
        for request in self._step_requests:
            if layer == request.layers:
                request.layers = layer + 1
                self._advance(request)

    async def end_step(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the pushes this step started."""
        if self._step:
            await asyncio.wait(self._step, timeout=timeout_s)
        self._step, self._step_requests = [], []

    def forget(self, request_id: str) -> None:
        """The request's blocks are gone (its lease ended): push nothing more."""
        for transfer, request in list(self._requests.items()):
            if request.saved.request_id == request_id:
                del self._requests[transfer]
                for share in request.shares.values():
                    for task in share.running:
                        task.cancel()

    # -- from the decode side ---------------------------------------------------

    def want(self, want: Want) -> None:
        """A decode worker asks for ``want.transfer``'s KV."""
        request = self._requests.get(want.transfer)
        if request is None:
            now = time.monotonic()
            self._early = {t: [(w, d) for w, d in ws if d > now]
                           for t, ws in self._early.items() if any(d > now for _, d in ws)}
            self._early.setdefault(want.transfer, []).append((want, now + self._lease_s))
            return
        self._add_want(request, want)
        self._advance(request)

    # -- inside -----------------------------------------------------------------

    def _total(self) -> int:
        return self._num_layers or 1

    def _add_want(self, request: _Request, want: Want) -> None:
        key = (want.cluster_id, want.rank)
        if key in request.shares:
            return  # a repeated want: the first one is served
        share = _Share(want, None)
        try:
            share.pull = self._share_of(request.saved, want)
        except LLMException as exc:
            share.error = str(exc)
        request.shares[key] = share

    def _share_of(self, saved: Saved, want: Want) -> Pull | None:
        """This worker's part of the pulls the decode worker would make."""
        me = self._me
        here = RemoteBlocks("", saved.request_id, saved.block_ids, saved.num_tokens, "",
                            tuple(range(me.ranks)), me.layout,
                            tuple(me.shape.to_list()) if me.shape else (), me.family)
        there = Worker(want.layout, want.family,
                       KvShape.from_list(want.kv_shape) if want.kv_shape else None,
                       want.block_size, want.rank, want.ranks)
        load = Load(saved.request_id, want.block_ids, here, want.first_token, want.num_tokens)
        mine = [pull for pull in pulls_of(there, load) if pull.rank == me.rank]
        return mine[0] if mine else None

    def _advance(self, request: _Request) -> None:
        total = self._total()
        for share in request.shares.values():
            if share.ended:
                continue
            if share.pull is not None and not share.error and share.pushed < request.layers:
                layers = None if self._num_layers is None else range(share.pushed,
                                                                     request.layers)
                share.pushed = request.layers
                task = asyncio.get_running_loop().create_task(
                    self._run(request, share, layers))
                share.running.add(task)
                self._step.append(task)
            if share.error or share.pull is None or (
                    share.pushed >= total and not share.running):
                self._end(request, share)

    async def _run(self, request: _Request, share: _Share, layers: range | None) -> None:
        assert share.pull is not None
        try:
            await self._push(share.want, share.pull, layers)
        except (LLMException, OSError) as exc:
            share.error = share.error or f"pushing layers {layers} failed: {exc}"
        finally:
            current = asyncio.current_task()
            if current is not None:
                share.running.discard(current)
        self._advance(request)

    def _end(self, request: _Request, share: _Share) -> None:
        share.ended = True
        if share.error:
            logger.warning("hixl: request %s: push to cluster %d failed: %s",
                           request.saved.request_id, share.want.cluster_id, share.error)
        task = asyncio.get_running_loop().create_task(self._report(share.want, share.error))
        self._step.append(task)
        self._done(request.saved.request_id, share.want.tellers)
        self._drop_if_served(request)

    def _drop_if_served(self, request: _Request) -> None:
        """Forget a finished request once every decode worker it expects was served."""
        shares = request.shares.values()
        if request.saved.whole and shares and all(s.ended for s in shares) and \
                len(request.shares) >= max(s.want.tellers for s in shares):
            self._requests.pop(request.saved.transfer, None)
