"""hixl-serviced: the per-host daemon that owns KV-cache pools and moves their bytes.

Run it with ``python -m hixl_service --config hixl.toml`` (or the
``hixl-serviced`` console script). Clients attach over a unix socket; peer
daemons talk gRPC and a native data plane over TCP. This package is imported
by the CLI and by tests, so it imports nothing heavy itself.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
