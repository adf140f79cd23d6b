"""Repeated transfers: one prepared transfer per shape, started again by handle.

An engine moves slot after slot between the same two caches: only the two
batch indices change. After a pull_cache or push_cache by cache id the
daemon keeps, per shape (``hixl_wire.types.TransferShape``), a
``repeats.PreparedTransfer``:
the local cache, the link, the far cache, the plan between slots 0 and 0,
and the handle the link's transport made of that plan
(``Transport.prepare``). A repeat checks that each part is still the one in
use and starts the handle between the two slots it names; whatever fails
those checks runs the full ``pull`` or ``push`` of the shape, so a repeat
gives the very result, error and status code the full call gives.

A plan between other slots adds the two slots' offsets to every source and
every destination offset, which keeps contiguous ranges contiguous: the same
merged ranges ``plan_cache_pull`` gives, without planning again. The plan
between slots 0 and 0 is the successful transfer's own, shifted back.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import numpy as np

from hixl_wire.status import LLMException
from hixl_wire.types import TransferShape

from .cluster import Cluster
from .native_errors import RegionRefused
from .peer_api import IdRef
from .repeats import PreparedTransfer, Repeat
from .transfers import Outcome, PullSpec, PushSpec, fenced, pull, push


def shape_of(spec: PullSpec | PushSpec, asked_checksum: int) -> TransferShape | None:
    """The shape a transfer repeats by (``asked_checksum``: the Checksum its call
    asked for), or None: only pull_cache and push_cache by cache id repeat (a
    key names a different slot each time, and blocks requests carry their
    block lists)."""
    ref = spec.src if isinstance(spec, PullSpec) else spec.dst
    if spec.blocks or not isinstance(ref, IdRef):
        return None
    if isinstance(spec, PullSpec):
        return TransferShape(False, ref.cluster_id, ref.cache_id, spec.dst_cache_id, spec.size,
                             spec.tensor_num_per_layer, tuple(spec.src_tensor_indices),
                             tuple(spec.dst_tensor_indices), asked_checksum)
    return TransferShape(True, ref.cluster_id, ref.cache_id, spec.src_cache_id, -1,
                         spec.tensor_num_per_layer, tuple(spec.src_tensor_indices),
                         tuple(spec.dst_tensor_indices), asked_checksum)


def repeat_handle(cluster: Cluster, spec: PullSpec | PushSpec, outcome: Outcome,
                  asked_checksum: int) -> int:
    """After a transfer succeeded: the handle its shape may be repeated by (0: none)."""
    shape = shape_of(spec, asked_checksum)
    if shape is None:
        return 0
    handle = cluster.repeats.offer(shape)
    if handle:
        repeat = cluster.repeats.get(handle, shape.push)
        if repeat.found is None:
            repeat.found = _prepare(cluster, shape, spec, outcome)
    return handle


def _spec_of(shape: TransferShape, src_batch: int, dst_batch: int,
             checksum: bool) -> PullSpec | PushSpec:
    """The full request of ``shape`` between two slots (``checksum``: resolved now)."""
    if shape.push:
        return PushSpec(dst=IdRef(shape.remote_cluster_id, shape.remote_cache_id, dst_batch),
                        src_cache_id=shape.local_cache_id, src_batch_index=src_batch,
                        src_tensor_indices=list(shape.src_tensor_indices),
                        dst_tensor_indices=list(shape.dst_tensor_indices),
                        tensor_num_per_layer=shape.tensor_num_per_layer,
                        checksum=checksum)
    return PullSpec(src=IdRef(shape.remote_cluster_id, shape.remote_cache_id, src_batch),
                    dst_cache_id=shape.local_cache_id, batch_index=dst_batch, size=shape.size,
                    src_tensor_indices=list(shape.src_tensor_indices),
                    dst_tensor_indices=list(shape.dst_tensor_indices),
                    tensor_num_per_layer=shape.tensor_num_per_layer, checksum=checksum)


def _prepare(cluster: Cluster, shape: TransferShape, spec: PullSpec | PushSpec,
             outcome: Outcome) -> PreparedTransfer | None:
    """The prepared transfer of a shape whose transfer ``outcome`` just succeeded;
    None where its parts cannot be reused."""
    local = cluster.registry.live(shape.local_cache_id)
    link = cluster.links.get(shape.remote_cluster_id)
    far, ranges = outcome.far, outcome.ranges
    if local is None or link is None or far is None or ranges is None:
        return None
    if isinstance(spec, PushSpec):
        source, destination = local.layout, far.layout
        src_batch, dst_batch = spec.src_batch_index, far.batch_index
    else:
        source, destination = far.layout, local.layout
        src_batch, dst_batch = far.batch_index, spec.batch_index
    base = ranges - np.array((src_batch * source.stride, dst_batch * destination.stride, 0),
                             dtype=np.uint64)
    handle = link.transport.prepare(shape.push, local.memory, far.place, base, outcome.bytes,
                                    spec.checksum)
    return PreparedTransfer(local, link, far, source, destination, outcome.bytes, handle,
                            spec.checksum)


async def again(cluster: Cluster, repeat: Repeat, src_batch: int, dst_batch: int,
                checksum: bool) -> Outcome:
    """Run a transfer of a known shape (``checksum``: its Checksum resolved now):
    the same result and errors as ``pull`` or ``push`` of the full request,
    which runs whenever what was prepared no longer holds."""
    started = again_at_once(cluster, repeat, src_batch, dst_batch, checksum)
    if isinstance(started, Outcome):
        return started
    if started is not None:
        return await started
    return await _full(cluster, repeat, src_batch, dst_batch, checksum)


def again_at_once(cluster: Cluster, repeat: Repeat, src_batch: int, dst_batch: int,
                  checksum: bool) -> Outcome | Awaitable[Outcome] | None:
    """Start ``again`` without waiting, from the shape's prepared transfer.

    Returns the Outcome when the transfer ended right here (a small copy, or a
    small TCP request, alone in the daemon), an awaitable of it while bytes
    move, or None when what was prepared no longer holds: then nothing has
    moved, and the full call must run (``again`` runs it). Raises only before
    anything moved, with the full call's errors (a link gone down, the daemon
    stopping).
    """
    shape, prepared = repeat.shape, repeat.found
    if prepared is None or not prepared.current(cluster.registry, cluster.links, shape,
                                                checksum):
        return None
    shifts = prepared.shifts(src_batch, dst_batch)
    if shifts is None:  # a slot out of range: the full call words the error
        return None
    started = time.perf_counter()
    try:
        moving = prepared.handle.start(*shifts, cluster.settings.sync_timeout_ms)
    except RegionRefused:  # the remote cache is gone or moved; nothing has moved
        _forget(prepared, shape)
        return None
    if moving is None:
        return _repeated(cluster, prepared, started)
    return _finish(cluster, repeat, src_batch, dst_batch, prepared, moving, started)


def repeat_at_once(cluster: Cluster, handle: int, push: bool, src_batch: int, dst_batch: int,
                   checksum_of: Callable[[int], bool]
                   ) -> tuple[Repeat, Outcome | Awaitable[Outcome]] | None:
    """``again_at_once`` for a repeat named by handle, from the transfer lane's frame
    callback (``checksum_of`` resolves the shape's Checksum): the repeat and its
    Outcome (answered at once, and counted so) or an awaitable of it; None when
    the call must run as usual (an unknown handle, which the call itself
    words, or what was prepared no longer holds)."""
    try:
        repeat = cluster.repeats.get(handle, push=push)
    except LLMException:
        return None
    started = again_at_once(cluster, repeat, src_batch, dst_batch,
                            checksum_of(repeat.shape.checksum))
    if started is None:
        return None
    if isinstance(started, Outcome):
        cluster.repeats.answered_at_once += 1
    return repeat, started


def _forget(prepared: PreparedTransfer, shape: TransferShape) -> None:
    prepared.link.far.forget(IdRef(shape.remote_cluster_id, shape.remote_cache_id, 0))


async def _finish(cluster: Cluster, repeat: Repeat, src_batch: int, dst_batch: int,
                  prepared: PreparedTransfer, moving: Awaitable[None],
                  started: float) -> Outcome:
    """The rest of a transfer ``again_at_once`` started: its Outcome once the bytes
    landed; the full call's if the far end refused the remembered region."""
    try:
        with fenced(prepared.local, prepared.far, check=False):  # it started already
            await moving
    except RegionRefused:  # the remote cache is gone or moved; nothing has moved
        _forget(prepared, repeat.shape)
        return await _full(cluster, repeat, src_batch, dst_batch, prepared.checksum)
    prepared.local.check_present()  # freed while its bytes moved
    return _repeated(cluster, prepared, started)


def _repeated(cluster: Cluster, prepared: PreparedTransfer, started: float) -> Outcome:
    cluster.repeats.repeated += 1
    return Outcome(prepared.bytes, prepared.link.transport.name, time.perf_counter() - started)


async def _full(cluster: Cluster, repeat: Repeat, src_batch: int, dst_batch: int,
                checksum: bool) -> Outcome:
    """The full pull or push of a repeat's shape, whose outcome the next repeats
    start from."""
    shape = repeat.shape
    repeat.found = None
    spec = _spec_of(shape, src_batch, dst_batch, checksum)
    outcome = await (push(cluster, spec) if isinstance(spec, PushSpec) else pull(cluster, spec))
    repeat.found = _prepare(cluster, shape, spec, outcome)
    return outcome


__all__ = ["again", "again_at_once", "repeat_at_once", "repeat_handle", "shape_of"]
