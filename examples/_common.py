"""Plumbing shared by the examples; not an example itself.

Every example runs a prefill and a decode cluster on two local daemons, builds
the same engine options, links one cluster to the other and compares raw bytes.
That setup lives here so that each example shows only the LLM-DataDist calls
it is about. The examples are scripts (``python examples/X.py``), and Python
puts a script's own folder on ``sys.path`` whatever the working directory, so
they import this module as ``from _common import ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from hixl_client import Cache, LLMClusterInfo, LLMConfig

if TYPE_CHECKING:
    from hixl_service.testing import DaemonProcess

__all__ = [
    "DECODE_CLUSTER",
    "PROMPT_CLUSTER",
    "add_head_args",
    "blocks",
    "engine_options",
    "example_parser",
    "fill_random",
    "link_info",
    "run_two_processes",
    "slot_bytes",
    "two_daemons",
]

# The cluster ids of the two sides; keys name the cluster that holds a cache.
PROMPT_CLUSTER, DECODE_CLUSTER = 1, 2


def engine_options(pool_bytes: int, *, remote_cache_accessible: bool = False,
                   host_pool_bytes: int = 0, page_shift: int | None = None,
                   sync_kv_timeout: int = 10000,
                   device_id: int | None = None) -> dict[str, str]:
    """The options that ``LLMDataDist.init`` takes, built with ``LLMConfig``.

    Args:
        pool_bytes: size of the cluster's (DEVICE) memory pool.
        remote_cache_accessible: let linked peers write into this cluster's
            caches (push mode); keys then address caches by id.
        host_pool_bytes: size of a HOST pool as well (``swap_blocks``); 0: none.
        page_shift: the pool's page size as a power of two; ``None``: the default.
        sync_kv_timeout: milliseconds that bound every transfer.
        device_id: the device the cluster runs on; ``None``: left unset.

    Returns:
        The engine options, a ``str -> str`` dict.
    """
    config = LLMConfig()
    if device_id is not None:
        config.device_id = device_id
    config.enable_cache_manager = True
    if remote_cache_accessible:
        config.enable_remote_cache_accessible = True
    pool: dict[str, int] = {"memory_size": pool_bytes}
    if page_shift is not None:
        pool["page_shift"] = page_shift
    config.mem_pool_cfg = json.dumps(pool)
    if host_pool_bytes:
        config.host_mem_pool_cfg = json.dumps({"memory_size": host_pool_bytes})
    config.sync_kv_timeout = sync_kv_timeout
    return config.generate_options()


def link_info(remote_cluster_id: int, peer_address: str) -> LLMClusterInfo:
    """What ``link_clusters``/``unlink_clusters`` take to reach a remote cluster.

    Args:
        remote_cluster_id: the cluster to link to.
        peer_address: ``host:port`` of the daemon that holds that cluster.

    Returns:
        The cluster info, local side on the loopback (the daemons are local).
    """
    host, port = peer_address.rsplit(":", 1)
    info = LLMClusterInfo()
    info.remote_cluster_id = remote_cluster_id
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(host, int(port))
    return info


@contextlib.asynccontextmanager
async def two_daemons(
    budget: int | None = None, decode_budget: int | None = None,
) -> AsyncIterator[tuple[DaemonProcess, DaemonProcess]]:
    """Run a prefill daemon and a decode daemon for an ``async with`` block.

    Both listen on ephemeral ports with private sockets, so an example never
    collides with a daemon that is already running.

    Args:
        budget: each daemon's pool budget in bytes (``pool.max_bytes``);
            ``None`` keeps the embedded default.
        decode_budget: the decode daemon's budget, if it differs from ``budget``.

    Yields:
        ``(prefill_daemon, decode_daemon)``, both ready; stopped on exit.
    """
    # Imported here, not at the top: sync_facade.py's prefill and decode
    # processes use this module too and, like a ported application, need only
    # hixl_client; its launcher starts daemons by itself.
    from hixl_service.testing import start_daemon

    def limits(max_bytes: int | None) -> dict[str, Any]:
        return {} if max_bytes is None else {"pool__max_bytes": max_bytes}

    decode_limits = limits(budget if decode_budget is None else decode_budget)
    async with start_daemon(**limits(budget)) as prefill_daemon, \
            start_daemon(**decode_limits) as decode_daemon:
        yield prefill_daemon, decode_daemon


def run_two_processes(script: str, first: list[str], second: Callable[[str, str], list[str]],
                      budget: int | None = None) -> None:
    """Run ``script`` as two LLM-DataDist processes on two daemons of their own.

    The first (``script first...``, given ``--daemon=<target>``) prints one
    line once its cluster is ready, and holds it until the second has ended;
    the second (``script *second(that line, the first daemon's peer
    address)``) finds its daemon in ``$HIXL_DAEMON``, as a ported application
    would.

    Raises:
        SystemExit: either process failed.
    """
    from hixl_service.testing import DaemonProcess  # only the launcher starts daemons

    me = [sys.executable, script]
    limits: dict[str, Any] = {} if budget is None else {"pool__max_bytes": budget}
    with DaemonProcess(**limits) as first_daemon, DaemonProcess(**limits) as second_daemon, \
            subprocess.Popen([*me, *first, f"--daemon={first_daemon.client_target}"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True) as first_side:
        assert first_side.stdin is not None and first_side.stdout is not None
        ready = first_side.stdout.readline().strip()
        if not ready:
            raise SystemExit(f"the {first[0]} process failed")
        env = {**os.environ, "HIXL_DAEMON": second_daemon.client_target}
        second_side = subprocess.run([*me, *second(ready, first_daemon.peer_address)], env=env,
                                     check=False, timeout=120)
        first_side.stdin.write("done\n")
        first_side.stdin.flush()
        if first_side.wait(timeout=30) or second_side.returncode:
            raise SystemExit(f"{first[0]} exited {first_side.returncode}, "
                             f"the other process {second_side.returncode}")


def fill_random(cache: Cache, rng: np.random.Generator,
                dtype: type[np.unsignedinteger[Any]] = np.uint8,
                tensors: Iterable[int] | None = None) -> None:
    """Write random values into tensors of ``cache``, as a model's prefill would.

    Writes go through ``tensor_view``, straight into the pool's memory.
    Unsigned integers over their whole range stand in for fp16 K/V bits: any
    bit pattern is fine because the examples compare bytes, never values.

    Args:
        cache: the cache to fill.
        rng: the generator; the examples seed theirs, so runs repeat.
        dtype: the unsigned type drawn, one value at a time.
        tensors: the tensor indices to fill; ``None``: every tensor.
    """
    high = int(np.iinfo(dtype).max) + 1
    for i in range(cache.cache_desc.num_tensors) if tensors is None else tensors:
        view = np.frombuffer(cache.tensor_view(i), dtype=dtype)
        view[:] = rng.integers(0, high, view.size, dtype=dtype)


def blocks(cache: Cache, tensor: int) -> np.ndarray:
    """Tensor ``tensor`` as raw bytes, one row per block (or per batch slot)."""
    return np.frombuffer(cache.tensor_view(tensor), np.uint8).reshape(
        cache.cache_desc.shape[0], -1)


def slot_bytes(cache: Cache, tensor: int, slot: int) -> bytes:
    """Batch slot ``slot`` of tensor ``tensor``, byte for byte (NaN-safe, unlike ==)."""
    per_slot = cache.cache_desc.size // cache.cache_desc.shape[0]
    return bytes(cache.tensor_view(tensor)[slot * per_slot:(slot + 1) * per_slot])


def example_parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose ``--help`` prints the example's docstring as written."""
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_head_args(parser: argparse.ArgumentParser, kv_heads: int = 8) -> None:
    """Add ``--kv-heads`` and ``--head-dim``: the attention shape of every K/V tensor.

    Args:
        parser: the example's parser; call this after its own size flags, so
            that ``--help`` lists these two last.
        kv_heads: the default of ``--kv-heads``.
    """
    parser.add_argument("--kv-heads", type=int, default=kv_heads)
    parser.add_argument("--head-dim", type=int, default=128)
