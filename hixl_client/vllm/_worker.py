"""The connector's worker half: the one place that talks to hixl.

It runs the async client on an event loop of its own (thread
``hixl-vllm``): vLLM's step thread only submits work there and reads
results that are ready, so no step waits on a transfer. Per worker:

* ``register_kv_caches``: one cluster (``_params.cluster_id_of``) on the
  local daemon and one blocks cache over vLLM's own KV tensors, registered
  where they lie (the daemon reaches the engine's memory; nothing is copied
  into a pool).
* decode side: one ``pull_blocks`` per request, straight into the blocks
  the scheduler allocated, over a link made once per prefill worker; then a
  ``done`` notification so the prefill side frees its blocks at once. From
  a prefill instance of another block size the pull names runs of the run
  view, a second blocks cache over the same memory (``_kv_map``).
* prefill side: finished requests' blocks are held until their ``done``
  notification, or until their lease ends (renewed by ``hold``
  notifications from a decode side that still waits to pull).
* push mode (``_push``): the decode side asks instead of pulling (a want);
  the prefill side pushes each layer once it is computed and asked for,
  then reports; the caches are registered remote-accessible for that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import time
from collections import defaultdict
from collections.abc import Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .. import (
    BlocksCacheKey,
    CacheDesc,
    DataType,
    LLMClusterInfo,
    LLMConfig,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    NotifyDesc,
)
from .._sync_loop import LoopThread
from ._kv_layout import KvLayout, prefault, share_in_place
from ._kv_map import KvShape
from ._metadata import HixlConnectorMetadata, HixlHandshake
from ._params import (
    DONE,
    HOLD,
    LOGGER_NAME,
    PUSHED,
    WANT,
    Load,
    Pushed,
    RemoteBlocks,
    Settings,
    Want,
    requests_message,
    requests_of,
)
from ._push import Pusher
from ._sources import Pull, Worker, pulls_of, tellers_of
from ._stats import HixlConnectorStats

if TYPE_CHECKING:
    from .. import Cache, ShareableBuffer

logger = logging.getLogger(LOGGER_NAME)

MODEL_ID = 0  # every instance's KV is one blocks cache under this model id
RUN_VIEW_MODEL_ID = 1  # and the same memory in runs (_kv_map), where its layout allows
CONTROL_TIMEOUT_MS = 10000
LINK_TIMEOUT_MS = 10000
# Link and pull failures that a new link may mend (the far daemon restarted).
RELINK_ON = frozenset({LLMStatusCode.LLM_NOT_YET_LINK, LLMStatusCode.LLM_LINK_FAILED})


class HixlWorker:
    """Worker-side state of one vLLM worker (one tensor-parallel rank)."""

    def __init__(self, settings: Settings, cluster_id: int, rank: int, ranks: int,
                 block_size: int) -> None:
        self._settings = settings
        self._cluster_id = cluster_id
        self._rank = rank
        self._ranks = ranks  # the instance's tensor-parallel size
        self._block_size = block_size
        self._loop_thread = LoopThread("hixl-vllm")
        self._dd: LLMDataDist | None = None
        self._cache: Cache | None = None
        self._runs: Cache | None = None  # the run view of the same memory
        self._shared: ShareableBuffer | None = None  # the KV memory, when shared in place
        self._me: Worker | None = None  # set by register()
        self._handshake: HixlHandshake | None = None
        self._links: dict[int, asyncio.Task[None]] = {}   # on the loop only
        self._reader: asyncio.Task[None] | None = None
        self._telling: set[asyncio.Task[None]] = set()    # notifications on their way
        self._notified: queue.SimpleQueue[NotifyDesc] = queue.SimpleQueue()
        # Decode side: pulls in flight, by request; blocks that failed to load.
        # A pull's future gives (bytes, seconds).
        self._loads: dict[str, tuple[Load, concurrent.futures.Future[tuple[int, float]]]] = {}
        self._failed_blocks: set[int] = set()
        # Prefill side: held requests and when their lease ends (monotonic);
        # "done"s by request: how many more are due (one per decode worker
        # that pulls from this one), and until when an early one is kept.
        self._held: dict[str, float] = {}
        self._dones: dict[str, tuple[int, float]] = {}
        # Touched by vLLM's step thread only (finished(), take_stats()).
        self._stats = HixlConnectorStats()
        # Push mode: the prefill side's pushes (on the loop); the decode side's
        # waits for their reports, by (transfer, prefill rank), on the loop.
        self._pusher: Pusher | None = None
        self._tensors_per_layer = 1
        self._saving = False  # the step thread's: this step hands push mode requests
        self._reports: dict[tuple[str, int], asyncio.Future[str]] = {}

    # -- start-up ------------------------------------------------------------

    def _submit(self, work: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(work, self._loop_thread.loop())

    def register(self, layout: KvLayout, fingerprint: str, shape: KvShape | None = None,
                 family: str = "", num_layers: int = 0) -> None:
        """Attach to the daemon and register the KV memory (blocks until done):
        as blocks, and as runs when ``shape`` says how (``_kv_map``).
        ``num_layers``: vLLM's attention layers, in ``layout``'s order; in push
        mode they go one by one when each is its own regions.

        Raises:
            LLMException: the daemon refused (e.g. it cannot reach this
                process's memory: see docs/client.md, "Your own memory").
        """
        family = family if shape is not None else ""
        self._me = Worker(fingerprint, family, shape, self._block_size, self._rank, self._ranks)
        if self._settings.mode == "push":
            regions = len(layout.addresses)
            layered = num_layers > 0 and regions % num_layers == 0
            self._tensors_per_layer = regions // num_layers if layered else 1
            self._pusher = Pusher(self._me, num_layers if layered else None,
                                  self._settings.lease_s, self._push_share, self._report,
                                  self._pushed_done)
        self._shared = share_in_place(layout)
        if self._shared is None:
            prefault(layout)
        self._submit(self._register(layout)).result()
        assert self._dd is not None
        self._handshake = HixlHandshake(self._dd.peer_address, self._cluster_id, fingerprint,
                                        tuple(shape.to_list()) if shape else (), family)
        logger.info("hixl: cluster %d registered %d KV regions of %d blocks x %d bytes "
                    "(%.1f MiB, at %s, %s) with %s; peers link to %s", self._cluster_id,
                    len(layout.addresses), layout.num_blocks, layout.block_bytes,
                    layout.nbytes / 2**20, " ".join(f"{a:#x}" for a in layout.addresses),
                    "engine memory" if self._shared is None else "shared in place",
                    self._settings.daemon, self._dd.peer_address)

    async def _register(self, layout: KvLayout) -> None:
        config = LLMConfig()
        config.enable_cache_manager = True
        config.sync_kv_timeout = self._settings.load_timeout_ms
        # Push mode writes into the other side's caches: they must be reachable by key.
        pushing = self._settings.mode == "push"
        config.enable_remote_cache_accessible = pushing
        dd = LLMDataDist(LLMRole.PROMPT, self._cluster_id, daemon=self._settings.daemon)
        await dd.init(config.generate_options())
        desc = CacheDesc(len(layout.addresses), [layout.num_blocks, layout.block_bytes],
                         DataType.DT_UINT8)
        try:
            self._cache = await dd.cache_manager.register_blocks_cache(
                desc, list(layout.addresses), BlocksCacheKey(self._cluster_id, MODEL_ID),
                remote_accessible=pushing)
            shape = self._me.shape if self._me is not None else None
            if shape is not None:
                runs = layout.block_bytes // shape.run_bytes * layout.num_blocks
                self._runs = await dd.cache_manager.register_blocks_cache(
                    CacheDesc(len(layout.addresses), [runs, shape.run_bytes],
                              DataType.DT_UINT8),
                    list(layout.addresses), BlocksCacheKey(self._cluster_id, RUN_VIEW_MODEL_ID),
                    remote_accessible=pushing)
        except BaseException:
            await dd.finalize()
            raise
        self._dd = dd
        self._reader = asyncio.get_running_loop().create_task(self._read_notifies(dd))

    def handshake(self) -> HixlHandshake | None:
        return self._handshake

    async def _read_notifies(self, dd: LLMDataDist) -> None:
        # Hands notifications to the step thread without making it touch the
        # loop; push mode's are acted on here, on the loop.
        while True:
            for notify in await dd.wait_notifies():
                try:
                    if notify.name == WANT and self._pusher is not None:
                        self._pusher.want(Want.from_message(notify.notify_msg))
                    elif notify.name == PUSHED:
                        self._push_reported(Pushed.from_message(notify.notify_msg))
                    else:
                        self._notified.put(notify)
                except ValueError as exc:
                    logger.warning("hixl: a malformed %s notification: %s", notify.name, exc)

    # -- each step -----------------------------------------------------------

    def start(self, meta: HixlConnectorMetadata) -> None:
        """Act on one step's metadata: start pulls (or ask for pushes), hold
        blocks, tell prefill sides."""
        for load in meta.loads:
            work = self._await_push(load) if load.push else self._pull(load)
            self._loads[load.request_id] = (load, self._submit(work))
        now = time.monotonic()
        for request_id in meta.holds:
            self._held[request_id] = now + self._settings.lease_s
        if meta.waiting:
            self._submit(self._tell(HOLD, meta.waiting))
        if meta.abandoned:
            self._submit(self._tell(DONE, meta.abandoned))

    def finished(self) -> tuple[set[str], set[str]]:
        """(requests whose held blocks may go, requests whose pull ended)."""
        now = time.monotonic()
        self._read_notified(now)
        sending = {r for r in self._held if r in self._dones and self._dones[r][0] <= 0}
        for request_id in sending:
            del self._dones[request_id]
        expired = {r for r, deadline in self._held.items() if deadline <= now} - sending
        if expired:
            logger.warning("hixl: no decode instance took %d finished requests within their "
                           "lease (%g s); their blocks are freed: %s", len(expired),
                           self._settings.lease_s, sorted(expired)[:8])
            self._stats.record_expired(len(expired))
        sending |= expired
        for request_id in sending:
            del self._held[request_id]
        if self._pusher is not None:
            for request_id in sending:
                self._loop_thread.loop().call_soon_threadsafe(self._pusher.forget, request_id)
        self._dones = {r: due for r, due in self._dones.items() if due[1] > now}
        recving = {r for r, (_, future) in self._loads.items() if future.done()}
        for request_id in recving:
            load, future = self._loads.pop(request_id)
            if future.exception() is not None:
                self._failed_blocks.update(load.block_ids)
                self._stats.record_failure()
            else:
                self._stats.record_transfer(*future.result())
        return sending, recving

    def begin_saves(self, meta: HixlConnectorMetadata) -> None:
        """The step's requests that push mode may push (before its forward's
        first ``layer_saved``, or without a forward)."""
        if self._pusher is not None:
            self._saving = bool(meta.saves)
            self._loop_thread.loop().call_soon_threadsafe(self._pusher.begin_step, meta.saves)

    def layer_saved(self, layer: int) -> None:
        """vLLM saved attention layer ``layer`` (push mode: it may go now)."""
        if self._pusher is not None:
            self._loop_thread.loop().call_soon_threadsafe(self._pusher.layer_saved, layer)

    def wait_for_save(self) -> None:
        """The step's forward ended: wait for the pushes it started, at most
        load_timeout_ms (the request's blocks stay until each push ends). A step
        with nothing to push (every decode step) does not wait on the loop."""
        if self._pusher is not None and self._saving:
            bound_s = self._settings.load_timeout_ms / 1000
            self._submit(self._pusher.end_step(bound_s)).result(timeout=bound_s + 5)

    def take_stats(self) -> HixlConnectorStats | None:
        """The statistics since the last call; None when there were none."""
        if self._stats.is_empty():
            return None
        taken, self._stats = self._stats, HixlConnectorStats()
        return taken

    def _read_notified(self, now: float) -> None:
        while True:
            try:
                notify = self._notified.get_nowait()
            except queue.Empty:
                return
            for request_id, tellers in requests_of(notify.notify_msg):
                if notify.name == DONE:
                    due = self._dones.get(request_id, (tellers, 0.0))[0] - 1
                    self._dones[request_id] = (due, now + self._settings.lease_s)
                elif notify.name == HOLD and request_id in self._held:
                    self._held[request_id] = now + self._settings.lease_s

    def take_failed_blocks(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    # -- on the loop ---------------------------------------------------------

    async def _pull(self, load: Load) -> tuple[int, float]:
        """Pull one request's KV, then tell the prefill side it may free it;
        (bytes, seconds). A failure is logged and re-raised for finished() to report."""
        remote = load.remote
        try:
            assert self._me is not None
            pulls = pulls_of(self._me, load)
            await asyncio.gather(*(self._linked(remote.cluster_ids[pull.rank],
                                                remote.peer_address) for pull in pulls))
            started = time.perf_counter()
            await asyncio.gather(*(self._pull_one(remote, pull) for pull in pulls))
            seconds = time.perf_counter() - started
        except Exception as exc:
            logger.warning("hixl: request %s: loading %d blocks from engine %s failed: %s",
                           load.request_id, len(load.block_ids), remote.engine_id, exc)
            raise
        finally:
            # Done either way: a failed load is computed here, so the prefill
            # side need not keep its blocks. Sent on the side: the request's
            # outcome does not wait for a prefill daemon that may be gone.
            telling = asyncio.get_running_loop().create_task(self._tell(DONE, [remote]))
            self._telling.add(telling)
            telling.add_done_callback(self._telling.discard)
        return sum(map(self._bytes_of, pulls)), seconds

    def _view(self, pull: Pull) -> tuple[int, Cache]:
        """The model id and the cache here of the view ``pull`` names (blocks or runs)."""
        cache = self._runs if pull.runs else self._cache
        assert cache is not None
        return (RUN_VIEW_MODEL_ID if pull.runs else MODEL_ID), cache

    def _bytes_of(self, pull: Pull) -> int:
        desc = self._view(pull)[1].cache_desc
        return len(pull.dst) * desc.num_tensors * desc.shape[1]  # shape[1]: a block's bytes

    async def _pull_one(self, remote: RemoteBlocks, pull: Pull) -> None:
        """One prefill worker's part of a load."""
        cluster_id = remote.cluster_ids[pull.rank]
        model_id, cache = self._view(pull)
        assert self._dd is not None
        with self._relinking(cluster_id):
            await self._dd.cache_manager.pull_blocks(BlocksCacheKey(cluster_id, model_id),
                                                     cache, pull.src, pull.dst)

    @contextlib.contextmanager
    def _relinking(self, cluster_id: int) -> Iterator[None]:
        """Forget the link to ``cluster_id`` when a call over it fails in a way a
        new link may mend (the far daemon restarted): the next call links again."""
        try:
            yield
        except LLMException as exc:
            if exc.status_code in RELINK_ON:
                self._links.pop(cluster_id, None)
            raise

    # -- push mode -------------------------------------------------------------

    async def _await_push(self, load: Load) -> tuple[int, float]:
        """Decode side: ask each prefill worker that holds some of this worker's
        heads to push them (a Want), and wait for every report; (bytes, seconds)."""
        remote = load.remote
        assert self._me is not None and self._dd is not None and self._cache is not None
        me, loop = self._me, asyncio.get_running_loop()
        started = time.perf_counter()
        waits: dict[tuple[str, int], asyncio.Future[str]] = {}
        try:
            for rank, tellers in tellers_of(me, remote).items():
                key = (remote.transfer, rank)
                waits[key] = self._reports[key] = loop.create_future()
                want = Want(remote.transfer, self._cluster_id, self._dd.peer_address, me.rank,
                            me.ranks, me.layout, me.family,
                            tuple(me.shape.to_list()) if me.shape else (), me.block_size,
                            load.block_ids, load.first_token, load.num_tokens, tellers)
                cluster_id = remote.cluster_ids[rank]
                await self._linked(cluster_id, remote.peer_address)
                await self._dd.send_notify(cluster_id, NotifyDesc(WANT, want.to_message()),
                                           CONTROL_TIMEOUT_MS)
            bound_ms = self._settings.push_timeout_ms
            done, _ = await asyncio.wait(waits.values(), timeout=bound_ms / 1000)
            errors = [f.result() for f in done if f.result()]
            if len(done) < len(waits) or errors:
                raise LLMException(
                    f"the push from engine {remote.engine_id} failed: "
                    + ("; ".join(errors) if errors else f"no report within {bound_ms} ms"),
                    status_code=LLMStatusCode.LLM_TIMEOUT if not errors
                    else LLMStatusCode.LLM_LINK_FAILED)
        except Exception as exc:
            logger.warning("hixl: request %s: the push of %d blocks from engine %s failed: %s",
                           load.request_id, len(load.block_ids), remote.engine_id, exc)
            raise
        finally:
            for key in waits:
                self._reports.pop(key, None)
        desc = self._cache.cache_desc
        return len(load.block_ids) * desc.num_tensors * desc.shape[1], \
            time.perf_counter() - started

    def _push_reported(self, pushed: Pushed) -> None:
        future = self._reports.get((pushed.transfer, pushed.rank))
        if future is not None and not future.done():
            future.set_result(pushed.error)

    async def _push_share(self, want: Want, pull: Pull, layers: range | None) -> None:
        """Prefill side: push this worker's share of a want (``layers``: None for all)."""
        await self._linked(want.cluster_id, want.peer_address)
        model_id, cache = self._view(pull)
        assert self._dd is not None
        with self._relinking(want.cluster_id):
            await self._dd.cache_manager.push_blocks(
                BlocksCacheKey(want.cluster_id, model_id), cache, pull.src, pull.dst,
                src_layer_range=layers, dst_layer_range=layers,
                tensor_num_per_layer=self._tensors_per_layer)

    async def _report(self, want: Want, error: str) -> None:
        """Prefill side: tell the decode worker its push ended."""
        assert self._dd is not None
        try:
            await self._linked(want.cluster_id, want.peer_address)
            await self._dd.send_notify(
                want.cluster_id, NotifyDesc(PUSHED, Pushed(want.transfer, self._rank,
                                                           error).to_message()),
                CONTROL_TIMEOUT_MS)
        except (LLMException, OSError) as exc:  # its own bound fails the request there
            logger.warning("hixl: could not report the push of %s to cluster %d: %s",
                           want.transfer, want.cluster_id, exc)

    def _pushed_done(self, request_id: str, tellers: int) -> None:
        """Prefill side: one decode worker's push ended; counted as its "done"."""
        self._notified.put(NotifyDesc(DONE, requests_message([(request_id, tellers)])))

    async def _linked(self, cluster_id: int, peer_address: str) -> None:
        """Link to a prefill worker's cluster once; later requests share the link."""
        task = self._links.get(cluster_id)
        if task is None or (task.done() and task.exception() is not None):
            task = self._links[cluster_id] = asyncio.get_running_loop().create_task(
                self._link(cluster_id, peer_address))
        await asyncio.shield(task)

    async def _link(self, cluster_id: int, peer_address: str) -> None:
        assert self._dd is not None
        status, results = await self._dd.link_clusters(
            [LLMClusterInfo.for_peer(cluster_id, peer_address)], timeout=LINK_TIMEOUT_MS)
        if status == LLMStatusCode.LLM_ALREADY_LINK:
            # A link that went down is replaced by link_clusters; one that is
            # up (made before a relink was asked for) serves as it is.
            return
        if status != LLMStatusCode.LLM_SUCCESS:
            raise LLMException(f"linking to cluster {cluster_id} at {peer_address} failed: "
                               f"{results}", status_code=status)

    async def _tell(self, name: str, remotes: Iterable[RemoteBlocks]) -> None:
        """Send ``name`` for these requests, one notification per prefill worker
        that this one pulls from (``_sources.tellers_of``)."""
        by_cluster: dict[tuple[int, str], list[tuple[str, int]]] = defaultdict(list)
        assert self._me is not None
        for remote in remotes:
            for rank, tellers in tellers_of(self._me, remote).items():
                by_cluster[(remote.cluster_ids[rank], remote.peer_address)].append(
                    (remote.request_id, tellers))
        assert self._dd is not None
        for (cluster_id, peer_address), requests in by_cluster.items():
            try:
                await self._linked(cluster_id, peer_address)
                await self._dd.send_notify(cluster_id,
                                           NotifyDesc(name, requests_message(requests)),
                                           CONTROL_TIMEOUT_MS)
            except (LLMException, OSError) as exc:
                # Its lease frees the blocks instead.
                logger.warning("hixl: could not tell cluster %d %s for %d requests: %s",
                               cluster_id, name, len(requests), exc)

    # -- shutdown --------------------------------------------------------------

    def close(self) -> None:
        """End the session: the daemon forgets the cluster, its cache and links."""
        dd, self._dd = self._dd, None
        if dd is not None:
            self._submit(self._close(dd)).result(timeout=CONTROL_TIMEOUT_MS / 1000 + 5)
        if self._shared is not None:
            self._shared.close()  # the memory stays vLLM's; the daemon lets go of it

    async def _close(self, dd: LLMDataDist) -> None:
        if self._reader is not None:
            self._reader.cancel()
        for task in (*self._links.values(), *self._telling):
            task.cancel()
        await dd.finalize()
