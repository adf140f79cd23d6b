"""hixl_native.Ring: frames between processes through a sealed memfd.

Real shared memory, real pipes, a real second process: the far side runs in
a child Python that attaches the descriptors this process made, as a client
attaches the ones its daemon sends. A hostile far side is played by writing
garbage straight into the shared pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import mmap
import os
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest

native = pytest.importorskip("hixl_native")
Ring = native.Ring

CAPACITY = 1 << 16
# The shared header (csrc/ring.h): three cache lines, then the data.
TAIL_AT, HEAD_AT, DATA_AT = 64, 128, 192


@pytest.fixture
def pair() -> Iterator[tuple[Ring, Ring]]:
    producer, far = Ring.create(CAPACITY, True)
    consumer = Ring.attach(*far, False)
    yield producer, consumer
    producer.close()
    consumer.close()


def frame(i: int) -> bytes:
    """A frame that says which it is and carries a length that varies."""
    body = bytes([i % 251]) * (i * 37 % 3000)
    return struct.pack("<I", i) + body


def test_frames_come_out_in_order_across_many_wraps(pair: tuple[Ring, Ring]) -> None:
    producer, consumer = pair
    sent = received = 0
    total = 5000  # about 7 MiB through a 64 KiB ring: it wraps about a hundred times
    while received < total:
        while sent < total and producer.write(frame(sent)):
            sent += 1
        got = consumer.read()
        assert got == frame(received)
        received += 1
    assert consumer.read() is None


def test_a_full_ring_refuses_until_the_consumer_reads(pair: tuple[Ring, Ring]) -> None:
    producer, consumer = pair
    big = b"x" * producer.max_frame
    writes = 0
    while producer.write(big):
        writes += 1
    assert writes >= 3
    assert not producer.wait(0.01, nbytes=len(big))  # bounded: gives up, no hang
    assert consumer.read() == big
    assert producer.wait(1.0, nbytes=len(big))
    assert producer.write(big)


def test_misuse_is_refused(pair: tuple[Ring, Ring]) -> None:
    producer, consumer = pair
    with pytest.raises(ValueError):
        producer.write(b"x" * (producer.max_frame + 1))
    with pytest.raises(ValueError):
        consumer.write(b"x")
    with pytest.raises(ValueError):
        producer.read()
    with pytest.raises(ValueError):
        Ring.create(3000, True)  # not a power of two
    producer.close()
    producer.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        producer.write(b"x")


def test_a_sleeping_consumer_is_woken_by_another_thread(pair: tuple[Ring, Ring]) -> None:
    producer, consumer = pair
    got: list[bytes | None] = []

    def consume() -> None:
        for _ in range(200):
            assert consumer.wait(10.0)  # no spin: sleeps every time
            got.append(consumer.read())

    thread = threading.Thread(target=consume)
    thread.start()
    for i in range(200):
        while not producer.write(frame(i)):
            assert producer.wait(10.0, nbytes=len(frame(i)))
    thread.join(30)
    assert not thread.is_alive()
    assert got == [frame(i) for i in range(200)]


def test_a_stop_fd_cancels_a_wait(pair: tuple[Ring, Ring]) -> None:
    _, consumer = pair
    stop_read, stop_write = os.pipe()
    try:
        os.write(stop_write, b"!")
        with pytest.raises(native.NativeError) as caught:
            consumer.wait(10.0, stop_fd=stop_read)
        assert caught.value.code == native.E_CANCELLED
    finally:
        os.close(stop_read)
        os.close(stop_write)


def test_an_event_loop_waits_on_wait_fd(pair: tuple[Ring, Ring]) -> None:
    producer, consumer = pair

    async def main() -> list[bytes]:
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        feeder = threading.Thread(target=lambda: [producer.write(frame(i)) for i in range(50)])
        while len(got) < 50:
            if consumer.arm():
                ready = loop.create_future()
                loop.add_reader(consumer.wait_fd, ready.set_result, None)
                if not feeder.is_alive() and feeder.ident is None:
                    feeder.start()
                try:
                    await asyncio.wait_for(ready, 10)
                finally:
                    loop.remove_reader(consumer.wait_fd)
                    consumer.disarm()
            while (one := consumer.read()) is not None:
                got.append(one)
        feeder.join(10)
        return got

    assert asyncio.run(main()) == [frame(i) for i in range(50)]


CHILD = textwrap.dedent("""
    import hashlib, struct, sys
    import hixl_native
    memfd, wait_fd, wake_fd, role, count = map(int, sys.argv[1:])
    ring = hixl_native.Ring.attach(memfd, wait_fd, wake_fd, role == 1)
    if role == 1:  # produce: frame i carries i and the digest of its body
        for i in range(count):
            body = bytes([i % 251]) * (i * 37 % 3000)
            one = struct.pack("<I", i) + hashlib.sha256(body).digest() + body
            while not ring.write(one):
                assert ring.wait(30.0, nbytes=len(one))
    else:  # consume and check, then say how many
        for i in range(count):
            assert ring.wait(30.0, spin_us=20)
            one = ring.read()
            assert struct.unpack_from("<I", one)[0] == i
            assert hashlib.sha256(one[36:]).digest() == one[4:36]
        print(count)
    ring.close()
