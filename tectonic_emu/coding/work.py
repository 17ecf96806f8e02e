"""CPU work counted where the data path does it, so that a projection can charge it.

The functions that spend CPU per byte (CRC32C, Reed-Solomon encode and decode, the
checkpoint digests, the wire's MACs, copies of payloads into fresh memory and into memory
in use, such as a writer's block buffers) call ``count(kind, nbytes)``; node calls and
metadata hops call ``calls``, and a block written or a rank's state staged calls
``python`` (the client's Python around it on the event loop). Nothing is counted unless
a ``Tally`` is current (``Tally.current``): in a real run ``count`` is one ContextVar read.
A projection makes each client host's ``sim.cpu.HostCpu`` (a ``Tally``) current in that
host's tasks. The work is charged when the job that did it settles (``settle``): at the
end of each ``offload`` and of each executor job on a virtual loop (``clock.VirtualLoop``),
which is where the real code hands that work to a thread, and where a model node's frame
or a staging copy ends.

Where the work is done matters as much as how much: the event loop is one thread, and work
done on it (a copy made on the loop, a checksum too small to hand off) holds up every task
of the process, while work handed to a thread spreads over the cores. A tally counts work
as the loop's unless it is counted ``on_thread()``: inside an executor job of a virtual
loop, an ``offload`` a real pool would take, or a model node's frame (``RemoteNode`` MACs
and checks frames on threads).

Counting happens on real bytes and on ``Synthetic`` ones alike, so a tally of a projected
run and of a real run of the same calls agree (``tests/test_sim_cpu.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

#: The kinds of work counted, each in bytes.
#: ``copy`` is into fresh memory (values kept, new buffers); ``copy-warm`` into memory in
#: use (a writer's recycled block buffers), which costs no new pages; ``new-pages``, the
#: first touch of a block buffer a writer's recycler has just allocated: the kernel faults
#: its pages in and zeroes them as the first copy reaches each (huge pages where it gives
#: them). ``crc32c-pieces``: a storage node's checksum of each 8 KiB piece of a chunk it
#: writes (``chunkstore/_format.py``), a native call each, slower per byte than ``crc32c``.
KINDS = (
    "crc32c",
    "crc32c-pieces",
    "rs-encode",
    "rs-decode",
    "blake2b",
    "wire",
    "copy",
    "copy-warm",
    "new-pages",
)

#: The events whose Python on the event loop is counted, one at a time (``python``): a
#: block a writer writes (``BlockPipeline``), a rank's state staged for a checkpoint
#: (``clients/ckpt_save.py``). Their node calls and metadata hops are counted apart
#: (``calls``); this is the rest of the client's Python around them.
EVENTS = ("block", "rank-save")

_CURRENT: ContextVar[Tally | None] = ContextVar("tectonic_cpu_tally", default=None)


class Tally:
    """Bytes of each kind of work done (``total``). This class only counts; a subclass
    charges the work too (``sim.cpu.HostCpu``): ``add`` puts it in ``owed`` seconds, and
    ``claim`` charges them."""

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self.owed = 0.0  # seconds of work not charged yet
        self.owed_loop = 0.0  # the part of ``owed`` done on the event loop
        self.threads = 0  # > 0 while work is counted on a thread (``on_thread``)
        self.calls = 0  # node calls made (``add_calls``)
        self.events: dict[str, int] = {}  # events of ``EVENTS`` (``add_event``)
        self.processes = 1  # client processes whose work this counts (a host's ranks)

    @staticmethod
    def current() -> Tally | None:
        return _CURRENT.get()

    @contextmanager
    def active(self) -> Iterator[Tally]:
        """Count the work of this context (and of the tasks it starts) here."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def add(self, kind: str, nbytes: int) -> None:
        self.total[kind] = self.total.get(kind, 0) + nbytes

    def add_calls(self, n: int, *, replies: bool = False) -> None:
        """``n`` node calls made, or (``replies``) their replies taken up: their Python on
        the event loop, which a subclass may charge (``sim.cpu.CpuModel.call_s``)."""
        if not replies:
            self.calls += n

    def add_event(self, kind: str) -> None:
        """One event of ``kind`` (``EVENTS``): the client's Python around it on the event
        loop, which a subclass may charge (``sim.cpu.CpuModel.python_s``)."""
        self.events[kind] = self.events.get(kind, 0) + 1

    @contextmanager
    def on_thread(self) -> Iterator[None]:
        """Work counted meanwhile is done on a worker thread, not on the event loop."""
        self.threads += 1
        try:
            yield
        finally:
            self.threads -= 1

    def due(self) -> bool:
        """Whether enough is owed to be worth charging now (``SETTLE_FROM``)."""
        return self.owed >= SETTLE_FROM

    def claim(self) -> Awaitable[None]:
        """Take what is owed now, and return what waits until it has been charged (here,
        nothing). Taken at once, not when awaited, so that work done meanwhile by other
        jobs of the host is theirs to wait for."""
        self.owed = self.owed_loop = 0.0
        return _nothing()

    async def settle(self) -> None:
        """Charge what is owed, if it is due."""
        if self.due():
            await self.claim()


async def _nothing() -> None:
    pass


#: Less work than this (seconds) stays owed until more is done: a timer per small frame
#: would cost more than the whole projection of its bytes. It is charged later, not lost.
SETTLE_FROM = 1e-6


def count(kind: str, nbytes: int) -> None:
    """``nbytes`` of ``kind`` (one of ``KINDS``) done now, in the current tally if any."""
    tally = _CURRENT.get()
    if tally is not None:
        tally.add(kind, nbytes)


def calls(n: int, *, replies: bool = False) -> None:
    """``n`` node calls made now, or (``replies``) their replies taken up, in the current
    tally if any (``Tally.add_calls``)."""
    tally = _CURRENT.get()
    if tally is not None:
        tally.add_calls(n, replies=replies)


def python(kind: str) -> None:
    """One event of ``kind`` (``EVENTS``) now, in the current tally if any
    (``Tally.add_event``)."""
    tally = _CURRENT.get()
    if tally is not None:
        tally.add_event(kind)


@contextmanager
def on_thread() -> Iterator[None]:
    """The current tally's (if any) ``Tally.on_thread``."""
    tally = _CURRENT.get()
    if tally is None:
        yield
    else:
        with tally.on_thread():
            yield


async def settle() -> None:
    """Charge the current tally's owed work, if a tally is current and it is due."""
    tally = _CURRENT.get()
    if tally is not None:
        await tally.settle()


__all__ = [
    "EVENTS",
    "KINDS",
    "SETTLE_FROM",
    "Tally",
    "calls",
    "count",
    "on_thread",
    "python",
    "settle",
]
