"""Hardware smoke test of the Ascend path: ``python -m hixl_service.ascend.smoke``.

For an operator on an NPU host (docs/ascend.md). It loads CANN, lists
the optional entry points found, exports a device buffer to a second process
and checks it there, builds a two-rank communicator between two devices
(each rank in its own process, as CANN creates communicators one at a time
per process) and, given ``--peer``, between two hosts; it moves one range and
then many, both ways, byte for byte, two-sided (``HcclSend`` / ``HcclRecv``)
and, where CANN has the one-sided API, one-sided as the daemon does
(registered, bound and prepared memory, ``HcclBatchPut`` / ``HcclBatchGet``),
shows that a receive whose peer never sends times out and tears down without
hanging, and measures one large range and many small ones each way. It
prints a Markdown report to paste into an issue and exits 0 when every check
passed, 1 otherwise.

The second rank is a worker process driven over a TCP connection with one
JSON object per line: started by the test itself for devices on this host,
or by ``--listen HOST:PORT`` on another host for ``--peer HOST:PORT``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hixl_native import _ascend

from .comms import A3_SOC_PREFIX, RankInfo, hccn_addresses, rank_table

MIB = 1 << 20
ANSWER_S = 120.0
TIMEOUT_PROBE_MS = 500
TEARDOWN_WAIT_MS = 2000
# A first transfer slower than this stalled on link set-up: HCCL builds a
# communicator's links in its first operation and waits for the peer's
# (HCCL_CONNECT_TIMEOUT, 120 s by default); paired, it takes seconds at most.
FIRST_TRANSFER_BOUND_S = 20.0
# How late the worker joins a communicator (join_pair): shows whether HCCL's
# creation waits for the other rank (issue 30, defect 6).
JOIN_DELAY_S = 0.3
HCCL_E_PARA = 1


def data(n: int, seed: int) -> bytes:
    """Deterministic bytes both processes can make."""
    return random.Random(seed).randbytes(n)


def spread(count: int, size: int) -> list[tuple[int, int]]:
    """``count`` ranges of ``size`` bytes with a gap of ``size`` between them."""
    return [(2 * i * size, size) for i in range(count)]


# --------------------------------------------------------------- a rank


class Rank:
    """One rank's device, buffer, stream and communicator."""

    def __init__(self, runtime: _ascend.AscendRuntime, device_id: int, nbytes: int) -> None:
        self.device = runtime.set_device(device_id)
        self.buffer = self.device.malloc(nbytes)
        self.stream = self.device.create_stream()
        self.comm: _ascend.HcclComm | None = None
        # one-sided: the buffer registered once, and whether the communicator holds it
        self.registered: _ascend.GlobalMemory | None = None
        self.bound = False

    def describe(self, host_ip: str) -> RankInfo:
        """This rank as the daemon describes it (AscendBackend.rank_info): on an A3
        product with its super-pod ids, so that the table is version 1.2."""
        physical = _ascend.physical_device_id(self.device)
        soc = _ascend.soc_name() or ""
        super_device_id = super_pod_id = None
        if soc.startswith(A3_SOC_PREFIX):
            super_device_id, super_pod_id = _ascend.super_pod_ids(self.device)
        return RankInfo(host_ip, physical, hccn_addresses().get(physical, ""), soc,
                        super_device_id, super_pod_id)

    def join(self, spec: dict[str, Any], rank: int) -> None:
        if spec.get("table"):
            self.comm = _ascend.comm_from_rank_table(self.device, spec["table"], rank,
                                                     buffer_mb=spec["buffer_mb"],
                                                     name=spec["name"])
        else:
            self.comm = _ascend.HcclComm(self.device, bytes.fromhex(spec["root"]), 2, rank,
                                         buffer_mb=spec["buffer_mb"], name=spec["name"])

    def prepare(self, timeout_s: int) -> None:
        """Register the buffer (once), bind it and prepare the communicator, as
        the daemon does right after building one (blocks until the peer prepares)."""
        assert self.comm is not None
        if self.registered is None:
            self.registered = _ascend.GlobalMemory(self.buffer)
        _ascend.hccl_bind(self.comm, self.registered)
        self.bound = True
        _ascend.hccl_prepare(self.comm, timeout_s)

    def one_sided(self, put: bool, ranges: list[tuple[int, int]], far: tuple[int, int]) -> None:
        """HcclBatchPut (our ranges to the same offsets there) or HcclBatchGet."""
        assert self.comm is not None
        triples = np.array([(off, off, size) for off, size in ranges], dtype=np.uint64)
        queue = _ascend.hccl_batch_put if put else _ascend.hccl_batch_get
        queue(self.comm, self.buffer, triples, far[0], far[1], 1 - self.comm.rank, self.stream)

    def _unbind(self) -> None:
        if self.bound and self.comm is not None and self.registered is not None:
            self.bound = False
            _ascend.hccl_unbind(self.comm, self.registered)

    def post(self, sending: bool, ranges: list[tuple[int, int]]) -> None:
        """One HcclSend / HcclRecv per range (one per peer and direction each)."""
        assert self.comm is not None
        peer = 1 - self.comm.rank
        op = self.comm.send if sending else self.comm.recv
        for offset, size in ranges:
            op(self.buffer, offset, size, peer, self.stream)

    def leave(self) -> float:
        """Tear the communicator down as the daemon does; returns the seconds taken."""
        start = time.monotonic()
        if self.stream.pending:
            try:
                self.stream.abort()
                time.sleep(0.1)  # as the daemon: aicpu may still unfold aborted tasks
            except _ascend.AclError:
                pass  # absent on this CANN: the bounded wait decides
        self._unbind()
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None
        self.stream.destroy(TEARDOWN_WAIT_MS)
        self.stream = self.device.create_stream()
        return time.monotonic() - start

    def close(self) -> None:
        self._unbind()
        if self.comm is not None:
            self.comm.destroy()
        self.stream.destroy(TEARDOWN_WAIT_MS)
        if self.registered is not None:
            self.registered.release()
        self.buffer.close()


