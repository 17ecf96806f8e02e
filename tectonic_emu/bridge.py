"""The async client on one event-loop thread, for synchronous callers.

FUSE runs its callbacks on a pool of threads, and torch's DCP calls its storage layer
synchronously; the client library is asyncio. ``Bridge`` owns one event loop in a thread of
its own, opens the cluster there (embedded or served, as ``Cluster.open`` decides) and runs
each call as a coroutine on it: callers block on the result, the loop overlaps their I/O.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tectonic_emu.client import Client
from tectonic_emu.cluster import Cluster
from tectonic_emu.metadata import offloop

T = TypeVar("T")


class Bridge:
    """The cluster at ``cluster_dir``, open on an event loop in the thread ``name``. Raises
    what opening it raised."""

    def __init__(self, cluster_dir: str | os.PathLike[str], *, name: str = "tectonic-loop") -> None:
        self.cluster_dir = cluster_dir
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.cluster: Cluster | None = None
        self._client: Client | None = None
        self._here = threading.Lock()  # one read on a caller's thread at a time (read)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._client is None:  # opening failed
            self._thread.join()
            assert self._error is not None
            raise self._error

    @property
    def client(self) -> Client:
        assert self._client is not None, "set before __init__ returns"
        return self._client

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as e:  # opening or closing the cluster failed
            self._error = e
        finally:
            self._ready.set()
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with Cluster.open(self.cluster_dir) as cluster:
            self.cluster = cluster
            self._client = cluster.client()
            self._ready.set()
            await self._stop.wait()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (or exception). Interrupted
        (KeyboardInterrupt), the coroutine is cancelled. Never from a coroutine running on
        the loop itself: it would wait for itself."""
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def read(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``call(make())`` for a read of metadata only (stat, a listing, a symlink's target):
        run on the calling thread where the store can answer it at once, without the hop
        into the loop and back (``metadata.offloop``), else on the loop. Never from the
        loop's thread, and never for anything that writes or reaches a node."""
        if self._here.acquire(blocking=False):
            try:
                return offloop.run_here(make)
            except offloop.WouldWait:
                pass
            finally:
                self._here.release()
        return self.call(make())

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; its future can be waited for, or cancelled."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """Close the cluster (waiting for straggling chunk writes) and end the thread. Raises
        what closing raised."""
        if self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()
            if self._error is not None:
                raise self._error


__all__ = ["Bridge"]
