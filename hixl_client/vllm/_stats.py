"""The connector's transfer statistics, in vLLM's ``KVConnectorStats`` form
(workers collect them; vLLM's logger aggregates and reduces them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats


def _empty() -> dict[str, Any]:
    return {"transfers": 0, "bytes": 0, "failures": 0, "leases_expired": 0, "seconds": []}


@dataclass
class HixlConnectorStats(KVConnectorStats):
    """Loads (transfers, bytes, durations), failed loads and expired leases."""

    data: dict[str, Any] = field(default_factory=_empty)

    def record_transfer(self, nbytes: int, seconds: float) -> None:
        self.data["transfers"] += 1
        self.data["bytes"] += nbytes
        self.data["seconds"].append(seconds)

    def record_failure(self) -> None:
        self.data["failures"] += 1

    def record_expired(self, leases: int) -> None:
        self.data["leases_expired"] += leases

    def reset(self) -> None:
        self.data = _empty()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key in ("transfers", "bytes", "failures", "leases_expired"):
            self.data[key] += other.data.get(key, 0)
        self.data["seconds"] = self.data["seconds"] + list(other.data.get("seconds", ()))
        return self

    def reduce(self) -> dict[str, int | float]:
        seconds = sorted(self.data["seconds"])
        p50 = seconds[len(seconds) // 2] if seconds else 0.0
        return {"Num successful transfers": self.data["transfers"],
                "Bytes transferred (MiB)": round(self.data["bytes"] / 2**20, 3),
                "Failed transfers": self.data["failures"],
                "Expired leases": self.data["leases_expired"],
                "Median transfer (ms)": round(p50 * 1000, 3)}

    def is_empty(self) -> bool:
        return not (self.data["transfers"] or self.data["failures"]
                    or self.data["leases_expired"])
