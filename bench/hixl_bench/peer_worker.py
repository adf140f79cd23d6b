"""One side of a peer transfer engine (Mooncake TE, NIXL), run as its own process by hixl-bench.

A standalone script (standard library plus the peer's package; numpy too
for the serving pattern), so it can run under another interpreter where the
peer is installed:

    python peer_worker.py target ENGINE REGION_BYTES FILL
        FILL: ``flat`` (a constant byte) or ``pattern`` (word i holds i * PATTERN_KEY
        mod 2**32, what serving jobs check); prints {"info": ...} once its memory is
        registered, serves until stdin closes
    python peer_worker.py initiator ENGINE REGION_BYTES < spec.json
        spec: {"info": <target's info>, "cold": bytes the cases rotate through,
               "cases": [[op, block, nblocks], ...], "budget": BUDGET,
               "serve": [JOB, ...], "serve_budget": BUDGET}
        BUDGET: {"seconds", "min_requests", "max_requests", "warmup"}
        JOB: {"tensors", "tensor_bytes", "block_bytes", "src": TABLES, "dst": TABLES},
             TABLES one block table (a list of block indices) per rotation
        prints one JSON line per case: {"case", "latencies", "wall_s"} or {"case", "error"},
        then one per job: {"serve", "latencies", "wall_s", "verified_pulls", "ranges"}
        or {"serve", "error"}

Both sides register ``REGION_BYTES`` of written memory. The cases rotate
their requests through ``cold`` bytes of it, as hixl-bench's ceilings and
hixl rows do. A serving job lays out a paged KV cache at the start of the
region on both sides (tensor t's block b at ``t * tensor_bytes + b *
block_bytes``) and pulls one prompt per request: every tensor's blocks of
the source table into the destination table's blocks, the rotations in
turn, as hixl's serving rows do with the same tables. Processes that created
a peer's agent may crash at interpreter exit, so both leave with
``os._exit`` after flushing.
"""

from __future__ import annotations

import base64
import ctypes
import importlib
import json
import mmap
import os
import sys
import time
from typing import Any

_PAGE = 4096
# Word i of a target filled with ``pattern`` holds i * PATTERN_KEY mod 2**32:
# odd, so a bijection of the word index, and a range pulled from the wrong
# offset differs in every word.
PATTERN_KEY = 0x9E37_79B1
_FILL_WORDS = 1 << 24  # the pattern is written this many words at a time


class _Buffer:
    """Anonymous, written memory (never-written pages would all be the zero page)."""

    def __init__(self, size: int, fill: int) -> None:
        self.map = mmap.mmap(-1, size)
        self.size = size
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        ctypes.memset(self.addr, fill, size)

    def fill_pattern(self) -> None:
        words = _words(self)
        for start in range(0, len(words), _FILL_WORDS):
            end = min(start + _FILL_WORDS, len(words))
            words[start:end] = expected_words(start * 4, (end - start) * 4)


def _numpy() -> Any:
    return importlib.import_module("numpy")


