"""Group flushes: writes counted in order, and one flush at a time that makes durable every
write counted before it began. A caller that needs its write durable waits for a flush that
began after the write was counted, starting one if none runs, so concurrent callers share
flushes: the metadata stores' group commit (``metadata/_common.py``) and a storage node's
per-disk sync of chunks written unsynced (``chunkstore/_local.py``).

A flush runs where ``flush()`` puts it (SQLite's: an fsync on a thread of its own). A store
may also give the same flush as a plain call, ``flush_here``, which a caller runs on its own
thread, the event loop's, when it is alone: no flush in flight, nobody waiting for the store
(``alone()``), nobody committing in the one turn of the loop it yields first, and the last
flush took under ``HERE_BELOW`` seconds. Why: a thread's round trip costs two wake-ups
(100-150 us of wall time here, on top of an fsync of SQLite's log of 85-120 us), and a lone
committer gains nothing from the thread, as nobody shares its flush; one create after
another on SQLite went from 1,362 to 1,868 a second (docs/performance.md). Yielding first
keeps the sharing: without it, a task whose commits never suspend ran all of its work
before any other rank's, each commit flushing alone (16 ranks' creates fell from 2,261 to
2,024 a second). A slow flush (a disk busy with a checkpoint's chunks) would hold the whole
loop up that long, so it sends the next ones back to the thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

#: A flush runs on the caller's thread only while the last one took less (seconds).
HERE_BELOW = 0.002


class GroupCommit:
    """Commit numbers and shared flushes (module docstring). ``flush()`` makes every commit
    (write) counted before it was called durable, or raises OSError; ``flush_here()`` does
    the same on the caller's thread, where ``alone()`` allows it."""

    def __init__(
        self,
        flush: Callable[[], Awaitable[None]],
        *,
        flush_here: Callable[[], None] | None = None,
        alone: Callable[[], bool] = lambda: False,
    ) -> None:
        self._flush = flush
        self._flush_here = flush_here
        self._alone = alone
        self.last_flush = 0.0  # seconds the last flush took (wall time, real)
        self.flushed_here = 0  # flushes run on the caller's thread
        self.commits = 0  # commits counted so far
        self.synced = 0  # commits a finished flush has covered
        self._flight: tuple[asyncio.Future[None], int] | None = None

    def count(self) -> int:
        """Count one more commit; its number."""
        self.commits += 1
        return self.commits

    async def durable(self, seq: int) -> None:
        """Return once commit ``seq`` is durable. Raises the flush's OSError; the next
        call starts another flush."""
        while self.synced < seq:
            if self._flight is None and self._may_flush_here():
                before = self.commits
                await asyncio.sleep(0)  # others ready to commit go first, to share a flush
                if self.synced >= seq:
                    return  # one of them flushed here
                if self._flight is None and self.commits == before and self._alone():
                    self._flush_here_now()
                    continue
            if self._flight is None:
                started: asyncio.Future[None] = asyncio.ensure_future(self._timed())
                self._flight = (started, self.commits)  # it covers every commit counted
            flight, covers = self._flight
            try:
                await asyncio.shield(flight)
            finally:
                if flight.done() and self._flight is not None and self._flight[0] is flight:
                    self._flight = None
                    if not flight.cancelled() and flight.exception() is None:
                        self.synced = max(self.synced, covers)

    def _flush_here_now(self) -> None:
        assert self._flush_here is not None
        covers, t0 = self.commits, time.perf_counter()
        try:
            self._flush_here()
        finally:
            self.last_flush = time.perf_counter() - t0
        self.flushed_here += 1
        self.synced = covers

    def _may_flush_here(self) -> bool:
        return self._flush_here is not None and self.last_flush < HERE_BELOW and self._alone()

    async def _timed(self) -> None:
        t0 = time.perf_counter()
        try:
            await self._flush()
        finally:
            self.last_flush = time.perf_counter() - t0

    async def sync(self) -> None:
        """Return once every commit counted so far is durable."""
        if self.synced < self.commits:
            await self.durable(self.commits)

    async def settle(self) -> None:
        """Wait for the flush in flight, if any, to end (its outcome is its waiters')."""
        if self._flight is not None:
            await asyncio.wait([self._flight[0]])

    def forget(self) -> None:
        """Drop the flush in flight (its event loop is gone)."""
        self._flight = None


__all__ = ["HERE_BELOW", "GroupCommit"]
