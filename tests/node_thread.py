"""A NodeServer on a real TCP socket, run in a background thread with its own event loop, so
that synchronous tests (and ``asyncio.run`` in them) can talk to it as to another process."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from tectonic_emu.chunkstore import LocalNode
from tectonic_emu.chunkstore.server import NodeServer
from tectonic_emu.qos import NodeQos

# The cluster secret of test nodes: clients pass it to ``RemoteNode(..., secret=SECRET)``.
SECRET = bytes(range(32))


class ThreadedNodeServer:
    def __init__(
        self,
        root: Path,
        *,
        node_id: int = 7,
        disks: int = 3,
        max_payload: int = 16 << 20,
        buffers: int = 4,
        sync: bool = True,
        secret: bytes = SECRET,
        qos: bool = True,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        node = LocalNode(root, node_id, disks, sync=sync)
        self.local = node

        async def start() -> tuple[NodeServer, tuple[str, int]]:
            server = NodeServer(
                node,
                secret=secret,
                max_payload=max_payload,
                buffers=buffers,
                qos=NodeQos(disks) if qos else None,  # served nodes' default: fair queues
            )
            return server, await server.start("127.0.0.1", 0)

        self.server, self.address = asyncio.run_coroutine_threadsafe(start(), self.loop).result()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