# ------------------------------------------------------------ the worker


def _serve(conn: socket.socket, runtime: _ascend.AscendRuntime, device_id: int,
           nbytes: int) -> None:
    rank = Rank(runtime, device_id, nbytes)
    reader = conn.makefile("r")
    try:
        for line in reader:
            request = json.loads(line)
            op = request["op"]
            reply: dict[str, Any] = {"ok": True}
            try:
                if op == "hello":
                    reply["rank"] = rank.describe(conn.getsockname()[0]).__dict__
                    reply["tgid"] = runtime.bare_tgid()
                elif op == "import":
                    with rank.device.import_ipc(request["key"], request["size"]) as imported:
                        n = request["n"]
                        reply["ok"] = imported.read(0, n) == data(n, request["seed"])
                        imported.write(0, data(n, request["write_seed"]))
                elif op == "join":
                    time.sleep(min(float(request.get("delay_s", 0)), 5.0))
                    rank.join(request, 1)
                elif op == "fill":
                    rank.buffer.write(0, data(request["n"], request["seed"]))
                elif op == "digest":
                    reply["sha256"] = hashlib.sha256(rank.buffer.read(0, request["n"])).hexdigest()
                elif op == "post":
                    rank.post(request["send"], [tuple(r) for r in request["ranges"]])
                elif op == "sync":
                    rank.stream.synchronize(timeout_ms=request["ms"])
                elif op == "prepare":
                    rank.prepare(request["s"])
                    reply["memory"] = [rank.buffer.address, rank.buffer.size]
                elif op == "leave":
                    reply["s"] = rank.leave()
                elif op == "quit":
                    conn.sendall(b'{"ok": true}\n')
                    return
            except (_ascend.AscendError, ValueError) as exc:
                reply = {"ok": False, "error": str(exc),
                         "code": getattr(exc, "code", 0)}
            conn.sendall(json.dumps(reply).encode() + b"\n")
    finally:
        rank.close()


