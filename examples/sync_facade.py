"""Port LLM-DataDist code by changing its import: the blocking facade, hixl_client.sync.

    from llm_datadist import CacheDesc, CacheKey, LLMDataDist, ...    # before
    from hixl_client.sync import CacheDesc, CacheKey, LLMDataDist, ...  # after

The rest of the code stays as written for LLM-DataDist: blocking calls, its
signatures, exceptions and status codes. As in LLM-DataDist one initialized
LLMDataDist is allowed per process, so this script starts two daemons and
runs itself twice more: ``sync_facade.py prefill`` holds a batch of keyed
caches, ``sync_facade.py decode`` pulls them from several threads at once
(the facade is thread-safe) and checks every byte.

    python examples/sync_facade.py [--requests 4] [--layers 4] [--tokens 128]
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from _common import (
    DECODE_CLUSTER,
    PROMPT_CLUSTER,
    add_head_args,
    engine_options,
    example_parser,
    link_info,
    run_two_processes,
)

from hixl_client.sync import (
    CacheDesc,
    CacheKey,
    DataType,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    set_daemon,
)


def kv_desc(args: argparse.Namespace) -> CacheDesc:
    return CacheDesc(2 * args.layers, [1, args.tokens, args.kv_heads, args.head_dim],
                     DataType.DT_FLOAT16)


def pool_size(args: argparse.Namespace) -> int:
    desc = kv_desc(args)
    return int(args.requests) * desc.size * desc.num_tensors + (8 << 20)


def computed_kv(req_id: int, tensor: int, nbytes: int) -> bytes:
    """What "prefill" computes for a request; the decoder recomputes it to check."""
    return np.random.default_rng([req_id, tensor]).bytes(nbytes)


def prefill(args: argparse.Namespace) -> None:
    set_daemon(args.daemon)  # instead of $HIXL_DAEMON or the default socket
    dd = LLMDataDist(LLMRole.PROMPT, PROMPT_CLUSTER)
    dd.init(engine_options(pool_size(args)))
    desc = kv_desc(args)
    for req_id in range(args.requests):
        cache = dd.cache_manager.allocate_cache(desc, [CacheKey(PROMPT_CLUSTER, req_id=req_id)])
        for i in range(desc.num_tensors):
            cache.tensor_view(i)[:] = computed_kv(req_id, i, desc.size)
        dd.cache_manager.deallocate_cache(cache)  # the key holds it until it is pulled
    print("ready", flush=True)
    sys.stdin.readline()  # until the parent says the decoder is done
    dd.finalize()  # an atexit hook would finalize it too, as in LLM-DataDist


def decode(args: argparse.Namespace) -> None:
    dd = LLMDataDist(LLMRole.DECODER, DECODE_CLUSTER)  # daemon from $HIXL_DAEMON
    dd.init(engine_options(pool_size(args)))
    info = link_info(PROMPT_CLUSTER, args.peer)
    status, per_cluster = dd.link_clusters([info], timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS, per_cluster
    desc = kv_desc(args)

    def pull_and_check(req_id: int) -> None:
        cache = dd.cache_manager.allocate_cache(desc)
        dd.cache_manager.pull_cache(CacheKey(PROMPT_CLUSTER, req_id=req_id), cache)
        for i in range(desc.num_tensors):
            if bytes(cache.tensor_view(i)) != computed_kv(req_id, i, desc.size):
                raise SystemExit(f"request {req_id} tensor {i} differs after the pull")
        dd.cache_manager.deallocate_cache(cache)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(pull_and_check, range(args.requests)))
    try:  # the same exceptions and status codes as LLM-DataDist's
        pull_and_check(0)
        raise SystemExit("a pulled key could be pulled again")
    except LLMException as err:
        assert err.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST, err
    dd.unlink_clusters([info], timeout=5000)
    dd.finalize()
    total = args.requests * desc.size * desc.num_tensors
    print(f"verified {args.requests} requests x {desc.num_tensors} tensors, "
          f"{total / 2**20:.1f} MiB, byte-exact in the decode process", flush=True)


def run_both(args: argparse.Namespace) -> None:
    sizes = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in
             ("requests", "layers", "tokens", "kv_heads", "head_dim")]
    def decode_args(_: str, prefill_peer: str) -> list[str]:
        return ["decode", f"--peer={prefill_peer}", *sizes]

    run_two_processes(os.path.abspath(__file__), ["prefill", *sizes], decode_args,
                      budget=pool_size(args) + (8 << 20))
    print("two facade processes (prefill, decode) over two daemons: tcp pulls, "
          "both finalized cleanly")


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("role", nargs="?", choices=["both", "prefill", "decode"],
                        default="both", help="run both roles (default) or one of them")
    parser.add_argument("--requests", type=int, default=4, help="keyed requests to pull")
    parser.add_argument("--layers", type=int, default=4, help="model layers (K and V each)")
    parser.add_argument("--tokens", type=int, default=128, help="prompt length")
    add_head_args(parser, kv_heads=8)
    parser.add_argument("--daemon", help="prefill role: the daemon's client target")
    parser.add_argument("--peer", help="decode role: the prefill daemon's peer address")
    args = parser.parse_args()
    {"both": run_both, "prefill": prefill, "decode": decode}[args.role](args)


if __name__ == "__main__":
    main()