""")


def child(far: tuple[int, int, int], producer: bool, count: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, *map(str, far), "1" if producer else "0", str(count)],
        pass_fds=far, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for fd in far:
        os.close(fd)  # the child has its own copies now
    return process


@pytest.mark.parametrize("spin_us", [0.0, 50.0])
def test_frames_cross_processes_intact(spin_us: float) -> None:
    count = 3000
    consumer, far = Ring.create(CAPACITY, False)
    try:
        process = child(far, producer=True, count=count)
        for i in range(count):
            assert consumer.wait(30.0, spin_us=spin_us)
            one = consumer.read()
            assert one is not None
            assert struct.unpack_from("<I", one)[0] == i
            assert hashlib.sha256(one[36:]).digest() == one[4:36]
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert consumer.read() is None
    finally:
        consumer.close()


def test_a_far_consumer_process_reads_what_this_one_writes() -> None:
    count = 3000
    producer, far = Ring.create(CAPACITY, True)
    try:
        process = child(far, producer=False, count=count)
        for i in range(count):
            body = bytes([i % 251]) * (i * 37 % 3000)
            one = struct.pack("<I", i) + hashlib.sha256(body).digest() + body
            while not producer.write(one):
                assert producer.wait(30.0, nbytes=len(one))
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert out.strip() == str(count)
    finally:
        producer.close()


@contextlib.contextmanager
def hostile(producer: bool) -> Iterator[tuple[Ring, mmap.mmap]]:
    """This process's side of a fresh ring, and its pages as a hostile far
    process sees them (it writes there what it likes)."""
    ring, far = Ring.create(CAPACITY, producer)
    pages = mmap.mmap(far[0], DATA_AT + CAPACITY)
    try:
        yield ring, pages
    finally:
        pages.close()
        for fd in far:
            os.close(fd)
        ring.close()


@pytest.mark.parametrize("garbage", [
    {TAIL_AT: struct.pack("<Q", CAPACITY + 8)},          # more published than fits
    {TAIL_AT: struct.pack("<Q", 12)},                    # a tail astride a frame
    {TAIL_AT: struct.pack("<Q", 16), DATA_AT: struct.pack("<I", 1 << 30)},  # a huge length
    {TAIL_AT: struct.pack("<Q", 16), DATA_AT: struct.pack("<I", 100)},      # past the tail
    {TAIL_AT: struct.pack("<Q", 16), DATA_AT: struct.pack("<I", 0xFFFFFFFF)},  # a pad too soon
])
def test_a_corrupt_ring_is_refused_not_followed(garbage: dict[int, bytes]) -> None:
    with hostile(producer=False) as (consumer, pages):
        for at, value in garbage.items():
            pages[at:at + len(value)] = value
        for _ in range(2):  # and stays refused: nothing was taken from it
            with pytest.raises(native.NativeError) as caught:
                consumer.read()
            assert caught.value.code == native.E_PROTO


def test_a_producer_refuses_a_head_the_consumer_could_not_have_written() -> None:
    with hostile(producer=True) as (producer, pages):
        assert producer.write(b"one")
        pages[HEAD_AT:HEAD_AT + 8] = struct.pack("<Q", 1 << 40)  # past the tail
        with pytest.raises(native.NativeError) as caught:
            producer.write(b"two")
        assert caught.value.code == native.E_PROTO


def test_memory_that_could_shrink_is_not_mapped() -> None:
    memfd = os.memfd_create("not-a-ring")
    os.ftruncate(memfd, DATA_AT + CAPACITY)
    wait_fd, wake_fd = os.pipe()
    with pytest.raises(native.NativeError) as caught:
        Ring.attach(memfd, wait_fd, wake_fd, False)
    assert caught.value.code == native.E_PROTO
    for fd in (memfd, wait_fd, wake_fd):  # attach closed them
        with pytest.raises(OSError):
            os.fstat(fd)


def test_close_gives_every_descriptor_back() -> None:
    before = len(os.listdir("/proc/self/fd"))
    producer, far = Ring.create(CAPACITY, True)
    consumer = Ring.attach(*far, False)
    producer.close()
    consumer.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_waiting_side_sees_a_corrupt_position() -> None:
    with hostile(producer=False) as (consumer, pages):
        pages[TAIL_AT:TAIL_AT + 8] = struct.pack("<Q", CAPACITY + 8)
        with pytest.raises(native.NativeError) as caught:
            consumer.wait(10.0, spin_us=10)
        assert caught.value.code == native.E_PROTO
        with pytest.raises(native.NativeError):
            consumer.arm()


def test_closing_from_another_thread_ends_a_wait_then_unmaps(pair: tuple[Ring, Ring]) -> None:
    _, consumer = pair
    ended: list[int] = []

    def wait() -> None:
        try:
            consumer.wait(30.0)  # no frame will come
        except native.NativeError as exc:
            ended.append(exc.code)

    thread = threading.Thread(target=wait)
    thread.start()
    while thread.is_alive() and not ended:
        consumer.close()  # ends the wait (and keeps the mapping until it returned)
        thread.join(0.05)
    thread.join(30)
    assert ended == [native.E_CLOSED]
    with pytest.raises(ValueError, match="closed"):
        consumer.read()
