"""``FaultyNode``: wrap any storage node and inject faults, for reliability tests.

    node = FaultyNode(MemoryNode(0, disks=2), latency=0.01)
    node.fail_writes = 2          # the next two writes raise NodeUnavailableError
    node.corrupt_reads = True     # every read raises ChunkCorruptError until reset
    node.crash_writes = 1         # the next write leaves a torn chunk, then raises

Faults are plain attributes, set and reset by the test; ``calls`` counts the calls per method.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Protocol, runtime_checkable

from tectonic_emu.chunkstore.base import ChunkData, ChunkInfo, DiskUsage, Payload, StorageNode
from tectonic_emu.coding.synthetic import nbytes
from tectonic_emu.errors import ChunkCorruptError, NodeUnavailableError


@runtime_checkable
class SupportsTornWrite(Protocol):
    """A node that can leave a torn chunk on purpose (``LocalNode``, ``MemoryNode``)."""

    async def write_torn_chunk(
        self,
        disk: int,
        chunk_id: str,
        payload: Payload,
        *,
        crc32c: int,
        flags: int = 0,
        keep: int,
    ) -> None: ...


class FaultyNode(StorageNode):
    """A storage node that forwards to ``inner`` after ``latency`` seconds, unless a fault is set.

    ``available`` is the wrapper's own switch (the inner node stays up). ``crash_writes`` needs an
    inner node with ``write_torn_chunk``; with another node it only raises.
    """

    def __init__(self, inner: StorageNode, *, latency: float = 0.0) -> None:
        self.inner = inner
        self.node_id = inner.node_id
        self.disks = inner.disks
        self.available = True
        self.latency = latency
        self.fail_writes = 0  # the next N write_chunk calls raise NodeUnavailableError
        self.fail_reads = 0  # the next N reads (whole or ranged) raise NodeUnavailableError
        self.corrupt_reads = False  # while True, reads raise ChunkCorruptError
        self.crash_writes = 0  # the next N writes store half the payload, then raise
        self.calls: Counter[str] = Counter()

    async def _enter(self, method: str) -> None:
        self.calls[method] += 1
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        if not self.available:
            raise NodeUnavailableError(f"node {self.node_id} is down")

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
        await self._enter("write_chunk")
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise NodeUnavailableError(f"node {self.node_id}: injected write failure", chunk_id)
        if self.crash_writes > 0:
            self.crash_writes -= 1
            if isinstance(self.inner, SupportsTornWrite):
                keep = nbytes(payload) // 2
                await self.inner.write_torn_chunk(
                    disk, chunk_id, payload, crc32c=crc32c, flags=flags, keep=keep
                )
            raise NodeUnavailableError(f"node {self.node_id}: crashed during write", chunk_id)
        await self.inner.write_chunk(disk, chunk_id, payload, crc32c=crc32c, flags=flags, sync=sync)

    async def sync_disk(self, disk: int) -> None:
        await self._enter("sync_disk")
        await self.inner.sync_disk(disk)

    async def read_chunk(self, disk: int, chunk_id: str) -> tuple[ChunkData, ChunkInfo]:
        await self._enter("read_chunk")
        self._read_faults(chunk_id)
        return await self.inner.read_chunk(disk, chunk_id)

    async def read_chunk_range(
        self, disk: int, chunk_id: str, offset: int, length: int
    ) -> tuple[ChunkData, ChunkInfo]:
        await self._enter("read_chunk_range")
        self._read_faults(chunk_id)
        return await self.inner.read_chunk_range(disk, chunk_id, offset, length)

    def _read_faults(self, chunk_id: str) -> None:
        """Raise the read fault set, if any (``fail_reads`` counts down)."""
        if self.fail_reads > 0:
            self.fail_reads -= 1
            raise NodeUnavailableError(f"node {self.node_id}: injected read failure", chunk_id)
        if self.corrupt_reads:
            raise ChunkCorruptError(f"node {self.node_id}: injected corruption", chunk_id)

    async def reserve(self, nbytes: int) -> None:
        await self._enter("reserve")
        await self.inner.reserve(nbytes)

    async def delete_chunk(self, disk: int, chunk_id: str) -> None:
        await self._enter("delete_chunk")
        await self.inner.delete_chunk(disk, chunk_id)

    async def stat_chunk(self, disk: int, chunk_id: str) -> ChunkInfo:
        await self._enter("stat_chunk")
        return await self.inner.stat_chunk(disk, chunk_id)

    async def list_chunks(self, disk: int) -> list[ChunkInfo]:
        await self._enter("list_chunks")
        return await self.inner.list_chunks(disk)

    async def usage(self) -> list[DiskUsage]:
        await self._enter("usage")
        return await self.inner.usage()

    def chunk_path(self, disk: int, chunk_id: str) -> str | None:
        return self.inner.chunk_path(disk, chunk_id)

    async def close(self) -> None:
        await self.inner.close()


__all__ = ["FaultyNode", "SupportsTornWrite"]
