"""hixlctl: the operator's command line over the local daemon's client socket.

Every subcommand but ``doctor`` is one Admin call: ``status``, ``sessions``,
``clusters``, ``caches``, ``links``, ``pools`` and ``transfers`` read
``Admin/GetStatus``; ``drain`` calls ``Admin/Drain`` (the stop SIGTERM
begins). Output is a table by default and JSON with ``-o json`` (the
message's own JSON mapping, field names as in ``admin.proto``). Tables show
every field the daemon sends, so a field added to ``admin.proto`` (a link's
``state``, say) appears without a change here. ``doctor`` is ``doctor.py``.

Exit codes: 0 done (doctor: nothing failed), 1 a check failed or the daemon
answered an error, 2 a bad command line or an unreachable daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from hixl_wire._proto.hixl.v1 import admin_pb2, admin_pb2_grpc
from hixl_wire.defaults import default_socket_path

from . import __version__
from .tables import render_table

__all__ = ["main"]

_PROG = "hixlctl"
# The client library's variable naming the local daemon (hixl_client._defaults).
DAEMON_ENV = "HIXL_DAEMON"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Columns each listing shows first; the rest follow in the message's field order.
_LEADING: dict[str, tuple[str, ...]] = {
    "links": ("direction", "local_cluster_id", "remote_cluster_id", "transport", "state",
              "alive"),
    "transfers": ("op", "transport", "status", "calls", "bytes"),
}
_LISTS = {
    "sessions": admin_pb2.SessionStatus,
    "clusters": admin_pb2.ClusterStatus,
    "caches": admin_pb2.CacheStatus,
    "links": admin_pb2.LinkStatus,
    "pools": admin_pb2.PoolStatus,
    "transfers": admin_pb2.TransferCount,
}


def default_target() -> str:
    """The daemon hixlctl talks to: ``$HIXL_DAEMON``, else the default client socket."""
    return os.environ.get(DAEMON_ENV) or f"unix:{default_socket_path()}"


def target_of_config(path: Path) -> str:
    """The client target of the daemon configured by the TOML file ``path``."""
    from .config import load_config

    server = load_config(path).server
    if server.client_socket is not None:
        return f"unix:{server.client_socket}"
    assert server.client_tcp is not None  # the config requires one of the two
    return server.client_tcp


def as_dict(message: Message) -> dict[str, Any]:
    """A message as JSON-ready values, every field present (defaults included)."""
    return MessageToDict(message, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)


def _columns(message_type: type[Message], rows: list[dict[str, Any]], listing: str) -> list[str]:
    names = [field.name for field in message_type.DESCRIPTOR.fields]
    for row in rows:  # a newer daemon's fields, unknown to this build
        names += [name for name in row if name not in names]
    leading = [name for name in _LEADING.get(listing, ()) if name in names]
    return leading + [name for name in names if name not in leading]


def _summary(status: admin_pb2.DaemonStatus) -> list[tuple[str, str]]:
    links = len(status.links)
    up = sum(1 for link in status.links if link.alive)
    return [
        ("daemon", f"{status.daemon_id} (hixl {status.version}, backend {status.backend}, "
                   f"pid {status.pid or '?'})"),
        ("uptime", f"{status.uptime_s:.0f} s"),
        ("peers", status.peer_address),
        ("data", status.data_address),
        ("peer lane", status.peer_lane_address or "off"),
        ("transfer lane", status.transfer_lane or "off"),
        ("metrics", f"http://{status.metrics_address}/metrics" if status.metrics_address
         else "off"),
        ("sessions", str(len(status.sessions))),
        ("clusters", str(len(status.clusters))),
        ("caches", str(len(status.caches))),
        ("links", f"{links} ({up} alive)"),
        ("pools", f"{len(status.pools)}, {status.pool_reserved_bytes} of "
                  f"{status.pool_budget_bytes} bytes reserved"),
        ("transfers", f"{status.transfers_under_way} under way, "
                      f"{sum(t.calls for t in status.transfers)} answered"),
        ("refusals", ", ".join(f"{k}={v}" for k, v in sorted(status.refusals.items()))
         or "none"),
    ]


def _print_status(status: admin_pb2.DaemonStatus, output: str, listing: str) -> None:
    if listing == "status":
        if output == "json":
            print(json.dumps(as_dict(status), indent=2))
        else:
            width = max(len(key) for key, _ in _summary(status))
            for key, text in _summary(status):
                print(f"{key.ljust(width)}  {text}")
        return
    rows = [as_dict(item) for item in getattr(status, listing)]
    if output == "json":
        print(json.dumps(rows, indent=2))
    else:
        print(render_table(_columns(_LISTS[listing], rows, listing), rows))


def _channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(target)


def _call(target: str, timeout_s: float,
          call: Callable[[admin_pb2_grpc.AdminStub], Message]) -> Message:
    with _channel(target) as channel:
        return call(admin_pb2_grpc.AdminStub(channel))


def get_status(target: str, timeout_s: float) -> admin_pb2.DaemonStatus:
    """The daemon's Admin status (raises grpc.RpcError)."""
    reply = _call(target, timeout_s, lambda stub: stub.GetStatus(
        admin_pb2.GetStatusRequest(), timeout=timeout_s))
    assert isinstance(reply, admin_pb2.DaemonStatus)
    return reply


