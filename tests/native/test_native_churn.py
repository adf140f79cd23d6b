"""Links opened, used and closed while requests are in flight on the shared
threads: every request ends exactly once, with a status, and nothing is left
behind (the autouse leak check). Bounded in count and time."""

from __future__ import annotations

import random
import threading
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from hixl_native import CompletionQueue, DataServer, SharedPool

hn = pytest.importorskip("hixl_native")
np = pytest.importorskip("numpy")

from tests.native._native_support import CLUSTER, TOKEN, wait_completions  # noqa: E402

REGION = 9
ROUNDS = 100
LINKS = 6
PER_LINK = 12
ENDINGS = {hn.OK, hn.E_CANCELLED, hn.E_CLOSED, hn.E_TIMEOUT, hn.E_REFUSED}


def quads(rows: Any) -> Any:
    return np.array(rows, dtype=np.uint64).ravel()


def test_links_closed_and_revoked_under_load(
    server: DataServer, pools: tuple[SharedPool, SharedPool], cq: CompletionQueue
) -> None:
    remote, local = pools
    server.register_region(REGION, remote, 0, remote.size, CLUSTER, writable=True)
    rng = random.Random(7)
    expected = 0
    try:
        for rnd in range(ROUNDS):
            token = TOKEN + 1 + rnd
            server.authorize(token, CLUSTER)
            links = [hn.DataLink("127.0.0.1", server.port, token, rng.choice((1, 2, 4)), cq,
                                 2000) for _ in range(LINKS)]
            submitted = 0
            for i, link in enumerate(links):
                for k in range(PER_LINK):
                    size = rng.choice((4096, 65536, 1 << 20))
                    offset = rng.randrange(0, remote.size - size, 4096)
                    rows = quads([(REGION, offset, offset, size)])
                    tag = (rnd << 32) | (i << 16) | k
                    if k % 3 == 0:
                        link.write(tag, local, rows, 2000)
                    elif k % 3 == 1:
                        link.read(tag, local, rows, 2000)
                    elif link.read_from(tag, local, REGION, np.array([offset, offset, size],
                                                                     np.uint64),
                                        2000, wait_us=50) is not None:
                        continue  # ended here: nothing posted
                    submitted += 1
            # End them every way at once, while pieces move: a close from
            # another thread, the token revoked, and closes here.
            closer = threading.Thread(target=links[0].close)
            closer.start()
            if rnd % 2:
                server.revoke(token)
            for link in rng.sample(links, len(links)):
                link.close()
            closer.join(10)
            assert not closer.is_alive()
            done = wait_completions(cq, submitted, 30)
            assert len({tag for tag, _ in done}) == submitted  # once each
            assert {status for _, status in done} <= ENDINGS, done
            expected += submitted
            for link in links:
                link.close()  # idempotent
            server.revoke(token)
        assert cq.drain() == []
        assert expected > 0
    finally:
        server.unregister_region(REGION)
