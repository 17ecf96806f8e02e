"""Modelled resources: a rate that work shares, on the clock of the running loop.

A resource (a flash device, one direction of a NIC, a ToR uplink, a metadata shard, a
host's cores) serves *amounts* (bytes, operations, device-seconds) at ``rate`` per second.
``await resource.use(amount)`` returns once the amount has been served; ``begin(amount)``
starts the job and returns its future, so one transfer can hold several resources at once
without a task per resource. Two disciplines, one seam (``Resource``), one contract
(``tests/test_sim_resources.py``):

- ``SharedResource``, processor sharing: every job in service gets an equal share of the
  rate, as flows on a link or requests on a device's queue do. It is exact and costs
  O(log n) per job whatever the number in service: it keeps the service each job has had
  since the resource last fell idle (``_level``), so a job ends when the level reaches the
  level at its start plus its amount, and only the earliest end has a timer.
- ``QueueResource``, first come first served over ``servers`` parallel servers (a device
  with a queue depth, or a single line, as netem's ``Line`` is): a job waits for a free
  server, then holds it for ``amount / rate``.

Both are work-conserving: jobs submitted together end by the same last moment, and neither
lets anything through faster than its capacity. They differ in who waits. Which one predicts
real runs better is for ``bench sim`` to measure (``../shared/SIMULATION.md``, section 2).

Each resource counts what it served, so a report can say which one bounded a run
(``utilisation``). Use them under ``clock.VirtualLoop``; on a real loop they work too, with
real timers.
"""

from __future__ import annotations

import abc
import asyncio
import heapq
import itertools
import math

# Ends within this share of the current level count as reached (float rounding only).
_EPS = 1e-12


class Resource(abc.ABC):
    """Something that serves amounts at ``rate`` per second."""

    def __init__(self, rate: float, *, name: str = "") -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"a resource's rate must be positive and finite, not {rate}")
        self.rate = float(rate)
        self.name = name
        self.served = 0.0  # amounts of finished jobs, in total
        self.worth_done = 0.0  # the worth (``begin(worth=)``) of finished jobs
        self.jobs = 0  # jobs finished

    @abc.abstractmethod
    def begin(self, amount: float, *, worth: float | None = None) -> asyncio.Future[None]:
        """Start serving ``amount``; the future is done once it has been served. Cancelling
        the future withdraws the job. ``worth``: what the whole job counts for in
        ``worth_so_far`` (default: its amount), such as a disk write's bytes where its
        amount is device-seconds. Raises ValueError for a negative or non-finite amount."""

    async def use(self, amount: float) -> None:
        """Wait until ``amount`` has been served."""
        await self.begin(amount)

    @property
    def capacity(self) -> float:
        """Amounts per second when every server is busy."""
        return self.rate

    def worth_so_far(self) -> float:
        """The worth of what was served until now. This counts finished jobs; a
        ``SharedResource`` adds jobs in service as far as they got."""
        return self.worth_done

    def mark(self) -> float:
        """A mark to take just after ``begin``, for ``served_since``."""
        return 0.0

    def served_since(self, mark: float, amount: float) -> float:
        """How much of a job of ``amount`` begun at ``mark`` has been served so far, while it
        is in service (here: nothing until it is done; a ``SharedResource`` knows)."""
        return 0.0

    def utilisation(self, elapsed: float) -> float:
        """The share of its capacity over ``elapsed`` seconds that finished jobs used."""
        return self.served / (self.capacity * elapsed) if elapsed > 0 else 0.0

    def _finished(self, done: asyncio.Future[None], amount: float, worth: float) -> None:
        self.served += amount
        self.worth_done += worth
        self.jobs += 1
        if not done.done():
            done.set_result(None)

    @staticmethod
    def _check(amount: float) -> float:
        if not (math.isfinite(amount) and amount >= 0):
            raise ValueError(f"an amount must be finite and not negative, not {amount}")
        return float(amount)

    def _done_now(
        self, loop: asyncio.AbstractEventLoop, worth: float | None
    ) -> asyncio.Future[None]:
        self.worth_done += worth or 0.0
        done = loop.create_future()
        done.set_result(None)
        return done


# end level, order, future, amount, worth per unit of amount
_Job = tuple[float, int, asyncio.Future[None], float, float]


