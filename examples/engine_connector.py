"""The call sequence of an inference engine's KV connector, unchanged, on hixl.

What vLLM-Ascend's LLM-DataDist and HIXL connectors and MindIE's separate
deployment do, through the blocking facade (``hixl_client.sync``), in two
processes of their own (one initialized LLMDataDist per process):

* both sides set the connectors' options: ``device_id``, ``local_comm_res =
  ""``, ``transfer_backend = "hixl"``, ``listen_ip_info = "ip:port"``,
  ``link_total_time``, ``link_retry_count``, ``sync_kv_timeout``, raw
  ``ge_options``; cluster ids are the ip and port packed into one integer;
* the prompt side registers the KV tensors its engine allocated itself
  (numpy arrays here, standing in for torch tensors) with
  ``register_blocks_cache(desc, addrs, BlocksCacheKey(cluster_id, model_id))``;
* the decode side registers its own tensors with no key, learns the prompt
  side's ``listen_ip_info`` out of band (here: a line on a pipe) and links
  to it with ``link_clusters``;
* per request it pulls a prompt with ``pull_blocks(BlocksCacheKey(prompt,
  model_id), dst, src_blocks, dst_blocks, src_layer_range=...,
  dst_layer_range=...)`` over fragmented block tables, and checks the bytes;
* it ends with a forced unlink and finalize.

    python examples/engine_connector.py [--requests 8] [--layers 8] [--num-blocks 64]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import random
import socket
import sys

import numpy as np
from _common import example_parser, run_two_processes

from hixl_client.sync import (
    BlocksCacheKey,
    CacheDesc,
    DataType,
    LLMClusterInfo,
    LLMConfig,
    LLMDataDist,
    LLMRole,
    LLMStatusCode,
    set_daemon,
)

MODEL_ID = 0
BLOCK_TOKENS, KV_HEADS, HEAD_DIM = 16, 8, 128


def cluster_id_of(listen_ip_info: str) -> int:
    """How connectors name a cluster: its listen ip and port in one integer."""
    host, port = listen_ip_info.rsplit(":", 1)
    return (int(ipaddress.IPv4Address(host)) << 16) | int(port)


def connector_options(listen_ip_info: str, sync_kv_timeout: int = 10000) -> dict[str, str]:
    config = LLMConfig()
    config.device_id = 0
    config.local_comm_res = ""
    config.transfer_backend = "hixl"
    config.listen_ip_info = listen_ip_info
    config.link_total_time = 20
    config.link_retry_count = 3
    config.sync_kv_timeout = sync_kv_timeout
    config.ge_options = {"ge.flowGraphMemMaxSize": "2147483648"}
    return config.generate_options()


def engine_kv(args: argparse.Namespace) -> tuple[CacheDesc, list[np.ndarray]]:
    """The engine's own paged KV cache: one K and one V tensor per layer."""
    desc = CacheDesc(2 * args.layers, [args.num_blocks, BLOCK_TOKENS, KV_HEADS, HEAD_DIM],
                     DataType.DT_FLOAT16)
    return desc, [np.zeros(desc.shape, dtype=np.float16) for _ in range(desc.num_tensors)]


def computed_block(tensor: int, block: int) -> np.ndarray:
    """What "prefill" computed into one block; the decode side recomputes it to check."""
    rng = np.random.default_rng([tensor, block])
    return rng.standard_normal((BLOCK_TOKENS, KV_HEADS, HEAD_DIM)).astype(np.float16)


def prompt(args: argparse.Namespace) -> None:
    set_daemon(args.daemon)
    me = cluster_id_of(args.listen)
    dd = LLMDataDist(LLMRole.PROMPT, me)
    dd.init(connector_options(args.listen))
    desc, tensors = engine_kv(args)
    for tensor, array in enumerate(tensors):
        for block in range(args.num_blocks):
            array[block] = computed_block(tensor, block)
    dd.cache_manager.register_blocks_cache(desc, [t.ctypes.data for t in tensors],
                                           BlocksCacheKey(me, MODEL_ID))
    print("listening", args.listen, flush=True)  # the "out of band" exchange
    sys.stdin.readline()  # until the decode side is done
    dd.finalize()


