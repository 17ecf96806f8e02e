"""Weighted fair queueing of a node's disk time between TrafficGroups.

A ``FairQueue`` lets at most ``depth`` requests at a time into one resource (a disk) and
orders the rest by *start-time fair queueing* (Goyal, Vin and Cheng, SIGCOMM'96):

- each request is charged its ``cost`` in device-seconds (``Costs``: a per-operation time
  plus its bytes over the device's bandwidth), divided by its group's weight;
- a request's start tag is the later of the queue's virtual time and the finish tag of its
  group's previous request; its group's finish tag moves on by its weighted cost;
- a free slot goes to the waiting request with the lowest start tag, and the virtual time
  becomes that tag. Each group's requests wait in their own line, first come first served,
  and only the head of a line is tagged, when a slot frees: a charge corrected meanwhile
  counts.

So two groups with work share the disk's time by weight, whatever their request sizes; a
group with no work is skipped, its share lent to the others (the queue never idles while a
request waits); and a group that was idle comes back at the current virtual time, with no
credit saved up. A request's size may be unknown until it runs (a whole-chunk read): it is
charged an estimate, corrected once the body reports its bytes.

Slots are not taken back: a gold request that arrives while bronze holds every slot waits
for the first to end, which bounds its delay by one bronze request's service time (a smaller
``depth`` tightens that bound and can cost throughput; ``bench qos`` measures both).

The queue uses nothing but the running loop, so the same code runs on a served node, in an
embedded cluster and on the projection's model servers under the virtual clock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tectonic_emu import clock
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.qos.groups import TrafficGroup
from tectonic_emu.qos.stats import GroupStats


@dataclass(frozen=True, slots=True)
class Costs:
    """What one request costs a disk, in device-seconds: ``*_op_s`` plus its bytes over
    ``*_bw`` (bytes/s)."""

    read_bw: float
    write_bw: float
    read_op_s: float
    write_op_s: float

    def of(self, nbytes: int, *, write: bool) -> float:
        if write:
            return self.write_op_s + nbytes / self.write_bw
        return self.read_op_s + nbytes / self.read_bw


#: This machine's disk (``../shared/MACHINE.md``): 1.3 GB/s written with fsync, 0.9 GB/s
#: read cold, 3.1k fsyncs/s, 38k random 4 KiB reads/s at depth 32.
LOCAL_DISK = Costs(read_bw=0.9e9, write_bw=1.3e9, read_op_s=1 / 38_000, write_op_s=1 / 3_100)


@dataclass(slots=True)
class Ticket:
    """One request's place in a ``FairQueue``. The body that holds it may set ``nbytes``
    once it knows the request's size (the charge is corrected when it leaves)."""

    group: TrafficGroup
    write: bool
    nbytes: int
    charged: float  # device-seconds charged on entry
    queued_at: float
    started_at: float = 0.0


@dataclass(slots=True, eq=False)
class _Waiter:
    floor: float  # the queue's virtual time when it arrived: its start tag is no lower
    seq: int
    ticket: Ticket
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass(slots=True)
class _Flow:
    """One group's requests in a queue: those waiting, first come first served, and the
    finish tag of its last one let in (its weighted charges so far)."""

    name: str
    weight: float
    finish: float = 0.0
    waiting: collections.deque[_Waiter] = field(default_factory=collections.deque)