class SharedResource(Resource):
    """Processor sharing: the jobs in service split ``rate`` equally (module docstring)."""

    def __init__(self, rate: float, *, name: str = "") -> None:
        super().__init__(rate, name=name)
        self._level = 0.0  # service each job in service has had, since the last idle moment
        self._at = 0.0  # loop time of _level
        # For worth_so_far: the sum over jobs in service of their worth per unit of amount,
        # and of that times the level at which each began.
        self._worth_rate = self._worth_starts = 0.0
        self._ends: list[_Job] = []  # a heap: the earliest end first
        self._order = itertools.count()  # equal ends finish in the order they came
        self._timer: asyncio.TimerHandle | None = None

    @property
    def in_service(self) -> int:
        return len(self._ends)

    def _level_now(self) -> float:
        level = self._level
        if self._ends:
            level += (asyncio.get_running_loop().time() - self._at) * self.rate / len(self._ends)
        return level

    def worth_so_far(self) -> float:
        return self.worth_done + self._worth_rate * self._level_now() - self._worth_starts

    def mark(self) -> float:
        return self._level_now()  # just after begin: the level at which the job began

    def served_since(self, mark: float, amount: float) -> float:
        return min(amount, max(0.0, self._level_now() - mark))

    def begin(self, amount: float, *, worth: float | None = None) -> asyncio.Future[None]:
        amount = self._check(amount)
        loop = asyncio.get_running_loop()
        if amount == 0:
            return self._done_now(loop, worth)
        self._advance(loop.time())
        done: asyncio.Future[None] = loop.create_future()
        per = 1.0 if worth is None else worth / amount
        job = (self._level + amount, next(self._order), done, amount, per)
        heapq.heappush(self._ends, job)
        self._worth_rate += per
        self._worth_starts += per * self._level
        done.add_done_callback(lambda f: self._withdraw(job) if f.cancelled() else None)
        if self._timer is None or self._ends[0] is job:
            self._arm(loop)
        # Else the timer stays: a job that does not end first only delays the others' ends,
        # so the timer fires early and re-arms then (one wake-up for a burst of arrivals,
        # not a new timer each).
        return done

    def _advance(self, now: float) -> None:
        if self._ends:
            self._level += (now - self._at) * self.rate / len(self._ends)
        self._at = now

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """One timer, for the earliest end."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._ends:
            left = (self._ends[0][0] - self._level) * len(self._ends) / self.rate
            self._timer = loop.call_at(self._at + max(0.0, left), self._finish, loop)

    def _finish(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._advance(loop.time())
        if not self._ends:
            return
        left = (self._ends[0][0] - self._level) * len(self._ends) / self.rate
        if left > _EPS * max(1.0, loop.time()):  # early: jobs came since it was set
            self._arm(loop)
            return
        self._level = max(self._level, self._ends[0][0])  # reached, up to rounding
        reached = self._level * (1 + _EPS)
        while self._ends and self._ends[0][0] <= reached:
            end, _, done, amount, per = heapq.heappop(self._ends)
            self._gone(end - amount, per)
            self._finished(done, amount, per * amount)
        if not self._ends:
            self._idle()
        self._arm(loop)

    def _withdraw(self, job: _Job) -> None:
        if job in self._ends:
            loop = asyncio.get_running_loop()
            self._advance(loop.time())
            self._ends.remove(job)
            heapq.heapify(self._ends)
            start, per = job[0] - job[3], job[4]
            self._gone(start, per)
            self.served += self._level - start  # what it had is served all the same
            self.worth_done += per * (self._level - start)
            if not self._ends:
                self._idle()
            self._arm(loop)

    def _gone(self, start: float, per: float) -> None:
        """A job that began at level ``start`` left service."""
        self._worth_rate -= per
        self._worth_starts -= per * start

    def _idle(self) -> None:
        """Nothing in service: fresh sums for the next busy period keep the floats small."""
        self._level = self._worth_rate = self._worth_starts = 0.0


class QueueResource(Resource):
    """First come, first served on ``servers`` parallel servers, each at ``rate``. A job's
    server time is booked when it arrives, so a withdrawn job's time stays booked."""

    def __init__(self, rate: float, *, servers: int = 1, name: str = "") -> None:
        super().__init__(rate, name=name)
        if servers < 1:
            raise ValueError(f"a queue needs at least one server, not {servers}")
        self.servers = servers
        self._free = [0.0] * servers  # loop time when each server is next free (a heap)

    @property
    def capacity(self) -> float:
        return self.rate * self.servers

    def begin(self, amount: float, *, worth: float | None = None) -> asyncio.Future[None]:
        amount = self._check(amount)
        loop = asyncio.get_running_loop()
        if amount == 0:
            return self._done_now(loop, worth)
        end = max(loop.time(), self._free[0]) + amount / self.rate
        heapq.heapreplace(self._free, end)
        done: asyncio.Future[None] = loop.create_future()
        loop.call_at(end, self._finished, done, amount, amount if worth is None else worth)
        return done


async def use_all(jobs: list[asyncio.Future[None]]) -> None:
    """Wait for jobs begun on several resources at once (a transfer over its hops); if the
    wait is cancelled, every job is withdrawn."""
    try:
        for job in jobs:
            await job
    except BaseException:
        for job in jobs:
            job.cancel()
        raise


__all__ = ["QueueResource", "Resource", "SharedResource", "use_all"]
