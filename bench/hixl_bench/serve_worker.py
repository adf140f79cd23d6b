"""The serving suite's blocking-facade rows: a decode instance on ``hixl_client.sync``.

Run by ``serve_group`` as ``python -m hixl_bench.serve_worker SPEC``, SPEC a
JSON object (the daemon, the cluster to be, the prefill cluster to link to,
the case). A process of its own, since grpc.aio serves one event loop per
process and the facade runs its own. It registers the decode side's memory,
links, checks pulls byte-exact and answers ``{"ready": true}`` (or
``{"skipped"}``, ``{"error"}`` and ends); then it reads commands from stdin,
one JSON line each, and answers each with one line on stdout:

* ``{"slice": BUDGET}``: ``conc`` threads, each pulling with its own block
  tables, for that budget: ``{"latencies", "wall_s"}``;
* ``{"close": true}`` (or the end of stdin): the pulls are checked again,
  the cluster finalized: ``{"verified_pulls"}``, and the process ends.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np

from hixl_bench.model import Budget
from hixl_bench.plan import ServeCase
from hixl_bench.serve import (
    AFTER,
    BEFORE,
    ROTATIONS,
    case_from_spec,
    check_blocks,
    clear_blocks,
    desc_of,
    refused,
    side_tables,
    verify_pairs,
)
from hixl_client import LLMClusterInfo, alloc_shareable, sync

_LINK_TIMEOUT_MS = 10000


def drive_threads(request: Any, conc: int, budget: Budget) -> tuple[list[float], float]:
    """Like ``model.drive`` for blocking calls: ``conc`` threads, thread k pulling
    with slot k; returns (latencies, wall seconds)."""
    for index in range(max(1, budget.warmup)):
        request(0, index)
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(1 << 62))
    started = time.perf_counter()
    deadline = started + budget.seconds

    def worker(slot: int) -> None:
        while True:
            with lock:
                if len(latencies) >= budget.max_requests or (
                        time.perf_counter() >= deadline and len(latencies) >= budget.min_requests):
                    return
                index = next(counter)
            t0 = time.perf_counter()
            request(slot, index)
            with lock:
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(slot,)) for slot in range(conc)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, time.perf_counter() - started


class _Decode:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.case: ServeCase = case_from_spec(spec["case"])
        self.spec = spec
        prefill = spec["prefill"]
        self.key = sync.BlocksCacheKey(prefill["cluster_id"], prefill["model_id"])
        sync.set_daemon(spec["daemon"])
        self.dd = sync.LLMDataDist(sync.LLMRole.DECODER, spec["cluster_id"])
        self.owner: Any = None

    def open(self) -> list[int]:
        case = self.case
        self.dd.init(self.spec["options"])
        cm = self.dd.cache_manager
        desc = desc_of(case)
        if case.memory == "pool":
            self.cache = cm.allocate_blocks_cache(desc)
            addrs = list(self.cache.tensor_addrs)
        else:
            if case.memory == "shareable":
                self.owner = alloc_shareable(case.cache_bytes)
                base = self.owner.address
            else:
                self.owner = np.zeros(case.cache_bytes, dtype=np.uint8)
                base = self.owner.ctypes.data
            tensor_bytes = case.pool_blocks * case.block_bytes
            addrs = [base + t * tensor_bytes for t in range(case.tensors)]
            try:
                self.cache = cm.register_blocks_cache(desc, addrs)
            except sync.LLMException as exc:
                if case.memory == "engine":
                    raise _Unsupported(refused(exc)) from exc
                raise
        prefill = self.spec["prefill"]
        status, per_cluster = self.dd.link_clusters(
            [LLMClusterInfo.for_peer(prefill["cluster_id"], prefill["peer"])],
            timeout=_LINK_TIMEOUT_MS)
        if status != sync.LLMStatusCode.LLM_SUCCESS:
            raise RuntimeError(f"link_clusters failed: {status} {per_cluster}")
        return addrs

    def pull(self, src: list[int], dst: list[int]) -> None:
        layers = range(self.case.model.layers)
        self.dd.cache_manager.pull_blocks(self.key, self.cache, src, dst,
                                          src_layer_range=layers, dst_layer_range=layers)

    def close(self) -> None:
        self.dd.finalize()  # a no-op when init never succeeded
        if self.owner is not None and hasattr(self.owner, "close"):
            self.owner.close()


class _Unsupported(Exception):
    pass


class _Session:
    """The worker's decode side between ``ready`` and ``close``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.decode = _Decode(spec)
        self.case = self.decode.case
        self.src, self.dst = side_tables(self.case, spec["index"])
        self.addrs: list[int] = []
        self.verified = 0

    def open(self) -> None:
        self.addrs = self.decode.open()
        self.verify(BEFORE)  # and the warm-up: see serve.verify_pairs

    def verify(self, rotations: range) -> None:
        for s, d in verify_pairs(self.src, self.dst, rotations):
            clear_blocks(self.case, self.addrs, d)
            self.decode.pull(s, d)
            check_blocks(self.case, self.addrs, s, d)
            self.verified += 1

    def slice(self, budget: Budget) -> dict[str, Any]:
        def request(slot: int, index: int) -> None:
            rotation = index % ROTATIONS
            self.decode.pull(self.src[slot][rotation], self.dst[slot][rotation])

        latencies, wall = drive_threads(request, self.case.conc, budget)
        return {"latencies": latencies, "wall_s": wall}

    def close(self) -> dict[str, Any]:
        self.verify(AFTER)
        return {"verified_pulls": self.verified}


def _answer(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def _failed(exc: Exception) -> dict[str, Any]:
    traceback.print_exc()  # the parent shows its last lines with the error
    return {"error": f"{type(exc).__name__}: {exc}"}


def serve(spec: dict[str, Any]) -> None:
    session = _Session(spec)
    try:
        try:
            session.open()
        except _Unsupported as exc:
            _answer({"skipped": str(exc)})
            return
        _answer({"ready": True})
        for line in sys.stdin:
            command = json.loads(line)
            if "slice" in command:
                _answer(session.slice(Budget(**command["slice"])))
            else:
                break
        _answer(session.close())
    finally:
        session.decode.close()


def main() -> int:
    spec = json.loads(sys.argv[1])
    try:
        serve(spec)
    except Exception as exc:  # the parent turns it into the row's status
        _answer(_failed(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
