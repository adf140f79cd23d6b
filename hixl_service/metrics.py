"""The Prometheus endpoint: ``/metrics`` over plain HTTP (``[metrics] listen``).

Nothing is recorded for Prometheus on the transfer path: the daemon keeps
plain counters (``stats.DaemonStats``) and its state (sessions, clusters,
links, pools) where it always did, and :class:`DaemonCollector` turns them
into metric families when Prometheus scrapes. prometheus_client serves the
HTTP listener on a thread of its own; a scrape asks the event loop's
thread to read the state (``call_soon_threadsafe``), so that nothing reads
the engine's dicts while the loop changes them. A loop that does not answer
within ``SCRAPE_TIMEOUT_S`` yields ``hixl_up 0`` and nothing else: a wedged
daemon shows as such rather than as a stale picture.

Label sets are small and carry no ids: op, transport, LLM status, phase,
link direction and state, pool placement, refusal reason. Per-id detail
(sessions, clusters, links, pools) is ``hixlctl``'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import ProcessCollector, start_http_server
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .listeners import StartRefused, is_loopback, refuse_busy_port
from .stats import SUCCESS

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .config import MetricsConfig
    from .engine import Engine

logger = logging.getLogger(__name__)

# How long a scrape waits for the event loop to read the daemon's state.
SCRAPE_TIMEOUT_S = 5.0


class DaemonCollector(Collector):
    """The daemon's metric families, read from the engine at scrape time."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop, version: str) -> None:
        self._engine = engine
        self._loop = loop
        self._version = version

    def collect(self) -> Iterator[Metric]:
        # Runs on the HTTP server's thread: the state is read on the loop's.
        future: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def read() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(self.families())
                except BaseException as exc:
                    future.set_exception(exc)

        up = GaugeMetricFamily("hixl_up", "1 when the daemon's event loop answered the scrape")
        try:
            self._loop.call_soon_threadsafe(read)
            families = future.result(timeout=SCRAPE_TIMEOUT_S)
        except (concurrent.futures.TimeoutError, RuntimeError):
            future.cancel()
            logger.warning("a /metrics scrape found the event loop unresponsive or closed")
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def families(self) -> list[Metric]:
        """Every family but hixl_up; call on the event loop's thread."""
        self._engine.native.catch_up()  # the native lanes' transfers logged since the last look
        return [*self._daemon(), *self._transfers(), *self._calls(), *self._sessions(),
                *self._clusters(), *self._links(), *self._pools()]

    def _daemon(self) -> Iterable[Metric]:
        deps = self._engine.deps
        info = GaugeMetricFamily("hixl_daemon_info", "The daemon's version and backend",
                                 labels=["version", "backend"])
        info.add_metric([self._version, deps.backend], 1)
        return [info, GaugeMetricFamily("hixl_uptime_seconds",
                                        "Seconds since the daemon started",
                                        value=time.monotonic() - deps.started)]

    def _transfers(self) -> Iterable[Metric]:
        """Transfer calls by op, transport and status: counts, bytes, durations."""
        stats = self._engine.deps.stats
        transfers = CounterMetricFamily(
            "hixl_transfers", "Transfer calls answered, by op, transport and LLM status",
            labels=["op", "transport", "status"])
        moved = CounterMetricFamily("hixl_transfer_bytes", "Bytes moved by successful calls",
                                    labels=["op", "transport"])
        duration = HistogramMetricFamily(
            "hixl_transfer_duration_seconds",
            "Daemon time of successful pulls and pushes: control (finding, planning, "
            "replying), data (moving bytes) and their total",
            labels=["op", "transport", "phase"])
        for (op, transport), entry in sorted(stats.moved.items()):
            transfers.add_metric([op, transport, SUCCESS], entry.count)
            moved.add_metric([op, transport], entry.bytes)
            if entry.total.sum or any(entry.total.counts):
                for phase, hist in (("control", entry.control), ("data", entry.data),
                                    ("total", entry.total)):
                    duration.add_metric([op, transport, phase], hist.cumulative(), hist.sum)
        for (op, transport, status), count in sorted(stats.failed.items()):
            transfers.add_metric([op, transport, status], count)
        return [transfers, moved, duration]

    def _calls(self) -> Iterable[Metric]:
        """Checksum mismatches, the calls in flight, and the refusals."""
        deps = self._engine.deps
        stats = deps.stats
        mismatches = CounterMetricFamily(
            "hixl_checksum_mismatches",
            "Transfers whose bytes did not match their CRC-32C ([transfer] checksum): "
            "this daemon's calls that failed so (initiator), writes into its memory "
            "that it refused so (target)", labels=["side"])
        mismatches.add_metric(["initiator"], stats.checksum_mismatches)
        mismatches.add_metric(["target"], deps.data_server.checksum_mismatches)
        refusals = CounterMetricFamily("hixl_refusals", "Calls refused, by reason",
                                       labels=["reason"])
        for reason, count in sorted(stats.refused.items()):
            refusals.add_metric([reason], count)
        return [mismatches,
                GaugeMetricFamily("hixl_transfers_in_flight",
                                  "Transfer calls accepted and not yet answered",
                                  value=deps.load.running),
                refusals]

    def _sessions(self) -> Iterable[Metric]:
        engine = self._engine
        sessions = engine.sessions.values()
        lane_calls = CounterMetricFamily("hixl_lane_calls", "Calls the lanes accepted",
                                         labels=["lane"])
        lane_calls.add_metric(["transfer"], engine.sessions.retired_lane_calls
                              + sum(session.lane_calls for session in sessions))
        lane_calls.add_metric(["peer"], engine.deps.peer_lane.calls)
        lane_calls.add_metric(["native"], engine.native.native_transfers)
        return [GaugeMetricFamily("hixl_sessions", "Attached client sessions",
                                  value=len(sessions)),
                lane_calls]

    def _clusters(self) -> Iterable[Metric]:
        clusters = list(self._engine.clusters.values())
        return [
            GaugeMetricFamily("hixl_clusters", "Initialized clusters", value=len(clusters)),
            GaugeMetricFamily("hixl_caches", "Caches of all clusters",
                              value=sum(len(c.registry) for c in clusters)),
            GaugeMetricFamily("hixl_cache_keys", "Cache keys of all clusters",
                              value=sum(c.registry.key_count for c in clusters)),
            GaugeMetricFamily(  # a gauge: it drops when a cluster ends
                "hixl_repeated_transfers", "Transfers by repeat handle of the clusters alive",
                value=sum(c.repeats.repeated for c in clusters))]

    def _links(self) -> Iterable[Metric]:
        """Links now, by direction, transport and state; and their transitions."""
        engine = self._engine
        links: Counter[tuple[str, str, str]] = Counter()
        for cluster in engine.clusters.values():
            for link in cluster.links.values():
                links["outbound", link.info().name, link.health.state.value] += 1
        for inbound in engine.inbound.all():
            links["inbound", inbound.side.name, inbound.health.state.value] += 1
        link_gauge = GaugeMetricFamily("hixl_links", "Links, by direction, transport and state",
                                       labels=["direction", "transport", "state"])
        for key, count in sorted(links.items()):
            link_gauge.add_metric(list(key), count)
        transitions = CounterMetricFamily("hixl_link_transitions",
                                          "Links that entered a state, by direction",
                                          labels=["direction", "state"])
        for (direction, state), count in sorted(engine.deps.stats.link_transitions.items()):
            transitions.add_metric([direction, state], count)
        return [link_gauge, transitions]

    def _pools(self) -> Iterable[Metric]:
        pools = self._engine.pools
        used: dict[str, int] = {}
        free: dict[str, int] = {}
        count: dict[str, int] = {}
        for pool in pools.pools():
            placement = pool.placement.name
            used[placement] = used.get(placement, 0) + pool.allocator.used_bytes
            free[placement] = free.get(placement, 0) + pool.allocator.free_bytes
            count[placement] = count.get(placement, 0) + 1
        families = []
        for name, doc, values in (
                ("hixl_pools", "Memory pools, by placement", count),
                ("hixl_pool_used_bytes", "Bytes allocated in the pools", used),
                ("hixl_pool_free_bytes", "Bytes free in the pools", free)):
            family = GaugeMetricFamily(name, doc, labels=["placement"])
            for placement, value in sorted(values.items()):
                family.add_metric([placement], value)
            families.append(family)
        families.append(GaugeMetricFamily("hixl_pool_budget_bytes", "pool.max_bytes",
                                          value=pools.budget_bytes))
        families.append(GaugeMetricFamily("hixl_pool_reserved_bytes",
                                          "Bytes of the budget the pools reserve",
                                          value=pools.reserved_bytes))
        return families


