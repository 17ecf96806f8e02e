"""Heartbeats: the client's view of which served nodes are up (docs/wire-protocol.md,
*Heartbeats*)."""

from __future__ import annotations

import asyncio
import contextlib

from tectonic_emu.chunkstore.remote import RemoteNode
from tectonic_emu.errors import NodeUnavailableError


class HealthMonitor:
    """Heartbeats: ping every node each ``interval`` seconds on its heartbeat connection. A
    node that refuses, resets or takes longer than ``timeout`` is marked down; one that answers
    is marked up again."""

    def __init__(self, nodes: list[RemoteNode], *, interval: float = 0.5, timeout: float = 2.0):
        self.nodes = nodes
        self.interval = interval
        self.timeout = timeout
        self._task: asyncio.Task[None] | None = None

    async def check_all(self) -> None:
        async def one(node: RemoteNode) -> None:
            with contextlib.suppress(NodeUnavailableError):
                await node.ping(self.timeout)

        await asyncio.gather(*(one(n) for n in self.nodes))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.check_all()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


__all__ = ["HealthMonitor"]