def _words(buffer: _Buffer) -> Any:
    np = _numpy()
    return np.frombuffer(buffer.map, dtype=np.uint32, count=buffer.size // 4)


def expected_words(offset: int, length: int) -> Any:
    """What ``length`` bytes at ``offset`` of a ``pattern`` target hold, as uint32 words."""
    np = _numpy()
    index = np.arange(offset // 4, (offset + length) // 4, dtype=np.uint32)
    return index * np.uint32(PATTERN_KEY)  # wraps modulo 2**32


# Mooncake's TCP transport fails a batch of more ranges than its lanes queue
# (-1, "TCP lane queue-full" in its log; 2,048 ranges pass, 2,500 do not),
# so a larger request goes as consecutive batches of at most this many.
MOONCAKE_MAX_BATCH = 1024


class Mooncake:
    """Mooncake Transfer Engine over TCP with P2PHANDSHAKE metadata."""

    def __init__(self, region: int, target: bool) -> None:
        module: Any = importlib.import_module("mooncake.engine")
        self.engine = module.TransferEngine()
        rc = self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"TransferEngine.initialize returned {rc}")
        self.buffer = _Buffer(region, 0x5A if target else 0)
        rc = self.engine.register_memory(self.buffer.addr, region)
        if rc != 0:
            raise RuntimeError(f"register_memory returned {rc}")
        self.target = ""
        self.remote_base = 0

    def info(self) -> dict[str, Any]:
        return {"target": f"127.0.0.1:{self.engine.get_rpc_port()}", "base": self.buffer.addr}

    def connect(self, info: dict[str, Any]) -> None:
        self.target, self.remote_base = info["target"], info["base"]

    def request(self, op: str, local_offsets: list[int], remote_offsets: list[int],
                lengths: list[int]) -> None:
        local = [self.buffer.addr + o for o in local_offsets]
        remote = [self.remote_base + o for o in remote_offsets]
        move = (self.engine.batch_transfer_sync_read if op == "pull"
                else self.engine.batch_transfer_sync_write)
        for start in range(0, len(lengths), MOONCAKE_MAX_BATCH):
            end = start + MOONCAKE_MAX_BATCH
            rc = move(self.target, local[start:end], remote[start:end], lengths[start:end])
            if rc != 0:
                raise RuntimeError(f"Mooncake transfer returned {rc}")


class Nixl:
    """NIXL with its UCX backend (the transports follow ``UCX_TLS``)."""

    def __init__(self, region: int, target: bool) -> None:
        api: Any = importlib.import_module("nixl._api")
        name = f"hixl-bench-{os.getpid()}"
        # The target only serves, so UCX's progress thread must run there; the
        # initiator polls its transfers, which progresses them in its own thread
        # (a second busy thread per process costs a whole core on small hosts).
        config = api.nixl_agent_config(enable_prog_thread=target, backends=["UCX"])
        self.agent = api.nixl_agent(name, config)
        self.buffer = _Buffer(region, 0x5A if target else 0)
        self.registered = self.agent.register_memory([(self.buffer.addr, region, 0, "")],
                                                     "DRAM")
        self.remote_name = ""
        self.remote_base = 0

    def info(self) -> dict[str, Any]:
        meta = base64.b64encode(self.agent.get_agent_metadata()).decode()
        return {"meta": meta, "base": self.buffer.addr}

    def connect(self, info: dict[str, Any]) -> None:
        self.remote_name = self.agent.add_remote_agent(base64.b64decode(info["meta"]))
        self.remote_base = info["base"]

    def request(self, op: str, local_offsets: list[int], remote_offsets: list[int],
                lengths: list[int]) -> None:
        base, remote_base = self.buffer.addr, self.remote_base
        local = self.agent.get_xfer_descs(
            [(base + o, n, 0) for o, n in zip(local_offsets, lengths, strict=True)], "DRAM")
        remote = self.agent.get_xfer_descs(
            [(remote_base + o, n, 0) for o, n in zip(remote_offsets, lengths, strict=True)],
            "DRAM")
        handle = self.agent.initialize_xfer("READ" if op == "pull" else "WRITE", local, remote,
                                            self.remote_name)
        try:
            state = self.agent.transfer(handle)
            while state not in ("DONE", "ERR"):
                state = self.agent.check_xfer_state(handle)
            if state == "ERR":
                raise RuntimeError("NIXL transfer failed")
        finally:
            self.agent.release_xfer_handle(handle)


ENGINES: dict[str, Any] = {"mooncake": Mooncake, "nixl": Nixl}


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _timed(one: Any, budget: dict[str, Any]) -> dict[str, Any]:
    """Warm-up calls of ``one(i)`` (it returns its own duration), then timed ones
    until the budget is spent, as hixl-bench's ``drive`` does."""
    warmup = max(1, budget["warmup"])
    for i in range(warmup):
        one(i)
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + budget["seconds"]
    while len(latencies) < budget["max_requests"] and (
            time.perf_counter() < deadline or len(latencies) < budget["min_requests"]):
        latencies.append(one(warmup + len(latencies)))
    return {"latencies": [round(x, 9) for x in latencies],
            "wall_s": time.perf_counter() - started}


def _run_case(engine: Any, cold: int, op: str, block: int, nblocks: int,
              budget: dict[str, Any]) -> dict[str, Any]:
    span = block * nblocks
    step = (span + _PAGE - 1) // _PAGE * _PAGE
    lengths = [block] * nblocks
    cursor = 0

    def one(_: int) -> float:
        nonlocal cursor
        if cursor + span > cold:
            cursor = 0
        offsets = [cursor + i * block for i in range(nblocks)]
        cursor += step
        t0 = time.perf_counter()
        engine.request(op, offsets, offsets, lengths)
        return time.perf_counter() - t0

    return _timed(one, budget)


Ranges = tuple[list[int], list[int], list[int]]


def prompt_ranges(job: dict[str, Any], rotation: int) -> Ranges:
    """(local offsets, remote offsets, lengths) of one prompt of ``job``.

    Every tensor's blocks, source block ``src[i]`` into destination block
    ``dst[i]``; neighbouring blocks that are contiguous on both sides become
    one range, as hixl coalesces them."""
    src, dst = job["src"][rotation], job["dst"][rotation]
    tensor_bytes, block = job["tensor_bytes"], job["block_bytes"]
    local: list[int] = []
    remote: list[int] = []
    lengths: list[int] = []
    for tensor in range(job["tensors"]):
        base = tensor * tensor_bytes
        for s, d in zip(src, dst, strict=True):
            lo, ro = base + d * block, base + s * block
            if lengths and local[-1] + lengths[-1] == lo and remote[-1] + lengths[-1] == ro:
                lengths[-1] += block
            else:
                local.append(lo)
                remote.append(ro)
                lengths.append(block)
    return local, remote, lengths


def check_ranges(buffer: _Buffer, ranges: Ranges) -> None:
    """Raise unless each local range holds the ``pattern`` of its remote range."""
    words = _words(buffer)
    for lo, ro, n in zip(*ranges, strict=True):
        got = words[lo // 4:(lo + n) // 4]
        want = expected_words(ro, n)
        if not (got == want).all():
            raise RuntimeError(f"the pull was not byte-exact: {n} bytes from remote offset "
                               f"{ro} to local offset {lo}")


def clear_ranges(buffer: _Buffer, ranges: Ranges) -> None:
    local, _, lengths = ranges
    for lo, n in zip(local, lengths, strict=True):
        ctypes.memset(buffer.addr + lo, 0, n)


def _run_serve(engine: Any, job: dict[str, Any], budget: dict[str, Any]) -> dict[str, Any]:
    """One serving job: every rotation pulled into cleared blocks and checked
    (which also warms every block the timed pulls move), the timed pulls, one
    in flight, then the last rotation checked again, as hixl's rows do.

    The ranges of each rotation are computed before the timed pulls: the
    peers get their descriptor lists made, where hixl gets block tables."""
    if job["tensors"] * job["tensor_bytes"] > engine.buffer.size:
        raise RuntimeError(f"the job's cache ({job['tensors']} x {job['tensor_bytes']} bytes) "
                           f"does not fit the registered {engine.buffer.size} bytes")
    rotations = [prompt_ranges(job, r) for r in range(len(job["src"]))]

    def verify(rotation: int) -> None:
        ranges = rotations[rotation]
        clear_ranges(engine.buffer, ranges)
        engine.request("pull", *ranges)
        check_ranges(engine.buffer, ranges)

    for rotation in range(len(rotations)):
        verify(rotation)

    def one(i: int) -> float:
        ranges = rotations[i % len(rotations)]
        t0 = time.perf_counter()
        engine.request("pull", *ranges)
        return time.perf_counter() - t0

    result = _timed(one, budget)
    verify(len(rotations) - 1)
    return {**result, "verified_pulls": len(rotations) + 1, "ranges": len(rotations[0][0])}


def main(argv: list[str]) -> None:
    role, name, region = argv[0], argv[1], int(argv[2])
    try:
        engine = ENGINES[name](region, role == "target")
        if role == "target":
            if argv[3] == "pattern":
                engine.buffer.fill_pattern()
            _emit({"info": engine.info()})
            sys.stdin.read()  # serve until the parent closes our stdin
        else:
            spec = json.loads(sys.stdin.read())
            engine.connect(spec["info"])
            for op, block, nblocks in spec["cases"]:
                try:
                    result = _run_case(engine, spec["cold"], op, block, nblocks,
                                       spec["budget"])
                except Exception as exc:  # one failed case is reported, the rest still run
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                _emit({"case": [op, block, nblocks], **result})
            for index, job in enumerate(spec.get("serve", [])):
                try:
                    result = _run_serve(engine, job, spec["serve_budget"])
                except Exception as exc:
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                _emit({"serve": index, **result})
    except Exception as exc:
        _emit({"error": f"{type(exc).__name__}: {exc}"})
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
