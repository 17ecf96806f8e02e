"""A projected cluster: modelled servers, disks and network behind the real client.

``ModelCluster`` builds the hardware of a projection: storage servers in racks of their
own, each with its disks, on one ``Fabric``; client hosts, each with its CPU
(``sim/cpu.py``); and one metadata store that every client shares: a ``MemoryKV``, or with
a ``MetadataModel`` a ``ModelKV`` that charges each transaction to its shards
(``sim/metadata.py``). ``client_cluster(host)`` is what one client host opens: a real
``Cluster``, with its real ``Client``, ``DataPath``, placement and hedging, whose nodes are
``ModelNode`` handles from that host, and whose CPU and I/O pools run work inline so that
threads cannot reorder events. Run it under ``clock.run_virtual``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tectonic_emu import clock
from tectonic_emu.cluster import Cluster
from tectonic_emu.coding.work import Tally
from tectonic_emu.config import ClusterConfig, check_qos
from tectonic_emu.metadata import MemoryKV
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.offload import InlineExecutor
from tectonic_emu.qos.node import NodeQos
from tectonic_emu.sim.cpu import CpuModel, HostCpu
from tectonic_emu.sim.devices import Disk, DiskModel
from tectonic_emu.sim.fabric import Fabric, FabricModel, Host
from tectonic_emu.sim.metadata import MetadataModel, ModelKV
from tectonic_emu.sim.node import ModelNodes, ModelServer

#: Where a projected cluster says it lives: no directory is ever made or read.
NOWHERE = Path("/projection")


@dataclass(frozen=True, slots=True)
class Hardware:
    """What a projection runs on: ``servers`` storage servers of ``disks`` ``disk``s each,
    ``servers_per_rack`` to a rack, on a ``fabric``."""

    servers: int
    disks: int
    disk: DiskModel
    fabric: FabricModel
    servers_per_rack: int = 16
    metadata: MetadataModel | None = None  # None: metadata operations cost nothing
    cpu: CpuModel | None = None  # each client host's; None: its work is counted, not charged
    # An embedded cluster: the nodes live in the one client host's process, so every
    # server's disks are one device and the servers' CPU work is that host's.
    embedded: bool = False
    # How each server shares its disks between TrafficGroups, as a served node does
    # (``ClusterConfig.qos``): "fair", "fifo" or "off" (no scheduler: the projections
    # before issue 23), with ``qos_depth`` requests in service per disk.
    qos: str = "off"
    qos_depth: int = 32

    @property
    def devices(self) -> int:
        """Disk devices in all."""
        return 1 if self.embedded else self.servers * self.disks


class ModelCluster:
    """The servers and fabric of one projection (module docstring)."""

    def __init__(self, hardware: Hardware, config: ClusterConfig) -> None:
        if config.nodes != hardware.servers or config.disks_per_node != hardware.disks:
            raise ValueError(
                f"the config says {config.nodes} nodes of {config.disks_per_node} disks, the "
                f"hardware {hardware.servers} servers of {hardware.disks}"
            )
        self.hardware = hardware
        self.config = config
        self.fabric = Fabric(hardware.fabric)
        self.servers: list[ModelServer] = []
        device = Disk(hardware.disk, name="the device") if hardware.embedded else None
        while len(self.servers) < hardware.servers:
            rack = min(hardware.servers_per_rack, hardware.servers - len(self.servers))
            for host in self.fabric.add_rack(rack):
                n = len(self.servers)
                disks = [
                    device or Disk(hardware.disk, name=f"n{n}d{d}") for d in range(hardware.disks)
                ]
                self.servers.append(ModelServer(n, host, disks, qos=self._node_qos()))
        self.kv: MemoryKV | ModelKV = (
            MemoryKV()
            if hardware.metadata is None
            else ModelKV(hardware.metadata, log=device)  # embedded: its log on the device
        )
        self.meta = Metadata(self.kv)
        self.cpus: dict[Host, Tally] = {}  # each client host's CPU
        self._rooted = False

    def _node_qos(self) -> NodeQos | None:
        hw = self.hardware
        if check_qos(hw.qos, hw.qos_depth) == "off":
            return None
        costs = hw.disk.costs()
        return NodeQos(hw.disks, depth=hw.qos_depth, costs=costs, fair=hw.qos == "fair")

    def add_clients(self, hosts: int, *, per_rack: int = 16, processes: int = 1) -> list[Host]:
        """``hosts`` client hosts, in racks of ``per_rack`` apart from the servers', each
        with its CPU (``cpus``): make it current (``Tally.active``) in the host's tasks.
        Each host runs ``processes`` client processes, so that many event loops (one on an
        embedded cluster, whatever is asked)."""
        if self.hardware.embedded and (self.cpus or hosts != 1):
            raise ValueError("an embedded cluster has one client host, its nodes' host")
        out: list[Host] = []
        while len(out) < hosts:
            out.extend(self.fabric.add_rack(min(per_rack, hosts - len(out))))
        cpu = self.hardware.cpu
        for h in out:
            name, loops = f"cpu of host {h.index}", 1 if self.hardware.embedded else processes
            self.cpus[h] = Tally() if cpu is None else HostCpu(cpu, name=name, loops=loops)
        if self.hardware.embedded:
            for server in self.servers:
                server.cpu = self.cpus[out[0]]
        return out

    async def client_cluster(self, host: Host, *, write_ack: str = "quorum") -> Cluster:
        """The cluster as the client host ``host`` opens it (a served client's defaults:
        quorum acknowledgment)."""
        if not self._rooted:
            await self.meta.ensure_root(clock.wall())
            self._rooted = True
        return Cluster(
            NOWHERE,
            self.config,
            self.meta,
            ModelNodes(self.servers, host, self.fabric),
            InlineExecutor(),
            InlineExecutor(),
            served=True,
            write_ack=write_ack,
        )


__all__ = ["NOWHERE", "Hardware", "ModelCluster"]
