"""Model storage nodes: chunks kept as descriptions, time charged to modelled hardware.

A ``ModelServer`` is one storage server of a projection: a host on the ``Fabric``, its
``Disk``s, and a ``MemoryNode`` that keeps each chunk's id, length, checksum and
``Synthetic`` description (real bytes work too, for tests). Clients reach it through a
``ModelNode``, the ``StorageNode`` one client host holds for it, as a process holds a
``RemoteNode`` for a served node. Every call is charged as the wire protocol would be
(``docs/wire-protocol.md``):

- a request frame from the client's host to the server's, carrying a chunk's payload for a
  write;
- for a write, the disk's write; for a read, the disk's read;
- a reply frame back, carrying the payload for a read.

Frames cost ``FRAME_BYTES`` of header and meta on top of their payload; an answer without a
payload (a reservation, a delete, a stat) costs a round trip and no disk time. The answer
itself (the chunk stored, the error raised) is the ``MemoryNode``'s: the same errors, the
same checks, as the contract suite (``tests/test_chunkstore_contract.py``) requires of every
node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, overload

from tectonic_emu.chunkstore._format import PIECE_SIZE
from tectonic_emu.chunkstore._memory import MemoryNode
from tectonic_emu.chunkstore.base import (
    ChunkData,
    ChunkInfo,
    DiskUsage,
    Payload,
    StorageNode,
    check_range,
)
from tectonic_emu.coding import work
from tectonic_emu.coding.synthetic import nbytes
from tectonic_emu.errors import InvalidArgumentError, NodeUnavailableError
from tectonic_emu.qos.fairqueue import Ticket
from tectonic_emu.qos.node import NodeQos
from tectonic_emu.sim.devices import Disk
from tectonic_emu.sim.fabric import Fabric, Host

FRAME_BYTES = 64  # a frame's header and meta (wire.py): a chunk id, a disk, flags, a CRC
T = TypeVar("T")


class ModelServer:
    """One modelled storage server (module docstring). ``available`` is its power switch,
    seen by every client's ``ModelNode``; ``delay`` slows each call it answers, as
    ``Cluster.set_node_delay`` does a real node."""

    def __init__(
        self,
        node_id: int,
        host: Host,
        disks: Sequence[Disk],
        *,
        capacity: int = 1 << 50,
        qos: NodeQos | None = None,
    ) -> None:
        if not disks:
            raise InvalidArgumentError(f"server {node_id} needs at least one disk")
        self.node_id = node_id
        self.host = host
        self.disks = list(disks)
        # Each disk's fair queue between TrafficGroups, as a served node's (None: none).
        self.qos = qos
        self.store = MemoryNode(node_id, len(self.disks), capacity=capacity)
        self.available = True
        self.delay = 0.0  # seconds added to every call (a slow server)
        self.cut_off: set[Host] = set()  # client hosts a partition keeps from it
        self.cpu: work.Tally | None = None  # where its CPU work is charged (None: free)

    async def spend(self, kind: str, nbytes: int) -> None:
        """``nbytes`` of ``kind`` of work done by this server, charged to its CPU if any."""
        if self.cpu is not None:
            with self.cpu.on_thread():  # a node's I/O threads
                self.cpu.add(kind, nbytes)
            await self.cpu.settle()

    def scheduled(
        self, disk: int, nbytes: int | None, *, write: bool
    ) -> contextlib.AbstractAsyncContextManager[Ticket | None]:
        """A slot on ``disk`` for the current TrafficGroup, as ``NodeServer.scheduled``
        holds one (nothing without a scheduler)."""
        if self.qos is None:
            return contextlib.nullcontext()
        return self.qos.serving(disk, nbytes, write=write)

    def disk(self, n: int) -> Disk:
        if not 0 <= n < len(self.disks):
            raise InvalidArgumentError(f"node {self.node_id} has no disk {n}")
        return self.disks[n]


class ModelNode(StorageNode):
    """``server`` as seen from the client host ``client`` over ``fabric``."""

    __slots__ = ("_closed", "client", "disks", "fabric", "node_id", "server")

    def __init__(self, server: ModelServer, client: Host, fabric: Fabric) -> None:
        self.server = server
        self.client = client
        self.fabric = fabric
        self.node_id = server.node_id
        self.disks = len(server.disks)
        self._closed = False

    @property
    def available(self) -> bool:
        return self.server.available and self.client not in self.server.cut_off

    @available.setter
    def available(self, up: bool) -> None:
        self.server.available = up

    def _check_up(self) -> None:
        if self._closed:
            raise NodeUnavailableError(f"node {self.node_id}: this handle is closed")
        if not self.server.available:
            raise NodeUnavailableError(f"node {self.node_id} is down")
        if self.client in self.server.cut_off:
            raise NodeUnavailableError(f"node {self.node_id} is unreachable from this host")

    async def _call(
        self,
        answer: Callable[[], Awaitable[T]],
        *,
        sent: int = 0,
        back: Callable[[T], int] = lambda _: 0,
    ) -> T:
        """One request and its reply: ``sent`` payload bytes out, the server's ``answer``,
        ``back(answer)`` payload bytes in (none with an error, which still costs its
        reply). The client's CPU work for each frame (its MAC and socket copy, and the check
        of a payload received, as ``RemoteNode`` does them) is counted and charged to the
        client host (coding/work.py)."""
        self._check_up()
        with work.on_thread():  # RemoteNode MACs frames and checks payloads on threads
            work.count("wire", FRAME_BYTES + sent)
        work.calls(1)  # the call's Python on the loop
        await work.settle()
        await self.fabric.send(self.client, self.server.host, FRAME_BYTES + sent)
        self._check_up()  # it may have gone down while the frame was on the wire
        if self.server.delay > 0:
            await asyncio.sleep(self.server.delay)
        try:
            result = await answer()
        except Exception:
            await self.fabric.send(self.server.host, self.client, FRAME_BYTES)
            raise
        received = back(result)
        await self.fabric.send(self.server.host, self.client, FRAME_BYTES + received)
        with work.on_thread():
            work.count("wire", FRAME_BYTES + received)
            if received:
                work.count("crc32c", received)
        work.calls(1, replies=True)  # the reply taken up on the loop
        await work.settle()
        return result

    async def write_chunk(
        self,
        disk: int,
        chunk_id: str,
        payload: Payload,
        *,
        crc32c: int,
        flags: int = 0,
        sync: bool = True,
    ) -> None:
        """The device's write of the payload, whether ``sync`` or not: with ``O_DIRECT`` the
        bytes are on the device either way, and the fdatasync that follows a synced write
        is not charged (a cache flush with no other writes behind it costs next to
        nothing beside 8 MiB). The store keeps whether it is durable yet, for what a crash
        loses (``MemoryNode.crash``, docs/dst.md)."""
        store, n = self.server.store, nbytes(payload)

        async def answer() -> None:
            # No copy: a node writes a chunk's pages with O_DIRECT from the memory it came
            # in (``LocalNode``; the writer's blocks and parity are page-aligned), where
            # this model charged a copy into the page cache until 2026-12-06. First the
            # node computes its piece checksums and checks the payload against the writer's
            # checksum combined from them, in one pass (chunkstore/_format.py
            # ``head_of(check=True)``; a second pass, over the whole payload, until 2026-12-07).
            async with self.server.scheduled(disk, n, write=True):
                await self.server.spend("crc32c-pieces", n)
                await self.server.disk(disk).write(n)
                await store.write_chunk(
                    disk, chunk_id, payload, crc32c=crc32c, flags=flags, sync=sync
                )

        await self._call(answer, sent=n)

    async def read_chunk(self, disk: int, chunk_id: str) -> tuple[ChunkData, ChunkInfo]:
        store = self.server.store

        async def answer() -> tuple[ChunkData, ChunkInfo]:
            info = await store.stat_chunk(disk, chunk_id)
            # The copy out of the page cache, anew, goes on while the device reads: a
            # buffered read copies each page once its readahead lands. Charged one after
            # the other, a projected 16-rank load on this machine spent 86 ms a chunk on
            # the device, then 43 ms more copying, where the real one overlaps them.
            n = info.stored_len
            async with self.server.scheduled(disk, n, write=False):
                await asyncio.gather(self.server.disk(disk).read(n), self.server.spend("copy", n))
                return await store.read_chunk(disk, chunk_id)

        return await self._call(answer, back=lambda got: got[1].stored_len)

    async def read_chunk_range(
        self, disk: int, chunk_id: str, offset: int, length: int
    ) -> tuple[ChunkData, ChunkInfo]:
        """As ``LocalNode``'s: the device reads the pieces the range covers, the node checks
        them and copies them out (``READ_RANGE``)."""
        store = self.server.store

        async def answer() -> tuple[ChunkData, ChunkInfo]:
            info = await store.stat_chunk(disk, chunk_id)
            check_range(offset, length, info.stored_len, chunk_id)
            first, last = offset // PIECE_SIZE, -(-(offset + length) // PIECE_SIZE)
            covered = max(0, min(last * PIECE_SIZE, info.stored_len) - first * PIECE_SIZE)
            async with self.server.scheduled(disk, covered, write=False):
                await self.server.disk(disk).read(covered)
                await self.server.spend("crc32c-pieces", covered)
                await self.server.spend("copy", covered)
                return await store.read_chunk_range(disk, chunk_id, offset, length)

        return await self._call(answer, back=lambda _: length)

    async def sync_disk(self, disk: int) -> None:
        """A round trip, and a cache flush of the device: it waits for every write the
        device holds (``Disk.flush``), as a ``syncfs`` behind them does."""

        async def answer() -> None:
            async with self.server.scheduled(disk, 0, write=True):
                await self.server.disk(disk).flush(0)
                await self.server.store.sync_disk(disk)

        await self._call(answer)

    async def delete_chunk(self, disk: int, chunk_id: str) -> None:
        await self._call(lambda: self.server.store.delete_chunk(disk, chunk_id))

    async def stat_chunk(self, disk: int, chunk_id: str) -> ChunkInfo:
        return await self._call(lambda: self.server.store.stat_chunk(disk, chunk_id))

    async def list_chunks(self, disk: int) -> list[ChunkInfo]:
        listed = lambda: self.server.store.list_chunks(disk)  # noqa: E731
        return await self._call(listed, back=lambda chunks: FRAME_BYTES * len(chunks))

    async def usage(self) -> list[DiskUsage]:
        return await self._call(self.server.store.usage)

    async def reserve(self, nbytes: int) -> None:
        await self._call(lambda: self.server.store.reserve(nbytes))

    async def close(self) -> None:
        """This client's handle stops answering; the server and its chunks stay."""
        self._closed = True


class ModelNodes(Sequence[StorageNode]):
    """Every server as one client host sees it: a ``ModelNode`` made when asked for, not
    kept. 3,072 hosts each holding a handle on each of 7,500 servers would be 23 million
    objects (4.8 GB) before a byte is written; a handle is three references, cheaper to make
    than to keep. (So a handle closed here is forgotten; the server stays.)"""

    def __init__(self, servers: Sequence[ModelServer], client: Host, fabric: Fabric) -> None:
        self.servers = servers
        self.client = client
        self.fabric = fabric

    def __len__(self) -> int:
        return len(self.servers)

    @overload
    def __getitem__(self, index: int) -> StorageNode: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[StorageNode]: ...

    def __getitem__(self, index: int | slice) -> StorageNode | Sequence[StorageNode]:
        if isinstance(index, slice):
            return [ModelNode(s, self.client, self.fabric) for s in self.servers[index]]
        return ModelNode(self.servers[index], self.client, self.fabric)


__all__ = ["FRAME_BYTES", "ModelNode", "ModelNodes", "ModelServer"]
