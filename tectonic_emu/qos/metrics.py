"""A served node's figures for Prometheus (``serve --metrics-port``), so Grafana can watch
a run: per TrafficGroup and disk (``disk="nic"``: an emulated NIC's replies), requests,
bytes, time charged and held, and the queueing delay and latency as histograms (their
buckets are ``stats.BOUNDS``).

The collector reads the node's ``NodeQos`` when scraped, from prometheus_client's HTTP
thread; each read copies a queue's table at once (one C call under the GIL), so a scrape
never sees a table change under it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import start_http_server
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from tectonic_emu.qos.node import NodeQos
from tectonic_emu.qos.stats import BOUNDS, Histogram

LABELS = ["node", "disk", "group", "class"]


class NodeCollector(Collector):
    """Node ``node_id``'s ``NodeQos`` (None: a node without a scheduler, which exports
    only that it has none)."""

    def __init__(self, qos: NodeQos | None, node_id: int) -> None:
        self.qos = qos
        self.node_id = node_id

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        mode = GaugeMetricFamily(
            "tectonic_node_qos_fair", "1 when the node's disks are fair-queued", labels=["node"]
        )
        mode.add_metric([str(self.node_id)], 1.0 if self.qos is not None and self.qos.fair else 0.0)
        yield mode
        if self.qos is None:
            return
        ops = CounterMetricFamily("tectonic_qos_requests", "Requests served", labels=LABELS)
        nbytes = CounterMetricFamily("tectonic_qos_bytes", "Bytes served", labels=LABELS)
        charged = CounterMetricFamily(
            "tectonic_qos_disk_charged_seconds", "Disk time charged (modelled)", labels=LABELS
        )
        busy = CounterMetricFamily(
            "tectonic_qos_slot_seconds", "Seconds requests held a disk slot", labels=LABELS
        )
        wait = HistogramMetricFamily(
            "tectonic_qos_wait_seconds", "Queueing delay before a disk slot", labels=LABELS
        )
        latency = HistogramMetricFamily(
            "tectonic_qos_latency_seconds", "Queueing and service", labels=LABELS
        )
        queues = [(str(d), q) for d, q in enumerate(self.qos.queues)]
        if self.qos.nic is not None:
            queues.append(("nic", self.qos.nic))  # an emulated NIC's replies
        for disk, queue in queues:
            for group, s in list(queue.stats.items()):
                labels = [str(self.node_id), disk, group, s.klass]
                ops.add_metric(labels, s.ops)
                nbytes.add_metric(labels, s.bytes)
                charged.add_metric(labels, s.charged_s)
                busy.add_metric(labels, s.busy_s)
                wait.add_metric(labels, _buckets(s.wait), s.wait.total)
                latency.add_metric(labels, _buckets(s.latency), s.latency.total)
        yield from (ops, nbytes, charged, busy, wait, latency)


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    """Cumulative counts per upper bound, as Prometheus histograms have them."""
    out, seen = [], 0
    counts = list(h.counts)
    for bound, c in zip(BOUNDS, counts, strict=False):
        seen += c
        out.append((repr(bound), float(seen)))
    out.append(("+Inf", float(seen + counts[-1])))
    return out


def registry_for(qos: NodeQos | None, node_id: int) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(qos, node_id))
    return registry


def serve_metrics(qos: NodeQos | None, node_id: int, *, host: str, port: int) -> None:
    """Answer ``GET /metrics`` on ``host:port`` from a daemon thread, for the process's life."""
    start_http_server(port, addr=host, registry=registry_for(qos, node_id))


__all__ = ["NodeCollector", "registry_for", "serve_metrics"]