_EXAMPLES = """examples:
  hixlctl status                              the daemon at $HIXL_DAEMON or the default socket
  hixlctl links -o json                       options go before or after the command
  hixlctl --config /etc/hixl/hixl.toml doctor --peer 10.0.0.5:26000
  hixlctl drain --daemon unix:/run/hixl/hixl.sock --timeout 30
"""


def _common_options(after_command: bool) -> argparse.ArgumentParser:
    """The options hixlctl takes before or after its command, as kubectl and
    etcdctl do. After the command their defaults are SUPPRESS, so a value
    given before the command is not reset by the command's own parser."""
    def default(value: object) -> object:
        return argparse.SUPPRESS if after_command else value

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--daemon", metavar="TARGET", default=default(None),
                        help="gRPC target of the daemon's client listener (unix:PATH or "
                             "host:port)")
    common.add_argument("--config", type=Path, metavar="PATH", default=default(None),
                        help="the daemon's TOML configuration (its client socket, and what "
                             "doctor checks)")
    common.add_argument("-o", "--output", choices=("table", "json"),
                        default=default("table"), help="table (default) or json")
    common.add_argument("--timeout", type=float, default=default(10.0), metavar="S",
                        help="seconds to wait for the daemon (default 10)")
    return common


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    after = [_common_options(after_command=True)]
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Inspect and operate the local hixl daemon.",
        parents=[_common_options(after_command=False)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"The daemon is ${DAEMON_ENV}, else the default client socket "
               f"({default_socket_path()}), unless --daemon or --config says otherwise.\n\n"
               + _EXAMPLES)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("status", parents=after, help="a summary of the daemon")
    for listing in _LISTS:
        commands.add_parser(listing, parents=after, help=f"the daemon's {listing}")
    commands.add_parser("drain", parents=after,
                        help="stop taking work, end sessions and stop, as SIGTERM does")
    doctor = commands.add_parser(
        "doctor", parents=after, help="check configuration, listeners, socket permissions, "
                                      "limits, peers and links")
    doctor.add_argument("--peer", action="append", default=[], metavar="HOST:PORT",
                        help="also check that this peer daemon's peer port answers "
                             "(repeatable)")
    doctor.add_argument("--self-test-bytes", type=int, default=4 << 20, metavar="N",
                        help="bytes each link's self-test transfer moves (default 4 MiB; "
                             "0 skips the self-test)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run hixlctl; returns the exit code (see the module docstring)."""
    args = _parse_args(argv)
    try:
        target = args.daemon or (target_of_config(args.config) if args.config is not None
                                 else default_target())
    except Exception as exc:  # a bad configuration file: doctor reports it in full
        if args.command != "doctor":
            sys.stderr.write(f"{_PROG}: {exc}\n")
            return EXIT_USAGE
        target = default_target()
    if args.command == "doctor":
        from .doctor import run_doctor

        return run_doctor(target, args.config, args.peer, args.self_test_bytes,
                          args.output, args.timeout)
    try:
        if args.command == "drain":
            reply = _call(target, args.timeout, lambda stub: stub.Drain(
                admin_pb2.DrainRequest(), timeout=args.timeout))
            if args.output == "json":
                print(json.dumps(as_dict(reply), indent=2))
            else:
                assert isinstance(reply, admin_pb2.DrainReply)
                print("draining: the drain had begun already" if reply.already_draining else
                      f"draining: the daemon stops as on SIGTERM (transfers in flight get "
                      f"up to {reply.grace_period_s:g} s)")
            return EXIT_OK
        status = get_status(target, args.timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        sys.stderr.write(f"{_PROG}: {target}: {details}\n")
        return EXIT_USAGE if code in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED) else EXIT_FAILED
    _print_status(status, args.output, args.command)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
