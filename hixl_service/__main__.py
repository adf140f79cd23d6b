"""Command line of hixl-serviced: load the config, set up logging, run the loop.

Exit codes: 0 after a clean stop (or a successful ``--check`` /
``--print-config``), 1 when the daemon fails, 2 for a bad command line or
configuration (an Ascend backend that cannot start, a listener refused by
``listeners`` or ``trust`` included), 130 when
interrupted before the daemon took over SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hixl_service import __version__
from hixl_service._glibc import return_large_allocations
from hixl_service.config import ConfigError, DaemonConfig, LoggingConfig, load_config
from hixl_service.log_keys import LOG_KEYS

__all__ = ["EXIT_CONFIG", "EXIT_FAILURE", "EXIT_OK", "configure_logging", "main"]

# Under ``python -m`` this module is named "__main__"; log under the package name instead.
logger = logging.getLogger("hixl_service.main")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130

_PROG = "hixl-serviced"
# The request-id interceptor sets this attribute on records; lines logged
# outside a request show "-".
_REQUEST_ID_DEFAULT = {"request_id": "-"}
_TEXT_FIELDS = "%(levelname)s %(name)s [%(request_id)s] %(message)s"
# sd-daemon(3) priority prefixes, which journald strips and records as the level.
_SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _SYSLOG_PRIORITY.get(record.levelno, 6)
        return f"<{priority}>{super().format(record)}"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # Correlation keys as keys of their own (set through ``extra=`` or the
        # request-id record factory), never only inside the message text.
        for key in LOG_KEYS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _stderr_is_journal(environ: Mapping[str, str]) -> bool:
    # JOURNAL_STREAM is "dev:inode" of the journal stream; it is inherited, so
    # compare it with what stderr really is before speaking journald's prefixes.
    device, _, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        stat = os.fstat(sys.stderr.fileno())
        return (stat.st_dev, stat.st_ino) == (int(device), int(inode))
    except (OSError, ValueError, AttributeError):
        return False


def configure_logging(config: LoggingConfig, environ: Mapping[str, str] | None = None) -> None:
    """Send all log records to stderr, once per process.

    Under systemd (``JOURNAL_STREAM`` or ``INVOCATION_ID`` set) lines carry no
    timestamp, since journald stamps them, and a priority prefix when stderr is
    the journal.

    Args:
        config: Level and format.
        environ: Environment to inspect; ``os.environ`` if ``None``.
    """
    environ = os.environ if environ is None else environ
    under_systemd = bool(environ.get("JOURNAL_STREAM") or environ.get("INVOCATION_ID"))
    formatter: logging.Formatter
    if config.format == "json":
        formatter = _JsonFormatter()
    elif under_systemd and _stderr_is_journal(environ):
        formatter = _JournalFormatter(_TEXT_FIELDS, defaults=_REQUEST_ID_DEFAULT)
    elif under_systemd:
        formatter = logging.Formatter(_TEXT_FIELDS, defaults=_REQUEST_ID_DEFAULT)
    else:
        formatter = logging.Formatter(
            "%(asctime)s.%(msecs)03d " + _TEXT_FIELDS,
            datefmt="%Y-%m-%d %H:%M:%S",
            defaults=_REQUEST_ID_DEFAULT,
        )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    logging.basicConfig(level=config.level, handlers=[handler], force=True)
    logging.captureWarnings(True)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="The hixl daemon: KV-cache pools and transfers for one host.",
        epilog="Settings come from defaults, then the TOML file, then HIXL_<SECTION>__<FIELD> "
        "environment variables (e.g. HIXL_SERVER__PEER_PORT=26001).",
    )
    parser.add_argument("--config", type=Path, metavar="PATH", help="TOML configuration file")
    parser.add_argument(
        "--print-config",
        nargs="?",
        const="toml",
        choices=("toml", "json"),
        metavar="FORMAT",
        help="print the effective configuration (toml, the default, or json) and exit",
    )
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser.parse_args(argv)


def _loop_runner(config: DaemonConfig) -> Callable[[Coroutine[Any, Any, None]], None]:
    if config.server.use_uvloop:
        try:
            import uvloop
        except ImportError:
            logger.warning("uvloop is not installed; running on the default asyncio loop")
        else:
            return uvloop.run
    return asyncio.run


def _run(config: DaemonConfig, config_path: Path | None) -> int:
    # Before any thread or large allocation exists (see _glibc).
    if not return_large_allocations():
        logger.debug("not glibc: large allocations keep the C library's default")
    from hixl_service.listeners import StartRefused, check_start

    # A start that must be refused is, before the slow imports below and
    # before anything is created: it exits 2 at once and leaves nothing.
    try:
        check_start(config)
    except StartRefused as exc:
        logger.critical("%s", exc)
        return EXIT_CONFIG
    # Imported only now: the server pulls in grpc and the native module,
    # which --check and --print-config do not need.
    from hixl_service.ascend.backend import BackendUnavailable
    from hixl_service.server import run_daemon

    try:
        runner = _loop_runner(config)
        logger.info(
            "hixl-serviced %s starting (pid %d, %s loop)",
            __version__,
            os.getpid(),
            "asyncio" if runner is asyncio.run else "uvloop",
        )
        runner(run_daemon(config, config_path))
    except (BackendUnavailable, StartRefused) as exc:
        logger.critical("%s", exc)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        logger.warning("interrupted before a clean stop")
        return EXIT_INTERRUPTED
    except Exception:
        logger.critical("hixl-serviced failed", exc_info=True)
        return EXIT_FAILURE
    logger.info("hixl-serviced stopped")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon CLI.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` if ``None``.

    Returns:
        The process exit code (see the module docstring).
    """
    args = _parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        sys.stderr.write(f"{_PROG}: {exc}\n")
        return EXIT_CONFIG
    if args.print_config == "json":
        sys.stdout.write(json.dumps(config.model_dump(mode="json"), indent=2) + "\n")
        return EXIT_OK
    if args.print_config == "toml":
        sys.stdout.write(config.to_toml())
        return EXIT_OK
    if args.check:
        source = args.config if args.config is not None else "defaults and environment"
        sys.stdout.write(f"{_PROG}: configuration OK ({source})\n")
        return EXIT_OK
    configure_logging(config.logging)
    return _run(config, args.config)


if __name__ == "__main__":
    sys.exit(main())