class Worker:
    """The other rank, over its control connection."""

    def __init__(self, conn: socket.socket, proc: subprocess.Popen[bytes] | None) -> None:
        self.conn = conn
        self.proc = proc
        self._reader = conn.makefile("r")
        conn.settimeout(ANSWER_S)

    def send(self, **request: Any) -> None:
        self.conn.sendall(json.dumps(request).encode() + b"\n")

    def answer(self) -> dict[str, Any]:
        line = self._reader.readline()
        if not line:
            raise RuntimeError("the worker went away")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, **request: Any) -> dict[str, Any]:
        self.send(**request)
        return self.answer()

    def close(self) -> None:
        try:
            self.ask(op="quit")
        except (OSError, RuntimeError, ValueError):
            pass
        self.conn.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=ANSWER_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def local_worker(args: argparse.Namespace, device_id: int) -> Iterator[Worker]:
    """A worker process on a device of this host, connected back to us."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(ANSWER_S)
        port = listener.getsockname()[1]
        command = [sys.executable, "-m", "hixl_service.ascend.smoke", "--worker",
                   f"127.0.0.1:{port}", "--worker-device", str(device_id),
                   "--size-mb", str(args.size_mb)]
        if args.cann_path:
            command += ["--cann-path", args.cann_path]
        proc = subprocess.Popen(command)
        try:
            conn, _ = listener.accept()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    worker = Worker(conn, proc)
    try:
        yield worker
    finally:
        worker.close()


# ---------------------------------------------------------------- checks


@dataclass
class Report:
    rows: list[tuple[str, bool, str]] = field(default_factory=list)

    def check(self, name: str, run: Callable[[], str]) -> bool:
        try:
            detail = run()
            ok = True
        except Exception as exc:  # a failed check is reported, the others still run
            detail, ok = f"{type(exc).__name__}: {exc}", False
        self.rows.append((name, ok, detail))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", file=sys.stderr, flush=True)
        return ok

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.rows)

    def markdown(self, header: list[str]) -> str:
        lines = ["### hixl Ascend smoke test", "", *header, "",
                 "| check | result | detail |", "| --- | --- | --- |"]
        lines += [f"| {name} | {'ok' if ok else '**FAIL**'} | {detail} |"
                  for name, ok, detail in self.rows]
        return "\n".join(lines)


def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def join_pair(runtime: _ascend.AscendRuntime, me: Rank, worker: Worker, mode: str,
              buffer_mb: int, name: str, host_ip: str) -> str:
    """Build the two-rank communicator (rank 0 here, rank 1 in the worker)."""
    far = RankInfo(**worker.ask(op="hello")["rank"])
    mine = me.describe(host_ip)
    if mode == "rank_table":
        table = rank_table(mine, far)
        spec: dict[str, Any] = {"table": table}
        how = f"rank table {json.loads(table)['version']}"
    else:
        spec = {"root": me.device.hccl_root_info().hex()}
        how = "root info"
    spec.update(buffer_mb=buffer_mb, name=name)
    start = time.monotonic()
    # The worker joins JOIN_DELAY_S late: whether creation waits for the peer is
    # what the daemons' creation reservation (ascend/gate.py) guards against.
    worker.send(op="join", delay_s=JOIN_DELAY_S, **spec)
    me.join(spec, 0)
    joined = time.monotonic() - start
    reply = worker.answer()
    _expect(reply["ok"], f"rank 1: {reply.get('error')}")
    waits = ("creation waited for the late peer" if joined >= JOIN_DELAY_S
             else "creation did not wait for the late peer")
    return (f"{how}, SoC {mine.soc or 'unknown'} / {far.soc or 'unknown'}, rank 0 returned "
            f"after {joined:.2f} s with rank 1 {JOIN_DELAY_S} s late ({waits}), "
            f"buffer {buffer_mb} MB")


def move(me: Rank, worker: Worker, sending: bool, ranges: list[tuple[int, int]],
         timeout_ms: int) -> float:
    """One batch of ranges between the ranks; returns the seconds it took."""
    start = time.monotonic()
    worker.send(op="post", send=not sending, ranges=ranges)
    me.post(sending, ranges)
    reply = worker.answer()
    _expect(reply["ok"], f"rank 1: {reply.get('error')}")
    me.stream.synchronize(timeout_ms=timeout_ms)
    reply = worker.ask(op="sync", ms=timeout_ms)
    _expect(reply["ok"], f"rank 1: {reply.get('error')}")
    return time.monotonic() - start


def exact(me: Rank, worker: Worker, ranges: list[tuple[int, int]], seed: int,
          far: tuple[int, int] | None = None) -> str:
    """Move ``ranges`` there and back and compare every byte: two-sided, or
    one-sided (put, then get) into the worker's prepared memory ``far``."""
    def there_and_back(sending: bool) -> None:
        if far is None:
            move(me, worker, sending, ranges, 30_000)
        else:
            move_one_sided(me, sending, ranges, far, 30_000)

    n = max(off + size for off, size in ranges)
    sent, old = data(n, seed), data(n, seed + 1)
    me.buffer.write(0, sent)
    _expect(worker.ask(op="fill", n=n, seed=seed + 1)["ok"], "fill")
    there_and_back(True)
    expected = bytearray(old)
    for off, size in ranges:
        expected[off:off + size] = sent[off:off + size]
    _expect(worker.ask(op="digest", n=n)["sha256"] == hashlib.sha256(expected).hexdigest(),
            "rank 1's bytes differ after the send")
    back = data(n, seed + 2)
    _expect(worker.ask(op="fill", n=n, seed=seed + 2)["ok"], "fill")
    me.buffer.write(0, old)
    there_and_back(False)
    expected = bytearray(old)
    for off, size in ranges:
        expected[off:off + size] = back[off:off + size]
    _expect(me.buffer.read(0, n) == bytes(expected), "our bytes differ after the receive")
    how = "two-sided" if far is None else "one-sided (put, then get)"
    return f"{len(ranges)} x {ranges[0][1]} B both ways {how}, byte-exact"


