"""A bare grpc.aio echo server for the gRPC round-trip ceiling: ``python -m ... SOCKET_PATH``.

It prints ``ready`` once it listens and serves until it is terminated.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc
import grpc.aio


async def _echo(request: bytes, _context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def serve(socket_path: str) -> None:
    """Serve ``/hixl.bench.Echo/Ping`` (raw bytes in, the same bytes out) until SIGTERM."""
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "hixl.bench.Echo", {"Ping": grpc.unary_unary_rpc_method_handler(_echo)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{socket_path}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await server.stop(None)


def main() -> None:
    asyncio.run(serve(sys.argv[1]))


if __name__ == "__main__":
    main()
