"""Group flushes: writes counted in order, and one flush at a time that makes durable every
write counted before it began. A caller that needs its write durable waits for a flush that
began after the write was counted, starting one if none runs, so concurrent callers share
flushes: the metadata stores' group commit (``metadata/_common.py``) and a storage node's
per-disk sync of chunks written unsynced (``chunkstore/_local.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class GroupCommit:
    """Commit numbers and shared flushes (module docstring). ``flush()`` makes every commit
    (write) counted before it was called durable, or raises OSError."""

    def __init__(self, flush: Callable[[], Awaitable[None]]) -> None:
        self._flush = flush
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
            if self._flight is None:
                started: asyncio.Future[None] = asyncio.ensure_future(self._flush())
                self._flight = (started, self.commits)  # it covers every commit counted
            flight, covers = self._flight
            try:
                await asyncio.shield(flight)
            finally:
                if flight.done() and self._flight is not None and self._flight[0] is flight:
                    self._flight = None
                    if not flight.cancelled() and flight.exception() is None:
                        self.synced = max(self.synced, covers)

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


__all__ = ["GroupCommit"]