def prepare_pair(me: Rank, worker: Worker) -> tuple[int, int]:
    """Bind and prepare both ranks at once; returns the worker's memory (address, size)."""
    worker.send(op="prepare", s=30)
    me.prepare(30)
    reply = worker.answer()
    _expect(reply["ok"], f"rank 1: {reply.get('error')}")
    address, size = reply["memory"]
    return int(address), int(size)


def move_one_sided(me: Rank, put: bool, ranges: list[tuple[int, int]], far: tuple[int, int],
                   timeout_ms: int) -> float:
    """One-sided: only this rank queues work; returns the seconds it took."""
    start = time.monotonic()
    me.one_sided(put, ranges, far)
    me.stream.synchronize(timeout_ms=timeout_ms)
    return time.monotonic() - start


def first_transfer(me: Rank, worker: Worker) -> str:
    """The communicator's first operation, paired on both ranks as the daemon's
    warm-up is: it sets up the links, so it shows how long that takes."""
    took = move(me, worker, True, [(0, 4096)], 30_000)
    _expect(took < FIRST_TRANSFER_BOUND_S,
            f"the first transfer took {took:.1f} s (a stall on link set-up)")
    return f"{took:.2f} s for the first 4 KiB (links set up inside it)"


def release_while_bound(me: Rank) -> str:
    """What hixl's release order relies on: HCCL refuses to deregister memory, and
    to destroy a communicator, while memory is bound to it (HCCL_E_PARA)."""
    assert me.comm is not None and me.registered is not None and me.bound
    refused = []
    for what, call in (("deregister", me.registered.release), ("destroy", me.comm.destroy)):
        try:
            call()
        except _ascend.HcclError as exc:
            _expect(exc.code == HCCL_E_PARA, f"{what} while bound: {exc}")
            refused.append(what)
            continue
        raise AssertionError(f"HCCL let {what} through while memory was bound")
    _expect(not me.comm.closed and not me.registered.closed, "HCCL dropped them anyway")
    return f"HCCL refused {' and '.join(refused)} while bound (HCCL_E_PARA)"


def throughput_one_sided(me: Rank, far: tuple[int, int], ranges: list[tuple[int, int]]) -> str:
    total = sum(size for _, size in ranges)
    rates = []
    for put in (True, False):
        best = min(move_one_sided(me, put, ranges, far, 60_000) for _ in range(3))
        rates.append(f"{'put' if put else 'get'} {total / best / 1e9:.2f} GB/s")
    return f"{len(ranges)} x {ranges[0][1]} B: {', '.join(rates)} (best of 3)"


