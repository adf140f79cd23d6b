"""Reading a real daemon's /metrics in tests (``[metrics] listen`` set)."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from hixl_service.testing import DaemonProcess

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(daemon: DaemonProcess) -> Samples:
    """Every sample of the daemon's /metrics, by name and sorted labels."""
    url = f"http://{daemon.ready['metrics_address']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


async def ascrape(daemon: DaemonProcess) -> Samples:
    return await asyncio.to_thread(scrape, daemon)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
