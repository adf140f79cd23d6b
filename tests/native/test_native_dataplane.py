"""DataServer + DataLink over real sockets: exact bytes, refusals, tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

import pytest

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, DataLink, DataServer, Mapping, SharedPool

    Setup: TypeAlias = tuple[DataServer, SharedPool, SharedPool, CompletionQueue]

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

from tests.native._native_support import (  # noqa: E402
    CLUSTER,
    OTHER_CLUSTER,
    TOKEN,
    assert_no_more,
    wait_completions,
    wait_one,
)

KIB, MIB = 1 << 10, 1 << 20
REGION, RO_REGION, FOREIGN = 1, 2, 3


def fill_random(mapping: Mapping, seed: int) -> Any:
    arr = np.frombuffer(mapping, np.uint8)
    arr[:] = np.random.default_rng(seed).integers(0, 256, arr.size, np.uint8)
    return arr


def quads(rows: Any) -> Any:
    return np.array(rows, dtype=np.uint64).ravel()


@pytest.fixture
def setup(
    server: DataServer, pools: tuple[SharedPool, SharedPool], cq: CompletionQueue
) -> Iterator[Setup]:
    """Remote pool registered as: whole pool writable (REGION), its first MiB
    read-only (RO_REGION) and its last MiB owned by another cluster."""
    remote, local = pools
    server.register_region(REGION, remote, 0, remote.size, CLUSTER, writable=True)
    server.register_region(RO_REGION, remote, 0, MIB, CLUSTER)
    server.register_region(FOREIGN, remote, remote.size - MIB, MIB, OTHER_CLUSTER, writable=True)
    yield server, remote, local, cq
    for rid in (REGION, RO_REGION, FOREIGN):
        server.unregister_region(rid)


def open_link(server: DataServer, cq: CompletionQueue, streams: int) -> DataLink:
    link: DataLink = hn.DataLink("127.0.0.1", server.port, TOKEN, streams, cq, 2000)
    return link


def transfer(
    link: DataLink,
    cq: CompletionQueue,
    op: str,
    mapping: Mapping,
    rows: Any,
    timeout_ms: int = 5000,
) -> int:
    getattr(link, op)(77, mapping, quads(rows), timeout_ms)
    request_id, status = wait_one(cq)
    assert request_id == 77
    return status


def check(op: str, remote_arr: Any, local_arr: Any, rows: Any) -> None:
    for region_off, _, local_off, length in [(r[1], r[0], r[2], r[3]) for r in rows]:
        a = remote_arr[region_off : region_off + length]
        b = local_arr[local_off : local_off + length]
        assert np.array_equal(a, b), f"{op} mismatch for {(region_off, local_off, length)}"


LAYOUTS: dict[str, Callable[[], list[tuple[int, int, int, int]]]] = {
    # one large range, deliberately misaligned on both sides
    "one_large": lambda: [(REGION, 123, 4567, 6 * MIB + 11)],
    # 128 scattered 4 KiB blocks, shuffled on both sides
    "blocks_4k": lambda: [
        (REGION, int(r) * 4 * KIB, int(l) * 4 * KIB, 4 * KIB)
        for r, l in zip(
            np.random.default_rng(3).permutation(1024)[:128],
            np.random.default_rng(4).permutation(1024)[:128],
            strict=True,
        )
    ],
    # odd sizes whose byte cuts between streams fall inside ranges
    "straddling": lambda: [
        (REGION, 1, 0, 100 * KIB + 1),
        (REGION, 2 * MIB + 5, 200 * KIB, 300 * KIB - 7),
        (REGION, 3 * MIB, 600 * KIB, 77 * KIB),
        (REGION, 5 * MIB + 3, 1 * MIB, 1),
        (REGION, 6 * MIB, 2 * MIB, 0),
        (REGION, 7 * MIB + 9, 3 * MIB, 517 * KIB),
    ],
}


@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("op", ["read", "write"])
def test_byte_exact(setup: Setup, streams: int, layout: str, op: str) -> None:
    server, remote, local, cq = setup
    remote_arr, local_arr = fill_random(remote, 10), fill_random(local, 11)
    rows = LAYOUTS[layout]()
    untouched_local, untouched_remote = local_arr.copy(), remote_arr.copy()
    with open_link(server, cq, streams) as link:
        assert link.streams == streams and link.alive
        assert transfer(link, cq, op, local, rows) == hn.OK
        check(op, remote_arr, local_arr, rows)
        # bytes outside the ranges stay as they were
        moved_into = local_arr if op == "read" else remote_arr
        before = untouched_local if op == "read" else untouched_remote
        mask = np.ones(moved_into.size, bool)
        for _, region_off, local_off, length in rows:
            start = local_off if op == "read" else region_off
            mask[start : start + length] = False
        assert np.array_equal(moved_into[mask], before[mask])
        assert_no_more(cq, 0.0)


@pytest.mark.parametrize("streams", [1, 4])
def test_many_requests_in_flight(setup: Setup, streams: int) -> None:
    server, remote, local, cq = setup
    remote_arr, local_arr = fill_random(remote, 20), fill_random(local, 21)
    with open_link(server, cq, streams) as link:
        for i in range(40):
            link.read(i, local, quads([(REGION, i * 64 * KIB, i * 64 * KIB, 64 * KIB)]), 5000)
        done = dict(wait_completions(cq, 40))
        assert sorted(done) == list(range(40)) and set(done.values()) == {hn.OK}
        assert np.array_equal(local_arr[: 40 * 64 * KIB], remote_arr[: 40 * 64 * KIB])


REFUSALS = {
    "outside_region": [(RO_REGION, MIB - 10, 0, 11)],
    "offset_overflow": [(REGION, 2**64 - 1, 0, 2)],
    "other_cluster": [(FOREIGN, 0, 0, 4 * KIB)],
    "unknown_region": [(99, 0, 0, 4 * KIB)],
    "one_bad_among_good": [
        (REGION, 0, 0, 4 * KIB),
        (99, 0, 8 * KIB, 4 * KIB),
        (REGION, 8 * KIB, 16 * KIB, 4 * KIB),
    ],
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
@pytest.mark.parametrize("op", ["read", "write"])
def test_refused_moves_nothing_and_link_survives(setup: Setup, case: str, op: str) -> None:
    server, remote, local, cq = setup
    remote_arr, local_arr = fill_random(remote, 30), fill_random(local, 31)
    remote_before, local_before = remote_arr.copy(), local_arr.copy()
    with open_link(server, cq, 2) as link:
        assert transfer(link, cq, op, local, REFUSALS[case]) == hn.E_REFUSED
        assert np.array_equal(remote_arr, remote_before)
        assert np.array_equal(local_arr, local_before)
        assert link.alive
        good = [(REGION, 0, 0, 64 * KIB)]
        assert transfer(link, cq, op, local, good) == hn.OK
        check(op, remote_arr, local_arr, good)


def test_write_into_read_only_region_is_refused(setup: Setup) -> None:
    server, remote, local, cq = setup
    remote_arr, _ = fill_random(remote, 40), fill_random(local, 41)
    before = remote_arr.copy()
    with open_link(server, cq, 4) as link:
        assert transfer(link, cq, "write", local, [(RO_REGION, 0, 0, 512 * KIB)]) == hn.E_REFUSED
        assert np.array_equal(remote_arr, before)
        assert transfer(link, cq, "read", local, [(RO_REGION, 0, 0, 512 * KIB)]) == hn.OK


def test_local_bounds_checked_at_submit(setup: Setup) -> None:
    server, _, local, cq = setup
    with open_link(server, cq, 1) as link:
        with pytest.raises(ValueError, match="range 1"):
            link.read(1, local, quads([(REGION, 0, 0, 10), (REGION, 0, local.size - 5, 6)]), 1000)
        with pytest.raises(ValueError):
            link.write(1, local, quads([(REGION, 0, 2**64 - 1, 2)]), 1000)
        with pytest.raises(ValueError, match="4-tuples"):
            link.read(1, local, np.zeros(3, np.uint64), 1000)
        with pytest.raises(ValueError):
            link.read(1, local, quads([(REGION, 0, 0, 10)]), 0)
        with pytest.raises(ValueError):
            link.read(-1, local, quads([(REGION, 0, 0, 10)]), 1000)
        assert_no_more(cq)


def test_empty_request_completes_ok(setup: Setup) -> None:
    server, _, local, cq = setup
    with open_link(server, cq, 2) as link:
        assert transfer(link, cq, "read", local, np.zeros((0, 4), np.uint64)) == hn.OK
        assert transfer(link, cq, "read", local, [(REGION, 0, 0, 0)]) == hn.OK


def test_unknown_token_is_refused_at_connect(server: DataServer, cq: CompletionQueue) -> None:
    with pytest.raises(hn.NativeError) as info:
        hn.DataLink("127.0.0.1", server.port, TOKEN + 1, 2, cq, 2000)
    assert info.value.code == hn.E_REFUSED
    assert "E_REFUSED" in str(info.value)


def test_connect_to_nobody_fails_with_errno(cq: CompletionQueue) -> None:
    srv = hn.DataServer("127.0.0.1", 0)
    port = srv.port
    srv.close()
    with pytest.raises(hn.NativeError) as info:
        hn.DataLink("127.0.0.1", port, TOKEN, 1, cq, 2000)
    assert info.value.code == hn.E_IO and "ECONNREFUSED" in str(info.value)


def test_token_bound_to_one_cluster(server: DataServer) -> None:
    server.authorize(TOKEN, CLUSTER)  # same binding: no-op
    with pytest.raises(ValueError):
        server.authorize(TOKEN, OTHER_CLUSTER)
    with pytest.raises(ValueError):
        server.authorize(-1, CLUSTER)


def test_region_registration_rules(
    server: DataServer, pools: tuple[SharedPool, SharedPool]
) -> None:
    remote, _ = pools
    server.register_region(5, remote, 0, 4096, CLUSTER)
    with pytest.raises(ValueError, match="already registered"):
        server.register_region(5, remote, 0, 4096, CLUSTER)
    with pytest.raises(ValueError):
        server.register_region(6, remote, remote.size - 10, 11, CLUSTER)
    with pytest.raises(ValueError):
        server.register_region(6, remote, 0, 0, CLUSTER)
    # a registered region pins the mapping
    with pytest.raises(BufferError):
        remote.close()
    server.unregister_region(5)
    server.unregister_region(5)  # unknown id: no-op
    assert remote.exports == 0


def test_revoke_shuts_the_links_connections(setup: Setup) -> None:
    server, _, local, cq = setup
    with open_link(server, cq, 2) as link:
        assert transfer(link, cq, "read", local, [(REGION, 0, 0, 4 * KIB)]) == hn.OK
        server.revoke(TOKEN)
        status = transfer(link, cq, "read", local, [(REGION, 0, 0, 256 * KIB)])
        assert status in (hn.E_CLOSED, hn.E_REFUSED)
        assert not link.alive


def test_server_close_releases_regions_and_is_idempotent(
    pools: tuple[SharedPool, SharedPool],
) -> None:
    remote, _ = pools
    srv = hn.DataServer("127.0.0.1", 0)
    srv.register_region(1, remote, 0, remote.size, CLUSTER)
    assert remote.exports == 1
    srv.close()
    srv.close()
    assert remote.exports == 0
    with pytest.raises(hn.NativeError) as info:
        srv.register_region(1, remote, 0, 10, CLUSTER)
    assert info.value.code == hn.E_CLOSED


def test_link_close_is_idempotent_and_submit_after_close_raises(setup: Setup) -> None:
    server, _, local, cq = setup
    link = open_link(server, cq, 2)
    link.close()
    link.close()
    assert not link.alive
    with pytest.raises(hn.NativeError) as info:
        link.read(1, local, quads([(REGION, 0, 0, 10)]), 1000)
    assert info.value.code == hn.E_CLOSED


def test_completion_releases_local_pin(setup: Setup) -> None:
    server, _, local, cq = setup
    with open_link(server, cq, 1) as link:
        link.read(9, local, quads([(REGION, 0, 0, 4 * MIB)]), 5000)
        assert wait_one(cq) == (9, hn.OK)
        assert local.exports == 0
        local.close()  # nothing pins it any more


def test_status_names() -> None:
    assert hn.status_name(hn.OK) == "OK"
    assert hn.status_name(hn.E_TIMEOUT) == "E_TIMEOUT"
    assert hn.status_name(12345).startswith("E_UNKNOWN")
    codes = [hn.E_TIMEOUT, hn.E_CLOSED, hn.E_REFUSED, hn.E_IO, hn.E_PROTO, hn.E_CANCELLED]
    assert len(set(codes)) == 6 and hn.OK not in codes
