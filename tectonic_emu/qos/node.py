"""A storage node's schedulers: one ``FairQueue`` per disk, and what they counted.

Served nodes (``chunkstore/server.py``) and the projection's model servers (``sim/node.py``)
each hold one ``NodeQos`` and run every disk request through ``serving``. The request's
group is the running task's (``groups.current``), which a served node sets from the
request's frame. (Embedded clusters have none: each process opens the nodes' directories
itself, and no one queue would see all of a disk's requests.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.qos.fairqueue import LOCAL_DISK, Costs, FairQueue, Ticket
from tectonic_emu.qos.groups import current
from tectonic_emu.qos.stats import GroupStats

#: Requests in service per disk at once. Four is enough to keep this machine's disk and a
#: node's eight I/O threads busy (``bench store`` with one group) and keeps the wait of a gold
#: request behind bronze ones to a fraction of one of those.
DEPTH = 4


#: Reply frames on an emulated NIC at once: one on the line, one being handed to the socket.
NIC_DEPTH = 2


class NodeQos:
    """The schedulers of one node with ``disks`` disks (``fair=False``: first come first
    served, still counted per group), and with ``nic_rate`` (bytes/s, an emulated NIC's,
    ``netem.py``), one for the replies it sends: a reply's turn on the line is its group's
    too, charged its bytes over the rate. (What a node receives is not scheduled: a frame's
    group is known only once its header is in, and the receiving side can only stop reading
    a connection.)"""

    def __init__(
        self,
        disks: int,
        *,
        depth: int = DEPTH,
        costs: Costs = LOCAL_DISK,
        fair: bool = True,
        nic_rate: float = 0.0,
    ) -> None:
        self.depth = depth
        self.fair = fair
        self.queues = [FairQueue(depth, costs=costs, fair=fair) for _ in range(disks)]
        self.nic: FairQueue | None = None
        if nic_rate > 0:
            line = Costs(read_bw=nic_rate, write_bw=nic_rate, read_op_s=0.0, write_op_s=0.0)
            self.nic = FairQueue(NIC_DEPTH, costs=line, fair=fair)

    def disk(self, n: int) -> FairQueue:
        if not 0 <= n < len(self.queues):
            raise InvalidArgumentError(f"no disk {n} (the node has {len(self.queues)})")
        return self.queues[n]

    def serving(
        self, disk: int, nbytes: int | None, *, write: bool
    ) -> contextlib.AbstractAsyncContextManager[Ticket]:
        """A slot on ``disk`` for one request of the current group (``FairQueue.serving``)."""
        return self.disk(disk).serving(current(), nbytes, write=write)

    def by_group(self) -> dict[str, GroupStats]:
        """Every disk's figures, merged per group."""
        return merge_groups(q.stats for q in self.queues)

    def to_dict(self) -> dict[str, Any]:
        """Everything counted, per disk and group (``GroupStats.from_dict`` reads it back)."""
        nic = self.nic.stats if self.nic is not None else {}
        return {
            "fair": self.fair,
            "depth": self.depth,
            "disks": [{g: s.to_dict() for g, s in q.stats.items()} for q in self.queues],
            "nic": {g: s.to_dict() for g, s in nic.items()},
        }


def merge_groups(tables: Iterable[Mapping[str, GroupStats]]) -> dict[str, GroupStats]:
    """Per group, the sum of its figures in every table (a disk's, a node's)."""
    out: dict[str, GroupStats] = {}
    for table in tables:
        for name, s in table.items():
            out.setdefault(name, GroupStats(s.klass)).merge(s)
    return out


def merged(snapshots: list[dict[str, Any]]) -> dict[str, GroupStats]:
    """Per group, the figures of every disk of every node's ``to_dict``."""
    return merge_groups(
        {name: GroupStats.from_dict(raw) for name, raw in disk.items()}
        for snap in snapshots
        for disk in snap["disks"]
    )


__all__ = ["DEPTH", "NIC_DEPTH", "NodeQos", "merge_groups", "merged"]
