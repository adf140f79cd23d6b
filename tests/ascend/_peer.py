"""The other process of the IPC and HCCL tests: ``python -m tests.ascend._peer ROLE ...``.

Roles:
    ipc LIB_DIR: print ``ready <pid>``, then serve lines
        ``import KEY SIZE N CHECK_SEED WRITE_SEED`` (import on device 1, check the
        first N bytes against ``pattern(N, CHECK_SEED)``, write
        ``pattern(N, WRITE_SEED)`` there, close; answer ``ok``, ``mismatch`` or
        ``error CODE``) until ``quit``.
    hccl LIB_DIR ROOT_HEX NBYTES: join as rank 1 on device 1, receive NBYTES,
        send them back with every byte incremented, print ``done``.
"""

from __future__ import annotations

import sys


def pattern(n: int, seed: int = 0) -> bytes:
    """Deterministic test bytes (period 256, so built from one period)."""
    period = bytes((i * 31 + seed) & 0xFF for i in range(256))
    return (period * (n // 256 + 1))[:n]


def serve_ipc(lib_dir: str) -> None:
    from hixl_native import _ascend

    rt = _ascend.load(lib_dir)
    dev = rt.set_device(1)
    print("ready", rt.bare_tgid(), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
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


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "ipc":
        serve_ipc(sys.argv[2])
    elif role == "hccl":
        serve_hccl(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(f"unknown role {role!r}")
