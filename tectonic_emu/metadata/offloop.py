"""Metadata reads on the calling thread, off the event loop's: a FUSE stat without a hop.

The client is asyncio, on one event loop; the FUSE mount's callbacks run on libfuse's
threads and reach the client through ``Bridge.call``, a hop into the loop and back: two
wake-ups, about 60-110 us here, where a stat on the loop costs about 40. A ``stat`` through
the mount makes two such calls when the kernel's cache has run out (it looks up the
directory, then the file), so hops were most of its time.

``run_here(make)`` runs the coroutine ``make()`` to its end on the calling thread, without
an event loop, as long as it never suspends. While it runs, ``Metadata.view()`` gives the
store's *thread view* (``KVStore.thread_view``): reads on a connection of the calling
thread's that answer at once (SQLite), or reads of memory checked for a concurrent
transaction (``MemoryKV``). Anything that would wait instead raises ``WouldWait`` (a store
without thread views, a busy file, a transaction in the way), and so does a coroutine that
suspends (it is closed first, its ``finally`` blocks run): the caller then runs it on the
loop as before (``Bridge.read``). Only reads may run here: a transaction, or anything else
that takes a store's lock or awaits the loop, raises ``WouldWait`` or suspends, and is run
on the loop.

What a read here sees is what a view on the loop would see: the last commit (a transaction
of the loop's is visible to both once committed, and to neither before).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

_T = TypeVar("_T")

_HERE: ContextVar[bool] = ContextVar("tectonic_metadata_off_loop", default=False)


class WouldWait(Exception):
    """A read off the loop could not be answered at once: run it on the loop instead."""


def here() -> bool:
    """True inside ``run_here``: metadata views must be thread views."""
    return _HERE.get()


def refuse_here() -> None:
    """Raise ``WouldWait`` inside ``run_here``: for what only the loop may run (a store's
    lock, a transaction, a view of the loop's own connections)."""
    if _HERE.get():
        raise WouldWait


def run_here(make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """``make()`` run to its end on this thread (module docstring): its result, or what it
    raised; ``WouldWait`` if it would suspend, or a store could not answer at once."""
    token = _HERE.set(True)
    try:
        coro = make()
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        coro.close()  # it awaited something: unwind it here, and let the loop run it
        raise WouldWait
    finally:
        _HERE.reset(token)


__all__ = ["WouldWait", "here", "refuse_here", "run_here"]
