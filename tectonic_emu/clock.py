"""Time as the code sees it: the clock of the running event loop.

One seam, two backends (``Clock``): ``RealClock``, the machine's clocks, and
``VirtualClock``, whose time moves only when the loop has nothing to run. Code that decides
or reports by time asks ``monotonic()`` (durations, deadlines) or ``wall()`` (timestamps
stored in metadata) here, never ``time`` directly, and waits with ``asyncio.sleep`` and the
loop's timers. Under ``VirtualLoop`` all of it then runs in virtual time: a one-hour timeout
expires at once, and the same program gives the same timeline.

``VirtualLoop`` is an ordinary selector event loop whose ``time()`` is its ``VirtualClock``.
When nothing is ready and no work is out on a thread, it jumps the clock to the next timer
instead of sleeping. While work runs on a thread (``run_in_executor``, ``asyncio.to_thread``),
the clock stands still and the loop waits for it in real time, so work outside the loop takes
no virtual time; what it should cost is charged by the models that stand in for devices and
for a host's CPU (a job's counted work, ``coding/work.py``, before its result is seen).
Its default executor is ``InlineExecutor`` (offload.py), which runs the work at once on the
loop's thread, so thread timing cannot reorder events. Real I/O (sockets) still works, but
its time is real and a run that waits on it is not deterministic.

Without a running loop (worker threads, synchronous set-up) both functions read the
machine's clocks.
"""

from __future__ import annotations

import abc
import asyncio
import selectors
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from tectonic_emu.coding import work
from tectonic_emu.offload import InlineExecutor

T = TypeVar("T")

#: The wall time at which a virtual clock starts unless told otherwise: 2026-01-01 UTC, so
#: that timestamps in a virtual run are plausible and the same in every run.
VIRTUAL_EPOCH = 1_767_225_600.0


class Clock(abc.ABC):
    """A source of time. ``monotonic`` never goes back; ``wall`` is seconds since the epoch."""

    #: Whether time moves only when the loop is idle (a projection), not by itself.
    virtual: bool = False

    @abc.abstractmethod
    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never decreasing."""

    @abc.abstractmethod
    def wall(self) -> float:
        """Seconds since the Unix epoch."""


class RealClock(Clock):
    """The machine's clocks: ``time.monotonic`` (asyncio's default loop time) and ``time.time``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class VirtualClock(Clock):
    """A clock that moves only by ``advance``: its ``wall`` is ``epoch`` plus its time."""

    virtual = True

    def __init__(self, *, epoch: float = VIRTUAL_EPOCH) -> None:
        self.now = 0.0
        self.epoch = epoch

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.epoch + self.now

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:  # also refuses NaN
            raise ValueError(f"a clock cannot go back or by NaN: {seconds}")
        self.now += seconds


REAL = RealClock()


def current() -> Clock:
    """The running loop's clock (``VirtualLoop.clock``), else the real one."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return REAL
    clock = getattr(loop, "clock", None)
    return clock if isinstance(clock, Clock) else REAL


def monotonic() -> float:
    """Seconds on the running loop's clock (``loop.time()``); ``time.monotonic`` off a loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def wall() -> float:
    """Seconds since the epoch on the running loop's clock."""
    return current().wall()


class _VirtualSelector(selectors.DefaultSelector):
    """The loop's selector: polls without blocking, and where the loop would sleep until its
    next timer, advances the virtual clock by that long instead."""

    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if self._loop.outside or timeout is None:
            # Work is out on a thread, or nothing is scheduled at all: wait for the world in
            # real time (a real loop would hang just the same with nothing to wait for).
            return super().select(timeout)
        self._loop.clock.advance(max(0.0, timeout))
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on a ``VirtualClock`` (see the module docstring)."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        self.outside = 0  # executor jobs not finished yet
        super().__init__(_VirtualSelector(self))
        self.set_default_executor(InlineExecutor())

    def time(self) -> float:
        return self.clock.now

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, _on_thread, func, *args)
        self.outside += 1
        future.add_done_callback(self._back)
        tally = work.Tally.current()
        if tally is None or not tally.due():
            return future
        return self.create_task(_settled(tally.claim(), future))  # CPU charged: coding/work.py

    def _back(self, _future: asyncio.Future[Any] | Future[Any]) -> None:
        self.outside -= 1


def _on_thread(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)``, its work counted as a worker thread's (coding/work.py)."""
    with work.on_thread():
        return func(*args)


async def _settled(charged: Awaitable[None], job: asyncio.Future[T]) -> T:
    """``job``'s result once the work it did (on an inline executor, done already) has been
    ``charged``."""
    await charged
    return await job


def run_virtual(main: Coroutine[Any, Any, T], *, clock: VirtualClock | None = None) -> T:
    """``asyncio.run(main)`` on a ``VirtualLoop``."""
    with asyncio.Runner(loop_factory=lambda: VirtualLoop(clock)) as runner:
        return runner.run(main)


__all__ = [
    "REAL",
    "VIRTUAL_EPOCH",
    "Clock",
    "RealClock",
    "VirtualClock",
    "VirtualLoop",
    "current",
    "monotonic",
    "run_virtual",
    "wall",
]