def throughput(me: Rank, worker: Worker, ranges: list[tuple[int, int]]) -> str:
    total = sum(size for _, size in ranges)
    best = min(move(me, worker, True, ranges, 60_000) for _ in range(3))
    return f"{len(ranges)} x {ranges[0][1]} B: {total / best / 1e9:.2f} GB/s (best of 3)"


def receive_timeout(me: Rank, worker: Worker) -> str:
    """A receive the peer never sends: the synchronize times out and the
    tear-down (abort, communicator, stream) returns."""
    me.post(False, [(0, 4096)])
    try:
        me.stream.synchronize(timeout_ms=TIMEOUT_PROBE_MS)
    except _ascend.AclError as exc:
        _expect(exc.code == 507046, f"expected a timeout (507046), got {exc}")
    else:
        raise AssertionError("a receive without a send completed")
    took = me.leave()
    abandoned = _ascend.live_objects()["abandoned_streams"]
    _expect(abandoned == 0, f"{abandoned} stream(s) abandoned")
    worker.ask(op="leave")
    return f"timed out after {TIMEOUT_PROBE_MS} ms, torn down in {took:.2f} s"


def pair_checks(report: Report, runtime: _ascend.AscendRuntime, me: Rank, worker: Worker,
                label: str, args: argparse.Namespace, host_ip: str) -> None:
    mode = args.comm_init or ("rank_table" if "rank_table" in runtime.features else "root_info")
    name = f"hixl-smoke-{os.getpid()}-{label.replace(' ', '-')}"
    if not report.check(f"communicator {label}", lambda: join_pair(
            runtime, me, worker, mode, args.buffer_mb, name, host_ip)):
        return
    block = args.block_kib * 1024
    report.check(f"first transfer {label}", lambda: first_transfer(me, worker))
    report.check(f"one range {label}", lambda: exact(me, worker, [(0, MIB)], 11))
    report.check(f"many ranges {label}", lambda: exact(
        me, worker, spread(min(args.blocks, args.size_mb * MIB // (2 * block)), block), 21))
    report.check(f"throughput {args.size_mb} MiB {label}",
                 lambda: throughput(me, worker, [(0, args.size_mb * MIB)]))
    small = spread(args.blocks, block)[:args.size_mb * MIB // (2 * block)]
    report.check(f"throughput {args.blocks} x {args.block_kib} KiB {label}",
                 lambda: throughput(me, worker, small))
    if "one_sided" in runtime.features:
        far: list[tuple[int, int]] = []
        if report.check(f"one-sided prepare {label}",
                        lambda: _prepared(far, prepare_pair(me, worker))):
            report.check(f"one-sided one range {label}",
                         lambda: exact(me, worker, [(0, MIB)], 31, far[0]))
            report.check(f"one-sided many ranges {label}", lambda: exact(
                me, worker, spread(min(args.blocks, args.size_mb * MIB // (2 * block)), block),
                41, far[0]))
            report.check(f"one-sided throughput {args.size_mb} MiB {label}",
                         lambda: throughput_one_sided(me, far[0], [(0, args.size_mb * MIB)]))
            report.check(f"one-sided throughput {args.blocks} x {args.block_kib} KiB {label}",
                         lambda: throughput_one_sided(me, far[0], small))
            report.check(f"release while bound {label}", lambda: release_while_bound(me))
    report.check(f"receive timeout {label}", lambda: receive_timeout(me, worker))
    if me.comm is not None:
        me.leave()
        worker.ask(op="leave")


def _prepared(box: list[tuple[int, int]], far: tuple[int, int]) -> str:
    box.append(far)
    return f"both buffers registered, bound and prepared; rank 1's at {far[0]:#x}"


def ipc_check(me: Rank, worker: Worker) -> str:
    n = MIB + 3
    me.buffer.write(0, data(n, 5))
    key = me.buffer.export_key(pid_validation=True)
    try:
        tgid = worker.ask(op="hello")["tgid"]
        me.buffer.allow_import([tgid])
        reply = worker.ask(op="import", key=key, size=me.buffer.size, n=n, seed=5, write_seed=6)
        _expect(reply["ok"], f"the importer saw other bytes or failed: {reply.get('error')}")
        _expect(me.buffer.read(0, n) == data(n, 6), "the importer's writes are not here")
    finally:
        me.buffer.unexport()
    return f"exported for tgid {tgid}, imported, checked and written back ({n} B)"


def run(args: argparse.Namespace) -> int:
    header = [f"- host: {platform.node()} ({platform.machine()}, Linux {platform.release()})",
              f"- python {platform.python_version()}, hixl smoke, {time.strftime('%Y-%m-%d')}"]
    report = Report()
    runtime_box: list[_ascend.AscendRuntime] = []

    def load() -> str:
        runtime_box.append(_ascend.load(args.cann_path or None))
        rt = runtime_box[0]
        optional = ("sync_timeout", "ipc", "batch_send_recv", "recent_error_message",
                    "bare_tgid", "error_string", "stream_abort", "rank_table",
                    "root_info_config", "physical_device_id", "one_sided", "host_register",
                    "host_pin", "soc_info")
        missing = [f for f in optional if f not in rt.features]
        return (f"{rt.paths[0]}, {rt.paths[1]}; optional entry points found: "
                f"{', '.join(sorted(rt.features))}; missing: {', '.join(missing) or 'none'}")

    if not report.check("load CANN", load):
        print(report.markdown(header))
        return 1
    runtime = runtime_box[0]
    report.check("devices", lambda: f"{runtime.device_count()} visible; using {args.devices}")
    nbytes = args.size_mb * MIB
    me = Rank(runtime, args.devices[0], nbytes)
    try:
        if len(args.devices) > 1:
            with local_worker(args, args.devices[1]) as worker:
                report.check("IPC across processes", lambda: ipc_check(me, worker))
                pair_checks(report, runtime, me, worker,
                            f"devices {args.devices[0]}-{args.devices[1]}", args, "127.0.0.1")
        if args.peer:
            host, _, port = args.peer.rpartition(":")
            conn = socket.create_connection((host, int(port)), timeout=ANSWER_S)
            worker = Worker(conn, None)
            try:
                pair_checks(report, runtime, me, worker, f"to {args.peer}", args,
                            conn.getsockname()[0])
            finally:
                worker.close()
    finally:
        me.close()
    print(report.markdown(header))
    return 0 if report.passed else 1


def _endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "0.0.0.0", int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hixl_service.ascend.smoke",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cann-path", default="", help="directory of libascendcl.so and "
                        "libhccl.so (default: the CANN environment)")
    parser.add_argument("--devices", default="0,1",
                        help="this host's devices: rank 0, and rank 1 of the local pair")
    parser.add_argument("--peer", default="", help="HOST:PORT of a --listen run on another host")
    parser.add_argument("--listen", default="", help="serve as rank 1 for a --peer run")
    parser.add_argument("--comm-init", choices=("rank_table", "root_info"), default=None)
    parser.add_argument("--buffer-mb", type=int, default=200, help="HCCL buffer per communicator")
    parser.add_argument("--size-mb", type=int, default=128, help="the large range, MiB")
    parser.add_argument("--blocks", type=int, default=1000, help="small ranges measured")
    parser.add_argument("--block-kib", type=int, default=64, help="size of a small range")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--worker-device", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.devices = [int(d) for d in args.devices.split(",") if d.strip()]
    if args.worker or args.listen:
        runtime = _ascend.load(args.cann_path or None)
        nbytes = args.size_mb * MIB
        if args.worker:
            with socket.create_connection(_endpoint(args.worker), timeout=ANSWER_S) as conn:
                conn.settimeout(None)
                _serve(conn, runtime, args.worker_device, nbytes)
            return 0
        with socket.create_server(_endpoint(args.listen)) as listener:
            bound = listener.getsockname()
            print(f"rank 1 on device {args.devices[0]} waiting at {bound[0]}:{bound[1]}",
                  flush=True)
            conn, peer = listener.accept()
            with conn:
                print(f"serving {peer[0]}", flush=True)
                _serve(conn, runtime, args.devices[0], nbytes)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
