"""What a node's schedulers count per TrafficGroup: operations, bytes, disk time, and the
queueing delay and latency of its requests as histograms (percentiles without keeping every
sample; the same buckets a Prometheus histogram exports)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Histogram bucket bounds in seconds: 10 us to about 168 s, each sqrt(2) above the last
#: (a percentile read from them is within 41% of the truth, 19% on average).
BOUNDS: tuple[float, ...] = tuple(1e-5 * 2 ** (i / 2) for i in range(49))


class Histogram:
    """Counts of samples (seconds) per bucket of ``BOUNDS`` (and one past the last)."""

    __slots__ = ("counts", "n", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)
        self.n = 0
        self.total = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BOUNDS, seconds)] += 1
        self.n += 1
        self.total += seconds

    def merge(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.n += other.n
        self.total += other.total

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1), interpolated within its bucket (0.0 when empty)."""
        if self.n == 0:
            return 0.0
        rank = q * self.n
        seen = 0
        for i, c in enumerate(self.counts):
            if c and seen + c >= rank:
                lo = BOUNDS[i - 1] if i > 0 else 0.0
                hi = BOUNDS[i] if i < len(BOUNDS) else BOUNDS[-1] * 2
                return lo + (hi - lo) * max(0.0, rank - seen) / c
            seen += c
        return BOUNDS[-1] * 2

    def to_dict(self) -> dict[str, Any]:
        """Sparse counts (``{bucket index: count}``), to rebuild it elsewhere."""
        return {"n": self.n, "total": self.total, "buckets": _sparse(self.counts)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Histogram:
        h = cls()
        h.n, h.total = int(raw["n"]), float(raw["total"])
        for i, c in raw["buckets"].items():
            h.counts[int(i)] = int(c)
        return h


def _sparse(counts: Iterable[int]) -> dict[str, int]:
    return {str(i): c for i, c in enumerate(counts) if c}


@dataclass(slots=True)
class GroupStats:
    """One group's requests through one scheduler."""

    klass: str
    ops: int = 0
    bytes: int = 0
    charged_s: float = 0.0  # device-seconds charged (``Costs``)
    busy_s: float = 0.0  # seconds its requests held a slot, measured
    wait: Histogram = field(default_factory=Histogram)  # queueing delay
    latency: Histogram = field(default_factory=Histogram)  # queueing and service

    def merge(self, other: GroupStats) -> None:
        self.ops += other.ops
        self.bytes += other.bytes
        self.charged_s += other.charged_s
        self.busy_s += other.busy_s
        self.wait.merge(other.wait)
        self.latency.merge(other.latency)

    def summary(self) -> dict[str, Any]:
        """Figures for people (``cluster status``): counts, and percentiles in ms."""
        return {
            "class": self.klass,
            "ops": self.ops,
            "bytes": self.bytes,
            "charged_s": round(self.charged_s, 6),
            "busy_s": round(self.busy_s, 6),
            "wait_p50_ms": _ms(self.wait.quantile(0.5)),
            "wait_p99_ms": _ms(self.wait.quantile(0.99)),
            "latency_p50_ms": _ms(self.latency.quantile(0.5)),
            "latency_p99_ms": _ms(self.latency.quantile(0.99)),
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, to rebuild it in another process (``from_dict``)."""
        return {
            "class": self.klass,
            "ops": self.ops,
            "bytes": self.bytes,
            "charged_s": self.charged_s,
            "busy_s": self.busy_s,
            "wait": self.wait.to_dict(),
            "latency": self.latency.to_dict(),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GroupStats:
        return cls(
            str(raw["class"]),
            int(raw["ops"]),
            int(raw["bytes"]),
            float(raw["charged_s"]),
            float(raw["busy_s"]),
            Histogram.from_dict(raw["wait"]),
            Histogram.from_dict(raw["latency"]),
        )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3) if math.isfinite(seconds) else 0.0


__all__ = ["BOUNDS", "GroupStats", "Histogram"]
