"""A modelled network: hosts with NICs, racks with ToR uplinks, in virtual time.

Every host has a NIC with a resource for each direction (``egress``, ``ingress``) at
``nic_gbps``. Hosts sit in racks. When ``oversubscription`` is above 1, each rack also has
an uplink and a downlink at its hosts' total NIC bandwidth divided by it. A message from
host A to host B holds A's egress, B's ingress and, between racks, A's uplink and B's
downlink, all at once. It is done when the slowest of them has served its bytes, and
arrives half a round trip later. The spine is taken as non-blocking, as in a Clos fabric
built for it, unless ``core_gbps`` is given: then every message between racks also holds
one ``core`` resource of that rate, the fabric's aggregate throughput between racks, reads
and writes together. That is the storage fabric that the Llama 3 paper says checkpoint
bursts "saturate for short durations"; its rate is not published, so a preset that sets it
fits it (docs/simulate.md, *Presets*).

``received_so_far(hosts)`` counts what those hosts received, each message still in flight
as far as its slowest hop has served it (``Resource.served_since``): the rate into a set of
hosts as the network carries it, where counting at message ends would bunch messages that
share a hop and end together.

Messages of at most ``SMALL_MESSAGE`` bytes (requests without payload, replies, reservations)
take only their half round trip: their share of a hop under processor sharing is their size
times the messages on it over its rate, 64 B x 1,000 / 12.5 GB/s = 5 us, far below any round
trip modelled, and leaving them out halves the events per chunk.

Each hop shares its rate among the messages on it (``resources.SharedResource``, or the
discipline given). A message takes its share on every hop independently, not the max-min
fair rate of the whole path: that costs O(hops x log n) per message instead of a global
recomputation at every start and end, the price SimGrid-style max-min sharing pays. Where a
message's bottleneck is one hop, as in a checkpoint burst into servers' NICs or through
oversubscribed uplinks, the two agree. netem (``chunkstore/netem.py``) paces real sockets
with the same model of one host's NIC.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from tectonic_emu.sim.resources import Resource, SharedResource, use_all


@dataclass(frozen=True, slots=True)
class FabricModel:
    """``nic_gbps`` each way per host; ``rtt`` seconds host to host; ``oversubscription``
    of each rack's uplink (1: non-blocking); ``core_gbps`` between racks in aggregate
    (None: non-blocking)."""

    nic_gbps: float
    rtt: float = 0.0
    oversubscription: float = 1.0
    source: str = ""
    core_gbps: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.nic_gbps) and self.nic_gbps > 0):
            raise ValueError(f"NIC bandwidth must be positive, not {self.nic_gbps} Gb/s")
        if not (math.isfinite(self.rtt) and self.rtt >= 0):
            raise ValueError(f"round-trip time must be 0 or more, not {self.rtt} s")
        if not (math.isfinite(self.oversubscription) and self.oversubscription >= 1):
            raise ValueError(f"oversubscription must be 1 or more, not {self.oversubscription}")
        if self.core_gbps is not None and not (
            math.isfinite(self.core_gbps) and self.core_gbps > 0
        ):
            raise ValueError(f"the core's bandwidth must be positive, not {self.core_gbps} Gb/s")

    @property
    def nic_rate(self) -> float:
        """Bytes per second each way."""
        return self.nic_gbps * 1e9 / 8

    @property
    def core_rate(self) -> float | None:
        """Bytes per second through the core between racks (None: non-blocking)."""
        return None if self.core_gbps is None else self.core_gbps * 1e9 / 8


@dataclass(eq=False)
class Rack:
    index: int
    uplink: Resource | None  # None: non-blocking
    downlink: Resource | None
    hosts: list[Host] = field(default_factory=list)


@dataclass(eq=False)
class Host:
    index: int
    rack: Rack
    egress: Resource
    ingress: Resource
    sent: int = 0
    received: int = 0


SMALL_MESSAGE = 4096  # bytes: at most this, a message costs its latency only


class Fabric:
    """Hosts and racks (module docstring). Add racks with ``add_rack``."""

    def __init__(
        self, model: FabricModel, *, discipline: Callable[..., Resource] = SharedResource
    ) -> None:
        self.model = model
        self.discipline = discipline
        self.racks: list[Rack] = []
        self.hosts: list[Host] = []
        rate = model.core_rate
        self.core: Resource | None = None if rate is None else discipline(rate, name="core")
        self._flows: dict[int, _Flow] = {}  # large messages in flight, by a number of their own
        self._numbers = itertools.count()

    def add_rack(self, hosts: int) -> list[Host]:
        """A rack of ``hosts`` new hosts; returns them."""
        if hosts < 1:
            raise ValueError(f"a rack needs at least one host, not {hosts}")
        m, make, k = self.model, self.discipline, len(self.racks)
        up = down = None
        if m.oversubscription > 1:
            rate = hosts * m.nic_rate / m.oversubscription
            up, down = make(rate, name=f"rack{k}-up"), make(rate, name=f"rack{k}-down")
        rack = Rack(k, up, down)
        self.racks.append(rack)
        for _ in range(hosts):
            n = len(self.hosts)
            host = Host(
                n, rack, make(m.nic_rate, name=f"host{n}-out"), make(m.nic_rate, name=f"host{n}-in")
            )
            rack.hosts.append(host)
            self.hosts.append(host)
        return list(rack.hosts)

    def path(self, src: Host, dst: Host) -> list[Resource]:
        """The hops a message from ``src`` to ``dst`` holds (none within a host)."""
        if src is dst:
            return []
        hops = [src.egress, dst.ingress]
        if src.rack is not dst.rack:
            for link in (src.rack.uplink, dst.rack.downlink, self.core):
                if link is not None:
                    hops.append(link)
        return hops

    async def send(self, src: Host, dst: Host, nbytes: int) -> None:
        """Carry ``nbytes`` from ``src`` to ``dst``: every hop at once, then half the round
        trip. Within one host it is free."""
        if src is dst:
            return
        if nbytes > SMALL_MESSAGE:
            legs = []
            for hop in self.path(src, dst):
                job = hop.begin(nbytes)
                legs.append((hop, hop.mark(), job))  # the mark is taken just after begin
            number = next(self._numbers)
            self._flows[number] = _Flow(dst, nbytes, legs)
            try:
                await use_all([job for _, _, job in legs])
            finally:
                del self._flows[number]
        src.sent += nbytes
        dst.received += nbytes
        if self.model.rtt:
            await asyncio.sleep(self.model.rtt / 2)

    def received_so_far(self, hosts: AbstractSet[Host]) -> float:
        """Bytes ``hosts`` received until now, messages in flight as far as they got."""
        done = sum(h.received for h in hosts)
        return done + sum(f.served() for f in self._flows.values() if f.dst in hosts)


@dataclass(slots=True, eq=False)
class _Flow:
    """A message in flight: for each hop, the hop, its mark when the job began, and the job."""

    dst: Host
    nbytes: int
    legs: list[tuple[Resource, float, asyncio.Future[None]]]

    def served(self) -> float:
        """As far as its slowest hop got."""
        return min(
            self.nbytes if job.done() else hop.served_since(mark, self.nbytes)
            for hop, mark, job in self.legs
        )


__all__ = ["SMALL_MESSAGE", "Fabric", "FabricModel", "Host", "Rack"]
