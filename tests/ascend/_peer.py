"""The other process of the IPC and HCCL tests: ``python -m tests.ascend._peer ROLE ...``.

Roles:
    ipc LIB_DIR: print ``ready <pid>``, then serve lines
        ``import KEY SIZE N CHECK_SEED WRITE_SEED`` (import on device 1, check the
        first N bytes against ``pattern(N, CHECK_SEED)``, write
        ``pattern(N, WRITE_SEED)`` there, close; answer ``ok``, ``mismatch`` or
        ``error CODE``), ``hold KEY SIZE`` (import and keep it open) and
        ``release`` (close what it holds) until ``quit``.
    hccl LIB_DIR ROOT_HEX NBYTES: join as rank 1 on device 1, receive NBYTES,
        send them back with every byte incremented, print ``done``.
    rank1 LIB_DIR (root HEX | table JSON_HEX): join as rank 1 on device 1 (by
        root info or rank table) with an 8 MiB buffer and a stream, print
        ``ready``, then serve one line per command, answering ``ok``, ``error
        CODE`` or ``mismatch``: ``send OFF N`` / ``recv OFF N`` (queue one
        operation with rank 0), ``batch KIND:OFF:N ...`` (KIND ``s`` or ``r``),
        ``ranges send|recv HEX`` (`HcclComm.send_ranges` / ``recv_ranges`` of
        little-endian uint64 pairs), ``write OFF N SEED`` / ``check OFF N SEED``
        (the buffer against ``pattern``), ``read OFF N`` (answered in hex),
        ``sync MS``; one-sided: ``address`` (the buffer's address and size),
        ``register`` / ``deregister`` (`GlobalMemory` of the buffer),
        ``bind`` / ``unbind`` (to the communicator), ``prepare SECONDS``
        (answered once rank 0 prepared too); until ``quit`` (tear down, print
        ``bye``).

Communicators are created one at a time per process (the shim's lock, as
CANN asks), so the two ranks of one communicator live in two processes.
"""

from __future__ import annotations

import sys

# HCCL sets a communicator's links up in its first send/receive host call,
# which waits for the peer's own first call: `Rank1.link_up` pairs them.
WARM_BYTES = 64


def pattern(n: int, seed: int = 0) -> bytes:
    """Deterministic test bytes (period 256, so built from one period)."""
    period = bytes((i * 31 + seed) & 0xFF for i in range(256))
    return (period * (n // 256 + 1))[:n]


def serve_ipc(lib_dir: str) -> None:
    from hixl_native import _ascend

    rt = _ascend.load(lib_dir)
    dev = rt.set_device(1)
    print("ready", rt.bare_tgid(), flush=True)
    held: list[_ascend.ImportedBuffer] = []
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "hold":
            held.append(dev.import_ipc(words[1], int(words[2])))
            print("ok", flush=True)
            continue
        if words[0] == "release":
            while held:
                held.pop().close()
            print("ok", flush=True)
            continue
        key, size, n, check_seed, write_seed = words[1], *map(int, words[2:])
        try:
            with dev.import_ipc(key, size) as buf:
                same = buf.read(0, n) == pattern(n, check_seed)
                buf.write(0, pattern(n, write_seed))
            print("ok" if same else "mismatch", flush=True)
        except _ascend.AclError as e:
            print("error", e.code, flush=True)


def serve_hccl(lib_dir: str, root_hex: str, nbytes: int) -> None:
    from hixl_native import _ascend

    rt = _ascend.load(lib_dir)
    dev = rt.set_device(1)
    with dev.create_stream() as stream, dev.malloc(nbytes) as buf, \
            _ascend.HcclComm(dev, bytes.fromhex(root_hex), 2, 1) as comm:
        comm.recv(buf, 0, nbytes, 0, stream)
        stream.synchronize(timeout_ms=10_000)
        buf.write(0, bytes((b + 1) & 0xFF for b in buf.read(0, nbytes)))
        comm.send(buf, 0, nbytes, 0, stream)
        stream.synchronize(timeout_ms=10_000)
    print("done", flush=True)


def serve_rank1(lib_dir: str, how: str, blob_hex: str) -> None:
    from hixl_native import _ascend

    rt = _ascend.load(lib_dir)
    dev = rt.set_device(1)
    stream = dev.create_stream()
    buf = dev.malloc(8 << 20)
    if how == "root":
        comm = _ascend.HcclComm(dev, bytes.fromhex(blob_hex), 2, 1)
    else:
        comm = _ascend.comm_from_rank_table(dev, bytes.fromhex(blob_hex).decode(), 1,
                                            buffer_mb=1, name="rank1-test")
    print("ready", flush=True)
    item = _ascend.SendRecvItem
    registered = None
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "quit":
            break
        try:
            answer = "ok"
            if cmd in ("send", "recv"):
                off, n = map(int, args)
                (comm.send if cmd == "send" else comm.recv)(buf, off, n, 0, stream)
            elif cmd == "batch":
                items = []
                for spec in args:
                    kind, off, n = spec.split(":")
                    make = item.send if kind == "s" else item.recv
                    items.append(make(buf, int(off), int(n), 0))
                comm.batch_send_recv(items, stream)
            elif cmd == "ranges":  # send|recv, then the (offset, length) pairs as hex
                import numpy as np

                pairs = np.frombuffer(bytes.fromhex(args[1]), "<u8").reshape(-1, 2).copy()
                queue = comm.send_ranges if args[0] == "send" else comm.recv_ranges
                queue(buf, pairs, 0, stream)
            elif cmd == "warm":  # the first operation of a communicator: rank 0 pairs it
                comm.batch_send_recv([item.send(buf, 0, WARM_BYTES, 0),
                                      item.recv(buf, WARM_BYTES, WARM_BYTES, 0)], stream)
                stream.synchronize(timeout_ms=10_000)
            elif cmd == "read":
                off, n = map(int, args)
                answer = buf.read(off, n).hex()
            elif cmd == "write":
                off, n, seed = map(int, args)
                buf.write(off, pattern(n, seed))
            elif cmd == "check":
                off, n, seed = map(int, args)
                answer = "ok" if buf.read(off, n) == pattern(n, seed) else "mismatch"
            elif cmd == "sync":
                stream.synchronize(timeout_ms=int(args[0]))
            elif cmd == "address":
                answer = f"{buf.address} {buf.size}"
            elif cmd == "register":
                registered = _ascend.GlobalMemory(buf)
            elif cmd == "deregister" and registered is not None:
                registered.release()
                registered = None
            elif cmd in ("bind", "unbind") and registered is not None:
                (_ascend.hccl_bind if cmd == "bind" else _ascend.hccl_unbind)(comm, registered)
            elif cmd == "prepare":
                _ascend.hccl_prepare(comm, int(args[0]))
            else:
                answer = f"unknown {cmd}"
        except _ascend.AscendError as e:
            answer = f"error {e.code}"
        print(answer, flush=True)
    if registered is not None:  # registered memory cannot be freed: undo it first
        for undo in (lambda: _ascend.hccl_unbind(comm, registered), registered.release):
            try:
                undo()
            except _ascend.AscendError:
                pass  # not bound
    comm.destroy()
    stream.destroy()
    buf.close()
    print("bye", flush=True)


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "ipc":
        serve_ipc(sys.argv[2])
    elif role == "hccl":
        serve_hccl(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif role == "rank1":
        serve_rank1(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(f"unknown role {role!r}")
