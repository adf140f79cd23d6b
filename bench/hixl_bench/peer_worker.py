"""One side of a peer transfer engine (Mooncake TE, NIXL), run as its own process by hixl-bench.

A standalone script (standard library plus the peer's package), so it can
run under another interpreter where the peer is installed:

    python peer_worker.py target ENGINE COLD_BYTES
        prints {"info": ...} once its memory is registered, serves until stdin closes
    python peer_worker.py initiator ENGINE COLD_BYTES < spec.json
        spec: {"info": <target's info>, "cases": [[op, block, nblocks], ...],
               "budget": {"seconds", "min_requests", "max_requests", "warmup"}}
        prints one JSON line per case: {"case", "latencies", "wall_s"} or {"case", "error"}

Both rotate requests through ``COLD_BYTES`` of registered, written memory, as
hixl-bench's ceilings and hixl rows do. Processes that created a peer's agent
may crash at interpreter exit, so both leave with ``os._exit`` after flushing.
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


class _Buffer:
    """Anonymous, written memory (never-written pages would all be the zero page)."""

    def __init__(self, size: int, fill: int) -> None:
        self.map = mmap.mmap(-1, size)
        self.size = size
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        ctypes.memset(self.addr, fill, size)


class Mooncake:
    """Mooncake Transfer Engine over TCP with P2PHANDSHAKE metadata."""

    def __init__(self, cold: int, target: bool) -> None:
        module: Any = importlib.import_module("mooncake.engine")
        self.engine = module.TransferEngine()
        rc = self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"TransferEngine.initialize returned {rc}")
        self.buffer = _Buffer(cold, 0x5A if target else 0)
        rc = self.engine.register_memory(self.buffer.addr, cold)
        if rc != 0:
            raise RuntimeError(f"register_memory returned {rc}")
        self.target = ""
        self.remote_base = 0

    def info(self) -> dict[str, Any]:
        return {"target": f"127.0.0.1:{self.engine.get_rpc_port()}", "base": self.buffer.addr}

    def connect(self, info: dict[str, Any]) -> None:
        self.target, self.remote_base = info["target"], info["base"]

    def request(self, op: str, offsets: list[int], block: int) -> None:
        local = [self.buffer.addr + o for o in offsets]
        remote = [self.remote_base + o for o in offsets]
        move = (self.engine.batch_transfer_sync_read if op == "pull"
                else self.engine.batch_transfer_sync_write)
        rc = move(self.target, local, remote, [block] * len(offsets))
        if rc != 0:
            raise RuntimeError(f"Mooncake transfer returned {rc}")


class Nixl:
    """NIXL with its UCX backend (the transports follow ``UCX_TLS``)."""

    def __init__(self, cold: int, target: bool) -> None:
        api: Any = importlib.import_module("nixl._api")
        name = f"hixl-bench-{os.getpid()}"
        # The target only serves, so UCX's progress thread must run there; the
        # initiator polls its transfers, which progresses them in its own thread
        # (a second busy thread per process costs a whole core on small hosts).
        config = api.nixl_agent_config(enable_prog_thread=target, backends=["UCX"])
        self.agent = api.nixl_agent(name, config)
        self.buffer = _Buffer(cold, 0x5A if target else 0)
        self.registered = self.agent.register_memory([(self.buffer.addr, cold, 0, "")], "DRAM")
        self.remote_name = ""
        self.remote_base = 0

    def info(self) -> dict[str, Any]:
        meta = base64.b64encode(self.agent.get_agent_metadata()).decode()
        return {"meta": meta, "base": self.buffer.addr}

    def connect(self, info: dict[str, Any]) -> None:
        self.remote_name = self.agent.add_remote_agent(base64.b64decode(info["meta"]))
        self.remote_base = info["base"]

    def request(self, op: str, offsets: list[int], block: int) -> None:
        local = self.agent.get_xfer_descs([(self.buffer.addr + o, block, 0) for o in offsets],
                                          "DRAM")
        remote = self.agent.get_xfer_descs([(self.remote_base + o, block, 0) for o in offsets],
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


def _run_case(engine: Any, cold: int, op: str, block: int, nblocks: int,
              budget: dict[str, Any]) -> dict[str, Any]:
    span = block * nblocks
    step = (span + _PAGE - 1) // _PAGE * _PAGE
    cursor = 0

    def one() -> float:
        nonlocal cursor
        if cursor + span > cold:
            cursor = 0
        offsets = [cursor + i * block for i in range(nblocks)]
        cursor += step
        t0 = time.perf_counter()
        engine.request(op, offsets, block)
        return time.perf_counter() - t0

    for _ in range(max(1, budget["warmup"])):
        one()
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + budget["seconds"]
    while len(latencies) < budget["max_requests"] and (
            time.perf_counter() < deadline or len(latencies) < budget["min_requests"]):
        latencies.append(one())
    return {"latencies": [round(x, 9) for x in latencies],
            "wall_s": time.perf_counter() - started}


def main(argv: list[str]) -> None:
    role, name, cold = argv[0], argv[1], int(argv[2])
    try:
        engine = ENGINES[name](cold, role == "target")
        if role == "target":
            _emit({"info": engine.info()})
            sys.stdin.read()  # serve until the parent closes our stdin
        else:
            spec = json.loads(sys.stdin.read())
            engine.connect(spec["info"])
            for op, block, nblocks in spec["cases"]:
                try:
                    result = _run_case(engine, cold, op, block, nblocks, spec["budget"])
                except Exception as exc:  # one failed case is reported, the rest still run
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                _emit({"case": [op, block, nblocks], **result})
    except Exception as exc:
        _emit({"error": f"{type(exc).__name__}: {exc}"})
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