def decode(args: argparse.Namespace) -> None:
    me = cluster_id_of(args.listen)
    dd = LLMDataDist(LLMRole.DECODER, me)  # daemon from $HIXL_DAEMON
    dd.init(connector_options(args.listen))
    desc, tensors = engine_kv(args)
    dst = dd.cache_manager.register_blocks_cache(desc, [t.ctypes.data for t in tensors])
    remote = cluster_id_of(args.remote)
    info = LLMClusterInfo()
    info.remote_cluster_id = remote
    host, port = args.listen.rsplit(":", 1)
    info.append_local_ip_info(host, int(port))
    host, port = args.remote.rsplit(":", 1)
    info.append_remote_ip_info(host, int(port))
    status, per_cluster = dd.link_clusters([info], timeout=5000)
    assert status == LLMStatusCode.LLM_SUCCESS, per_cluster

    rng = random.Random(7)
    moved = 0
    for request in range(args.requests):
        # A long-running cache hands out whatever blocks are free.
        count = rng.randrange(1, args.num_blocks // 2)
        src_blocks = rng.sample(range(args.num_blocks), count)
        dst_blocks = rng.sample(range(args.num_blocks), count)
        first = rng.randrange(0, args.layers)
        layers = range(first, args.layers) if request % 2 else range(args.layers)
        dd.cache_manager.pull_blocks(BlocksCacheKey(remote, MODEL_ID), dst, src_blocks,
                                     dst_blocks, src_layer_range=layers,
                                     dst_layer_range=layers)
        for tensor in range(2 * layers.start, 2 * layers.stop):
            for s, d in zip(src_blocks, dst_blocks, strict=True):
                if not np.array_equal(tensors[tensor][d], computed_block(tensor, s)):
                    raise SystemExit(f"request {request}: tensor {tensor} block {s} -> {d} "
                                     "differs after the pull")
        moved += count * 2 * len(layers) * tensors[0][0].nbytes
    status, per_cluster = dd.unlink_clusters([info], timeout=5000, force=True)
    assert status == LLMStatusCode.LLM_SUCCESS, per_cluster
    dd.finalize()
    print(f"verified {args.requests} pull_blocks requests by BlocksCacheKey, "
          f"{moved / 2**20:.1f} MiB into engine-allocated memory, byte-exact", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_both(args: argparse.Namespace) -> None:
    sizes = [f"--requests={args.requests}", f"--layers={args.layers}",
             f"--num-blocks={args.num_blocks}"]
    prompt_listen, decode_listen = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"

    def decode_args(ready: str, _: str) -> list[str]:  # "listening <its listen_ip_info>"
        return ["decode", f"--listen={decode_listen}", f"--remote={ready.split()[-1]}", *sizes]

    run_two_processes(os.path.abspath(__file__), ["prompt", f"--listen={prompt_listen}", *sizes],
                      decode_args)
    print("two connector processes (prompt, decode), linked by listen_ip_info, "
          "both finalized cleanly")


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("role", nargs="?", choices=["both", "prompt", "decode"],
                        default="both", help="run both roles (default) or one of them")
    parser.add_argument("--requests", type=int, default=8, help="pull_blocks requests")
    parser.add_argument("--layers", type=int, default=8, help="model layers (K and V each)")
    parser.add_argument("--num-blocks", type=int, default=64, help="blocks per tensor")
    parser.add_argument("--daemon", help="prompt role: its daemon's client target")
    parser.add_argument("--listen", help="prompt and decode roles: own listen_ip_info")
    parser.add_argument("--remote", help="decode role: the prompt side's listen_ip_info")
    args = parser.parse_args()
    {"both": run_both, "prompt": prompt, "decode": decode}[args.role](args)


if __name__ == "__main__":
    main()
