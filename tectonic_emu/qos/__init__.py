"""Quality of service: TrafficGroups, their classes, and the fair queues that share a
node's disks between them (``docs/qos.md``)."""

from tectonic_emu.qos.fairqueue import LOCAL_DISK, Costs, FairQueue, Ticket
from tectonic_emu.qos.groups import CLASSES, DEFAULT, TrafficGroup, current, using
from tectonic_emu.qos.node import DEPTH, NodeQos, merged
from tectonic_emu.qos.stats import GroupStats, Histogram

__all__ = [
    "CLASSES",
    "DEFAULT",
    "DEPTH",
    "LOCAL_DISK",
    "Costs",
    "FairQueue",
    "GroupStats",
    "Histogram",
    "NodeQos",
    "Ticket",
    "TrafficGroup",
    "current",
    "merged",
    "using",
]