def check_metrics_exposure(config: MetricsConfig) -> None:
    """Refuse a /metrics listener off loopback unless ``metrics.allow_remote``;
    warn at every start when it is allowed."""
    if config.listen is None:
        return
    host = config.listen.rpartition(":")[0]
    if is_loopback(host):
        return
    if not config.allow_remote:
        raise StartRefused(
            f"metrics.listen = {config.listen!r} is not loopback: /metrics is plain HTTP "
            f"without authentication, and tells anyone who reaches it what the daemon "
            f"holds and moves; keep it on 127.0.0.1 (scrape through a local agent) or set "
            f"metrics.allow_remote = true to accept that")
    logger.warning("metrics.allow_remote: /metrics listens on %s, off loopback, without "
                   "authentication", config.listen)


class MetricsServer:
    """The /metrics HTTP listener of one daemon."""

    def __init__(self, httpd: WSGIServer) -> None:
        self._httpd = httpd

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        name = host if isinstance(host, str) else host.decode()
        return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"

    @classmethod
    def start(cls, config: MetricsConfig, engine: Engine, loop: asyncio.AbstractEventLoop,
              version: str) -> MetricsServer:
        """Listen on ``config.listen`` (bound now: a busy port refuses the start)."""
        assert config.listen is not None
        host, _, port = config.listen.rpartition(":")
        registry = CollectorRegistry()
        registry.register(DaemonCollector(engine, loop, version))
        ProcessCollector(registry=registry)
        try:
            httpd, _thread = start_http_server(int(port), host.strip("[]"), registry)
        except OSError as exc:
            raise refuse_busy_port("metrics", config.listen, exc) from None
        return cls(httpd)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
