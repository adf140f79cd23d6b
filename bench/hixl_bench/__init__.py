"""hixl-bench: hixl's throughput and latency next to ceilings and peers measured in the same run.

``python -m hixl_bench`` (or the ``hixl-bench`` console script) starts
two real daemons (an initiator and a target), sweeps block sizes, blocks per
request, operations, paths (inside one daemon, between daemons over TCP) and
concurrency, moves KV-shaped prompts, and prints every hixl row with its ratio
to the matching ceiling (cold memcpy, raw loopback TCP in C, a bare grpc.aio
round trip) and to the peers that are installed (Mooncake Transfer Engine,
NIXL). Importing this package imports nothing heavy.
"""

__all__: list[str] = []