class FairQueue:
    """See the module docstring. ``fair=False`` serves every group from one flow, first
    come first served, still counting each group's figures (a run without QoS)."""

    def __init__(self, depth: int, *, costs: Costs = LOCAL_DISK, fair: bool = True) -> None:
        if depth < 1:
            raise InvalidArgumentError(f"a fair queue's depth is at least 1, not {depth}")
        self.depth = depth
        self.costs = costs
        self.fair = fair
        self.busy = 0  # slots held
        self.vtime = 0.0
        self.stats: dict[str, GroupStats] = {}
        self._flows: dict[str, _Flow] = {}  # one per group (one in all without fairness)
        self._backlogged: dict[str, _Flow] = {}  # the flows with requests waiting
        self._mean_read: dict[str, float] = {}  # each group's recent whole-chunk read size
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(len(f.waiting) for f in self._backlogged.values())

    @contextlib.asynccontextmanager
    async def serving(
        self, group: TrafficGroup, nbytes: int | None, *, write: bool
    ) -> AsyncIterator[Ticket]:
        """Hold a slot for one request of ``group`` of ``nbytes`` (None: not known yet; the
        body sets ``ticket.nbytes``). Raises what the body raises; a cancelled wait leaves
        the queue as it was (a request is charged when it is let in)."""
        known = nbytes if nbytes is not None else int(self._mean_read.get(group.name, 0.0))
        charged = self.costs.of(known, write=write)
        ticket = Ticket(group, write, nbytes or 0, charged, clock.monotonic())
        await self._acquire(group, ticket)
        ticket.started_at = clock.monotonic()
        try:
            yield ticket
        finally:
            self._release()
            self._settle(ticket, nbytes is None)

    async def _acquire(self, group: TrafficGroup, ticket: Ticket) -> None:
        flow = self._flow(group)
        if self.busy < self.depth and not self._backlogged:
            self.busy += 1
            self._dispatch(flow, max(self.vtime, flow.finish), ticket)
            return
        waiter = _Waiter(self.vtime, next(self._seq), ticket)
        if not flow.waiting:
            self._backlogged[flow.name] = flow
        flow.waiting.append(waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._release()  # the slot came just as the wait was cancelled: pass it on
            elif waiter in flow.waiting:
                flow.waiting.remove(waiter)
                if not flow.waiting:
                    self._backlogged.pop(flow.name, None)
            raise

    def _flow(self, group: TrafficGroup) -> _Flow:
        name = group.name if self.fair else ""
        flow = self._flows.get(name)
        if flow is None:
            flow = self._flows[name] = _Flow(name, 1.0)
        if self.fair:
            flow.weight = group.weight  # (a group's share may change between requests)
        return flow

    def _dispatch(self, flow: _Flow, start: float, ticket: Ticket) -> None:
        self.vtime = max(self.vtime, start)
        flow.finish = start + ticket.charged / flow.weight

    def _release(self) -> None:
        """A slot is free: hand it to the head of the flow whose start tag is lowest (the
        tags are taken now, so a flow's charges corrected since it queued count)."""
        best: tuple[float, int, _Flow] | None = None
        for flow in list(self._backlogged.values()):
            while flow.waiting and flow.waiting[0].granted.done():  # cancelled, not yet gone
                flow.waiting.popleft()
            if not flow.waiting:
                del self._backlogged[flow.name]
                continue
            head = flow.waiting[0]
            key = (max(head.floor, flow.finish), head.seq, flow)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is None:
            self.busy -= 1
            return
        start, _, flow = best
        waiter = flow.waiting.popleft()
        if not flow.waiting:
            del self._backlogged[flow.name]
        self._dispatch(flow, start, waiter.ticket)
        waiter.granted.set_result(None)

    def _settle(self, ticket: Ticket, guessed: bool) -> None:
        group, now = ticket.group, clock.monotonic()
        cost = self.costs.of(ticket.nbytes, write=ticket.write)
        if guessed:
            flow = self._flow(group)
            flow.finish += (cost - ticket.charged) / flow.weight
            mean = self._mean_read.get(group.name, float(ticket.nbytes))
            self._mean_read[group.name] = 0.75 * mean + 0.25 * ticket.nbytes
        stats = self.stats.get(group.name)
        if stats is None:
            stats = self.stats[group.name] = GroupStats(group.klass)
        stats.ops += 1
        stats.bytes += ticket.nbytes
        stats.charged_s += cost
        stats.busy_s += now - ticket.started_at
        stats.wait.add(ticket.started_at - ticket.queued_at)
        stats.latency.add(now - ticket.queued_at)


__all__ = ["LOCAL_DISK", "Costs", "FairQueue", "Ticket"]
