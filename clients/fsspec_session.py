"""The cluster behind a ``TectonicFileSystem``: ``Session`` opens it on one event loop on
first use and keeps it open until ``close``; ``close_session`` is the filesystem's finalizer.
A forked child forgets its parent's session and opens the cluster itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from contextlib import AsyncExitStack

from tectonic_emu import Client, Cluster
from tectonic_emu.qos.groups import TrafficGroup

CLOSE_TIMEOUT = 30.0  # seconds a garbage-collected filesystem waits for its cluster to close


class Session:
    """The cluster, open on one event loop from first use until ``close``. A forked child
    forgets its parent's session (its threads and SQLite connection are not the child's)."""

    def __init__(self, cluster_dir: str, group: TrafficGroup | None = None) -> None:
        self.cluster_dir = cluster_dir
        self.group = group  # the TrafficGroup of every request (``Cluster.use_group``)
        self.pid = os.getpid()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._stack: AsyncExitStack | None = None
        self._client: Client | None = None

    @property
    def is_open(self) -> bool:
        return self._client is not None and self.pid == os.getpid()

    def _forget(self) -> None:
        self.pid = os.getpid()
        self.loop = self._lock = self._stack = self._client = None

    async def client(self) -> Client:
        """The client, opening the cluster on the running loop if needed. Raises
        ClusterNotFoundError, RuntimeError (open on another, live, event loop)."""
        loop = asyncio.get_running_loop()
        if self.pid != os.getpid():
            self._forget()
        if self.loop is not loop:
            if self._client is not None and self.loop is not None and not self.loop.is_closed():
                raise RuntimeError(
                    "this tectonic filesystem has its cluster open on another event loop; "
                    "close it there first (await fs._close())"
                )
            self._forget()  # a closed loop: what was opened on it can no longer be closed
            self.loop, self._lock = loop, asyncio.Lock()
        assert self._lock is not None
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    stack = AsyncExitStack()
                    cluster = await stack.enter_async_context(Cluster.open(self.cluster_dir))
                    cluster.use_group(self.group)
                    self._stack, self._client = stack, cluster.client()
        return self._client

    async def close(self) -> None:
        """Close the cluster (waiting for straggling chunk writes); the next ``client()``
        reopens it. Raises what closing raised."""
        if self.pid != os.getpid():
            self._forget()
            return
        if self._lock is None:
            return
        async with self._lock:
            stack, self._stack, self._client = self._stack, None, None
            if stack is not None:
                await stack.aclose()


_closing: set[asyncio.Task[None]] = set()


def close_session(session: Session) -> None:
    """Finalizer of a filesystem: close its cluster if its loop still runs. Best effort: at
    garbage collection or interpreter exit nobody is left to hear an error."""
    loop = session.loop
    if not session.is_open or loop is None or loop.is_closed() or not loop.is_running():
        return
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:  # collected on the loop's own thread, which cannot wait for itself
        task = loop.create_task(session.close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)
        return
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(session.close(), loop).result(CLOSE_TIMEOUT)


__all__ = ["CLOSE_TIMEOUT", "Session", "close_session"]
