"""Blocks to chunks and back: placement, encoding, checksums, chunk I/O.

This is the client library's hot path. A block is encoded in memory (in a worker thread, so
the event loop keeps serving other ranks), its chunks are written concurrently to distinct
nodes, and only then may the caller commit the block to metadata. Reads fetch the fewest
chunks that can return the block, check every chunk's CRC32C against the Block layer, and fall
back to other replicas or parity chunks when a chunk is missing, corrupt or on a dead node.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import secrets
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import TypeVar

from tectonic_emu.chunkstore.base import BytesLike, StorageNode
from tectonic_emu.coding import Encoding, codec_for, crc32c, decompress, maybe_compress
from tectonic_emu.config import Compression
from tectonic_emu.errors import (
    ChunkCorruptError,
    DataUnavailableError,
    NotEnoughNodesError,
    first_error,
)
from tectonic_emu.metadata.records import BlockRecord, ChunkPlacement

T = TypeVar("T")

# Below this many bytes a checksum or copy is cheaper than a hop to a worker thread.
_INLINE_CPU_BYTES = 256 << 10


def new_chunk_id(block_id: int, index: int) -> str:
    """Unique per write, so a rebuilt chunk never collides with a stale copy of the old one."""
    return f"{block_id:016x}.{index}.{secrets.token_hex(4)}"


class DataPath:
    """Chunk placement and chunk I/O for one cluster's nodes."""

    def __init__(
        self,
        nodes: Sequence[StorageNode],
        *,
        disks_per_node: int,
        compression: Compression,
        cpu: Executor,
    ) -> None:
        self.nodes = nodes
        self.disks_per_node = disks_per_node
        self.compression: Compression = compression
        self._cpu = cpu
        self._rng = random.Random()

    # -- helpers ---------------------------------------------------------------------------
    async def _cpu_call(self, size: int, fn: Callable[..., T], *args: object) -> T:
        if size < _INLINE_CPU_BYTES:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._cpu, fn, *args)

    def live_nodes(self) -> list[int]:
        return [n.node_id for n in self.nodes if n.available]

    def min_live_nodes(self, enc: Encoding) -> int:
        """The fewest live nodes a write of ``enc`` accepts.

        With every node up, chunks go to distinct nodes. With some down, a write still goes
        through (two chunks sharing a node, on distinct disks) as long as losing any one more
        node keeps the block readable; such blocks count as below redundancy until repair
        spreads them out again.
        """
        if enc.width <= 1:
            return 1
        return min(enc.width, enc.min_chunks + 1)

    def place(
        self, enc: Encoding, count: int, *, avoid: Iterable[int] = ()
    ) -> list[tuple[int, int]]:
        """``count`` (node, disk) targets on live nodes, distinct nodes first.

        Raises NotEnoughNodesError when the live nodes cannot hold the block safely.
        """
        avoid_set = set(avoid)
        all_live = self.live_nodes()
        live = [n for n in all_live if n not in avoid_set]
        self._rng.shuffle(live)
        up = len(all_live)
        if up < self.min_live_nodes(enc):
            raise NotEnoughNodesError(
                f"encoding {enc} needs {self.min_live_nodes(enc)} live nodes; "
                f"{up} of {len(self.nodes)} are up"
            )
        if len(live) * self.disks_per_node < count:
            raise NotEnoughNodesError(
                f"encoding {enc}: {len(live)} usable live nodes cannot take {count} more chunks "
                f"({up} of {len(self.nodes)} are up)"
            )
        targets: list[tuple[int, int]] = []
        disk_of = {n: self._rng.randrange(self.disks_per_node) for n in live}
        while len(targets) < count:
            for n in live:
                if len(targets) == count:
                    break
                targets.append((n, disk_of[n]))
                disk_of[n] = (disk_of[n] + 1) % self.disks_per_node
        return targets

    # -- write -----------------------------------------------------------------------------
    def _prepare(self, enc: Encoding, block: BytesLike) -> list[tuple[BytesLike, int, int, int]]:
        """(stored bytes, flags, crc32c, raw length) for each chunk index. Runs in a worker."""
        codec = codec_for(enc)
        chunks = codec.encode(block)
        if enc.kind == "replication":
            return [self._prepare_one(block)] * enc.width
        return [self._prepare_one(chunk) for chunk in chunks]

    async def write_block(
        self, enc: Encoding, block: BytesLike, *, block_id: int, file_id: int
    ) -> BlockRecord:
        """Encode and durably store one block's chunks. The caller commits the record.

        Raises NotEnoughNodesError if too few nodes accept chunks. On any error or
        cancellation the chunks already written are deleted (best effort; repair's garbage
        collection removes what could not be).
        """
        prepared = await self._cpu_call(len(block), self._prepare, enc, block)
        targets = self.place(enc, enc.width)
        taken = set(targets)
        failed: set[int] = set()
        written: list[ChunkPlacement] = []
        try:
            async with asyncio.TaskGroup() as tg:
                for index, target in enumerate(targets):
                    tg.create_task(
                        self._put_chunk(
                            enc, block_id, index, prepared[index], target, taken, failed, written
                        )
                    )
        except BaseException as exc:
            await asyncio.shield(self.delete_chunks(written))
            if isinstance(exc, BaseExceptionGroup):
                raise first_error(exc) from None
            raise
        written.sort(key=lambda c: c.index)
        return BlockRecord(block_id, file_id, len(block), enc.name, tuple(written))

    async def write_chunks(
        self, enc: Encoding, block_id: int, raw: dict[int, BytesLike], *, avoid: set[int]
    ) -> list[ChunkPlacement]:
        """Store rebuilt chunks (repair) on live nodes not in ``avoid``, as distinct as can be.
        On failure deletes what it wrote and raises."""
        targets = self.place(enc, len(raw), avoid=avoid)
        # Nodes in ``avoid`` hold chunks of the block: count all their disks as taken.
        taken = set(targets) | {(n, d) for n in avoid for d in range(self.disks_per_node)}
        failed: set[int] = set()
        written: list[ChunkPlacement] = []
        try:
            for (index, data), target in zip(sorted(raw.items()), targets, strict=True):
                prep = await self._cpu_call(len(data), self._prepare_one, data)
                await self._put_chunk(enc, block_id, index, prep, target, taken, failed, written)
        except BaseException:
            await asyncio.shield(self.delete_chunks(written))
            raise
        return written

    def _prepare_one(self, raw: BytesLike) -> tuple[BytesLike, int, int, int]:
        stored, flags = maybe_compress(raw, self.compression)
        return stored, flags, crc32c(stored), len(raw)

    async def _put_chunk(
        self,
        enc: Encoding,
        block_id: int,
        index: int,
        prepared: tuple[BytesLike, int, int, int],
        target: tuple[int, int],
        taken: set[tuple[int, int]],
        failed: set[int],
        written: list[ChunkPlacement],
    ) -> None:
        """Write one chunk; if its node fails, retry (under a new id) on a replacement."""
        stored, flags, crc, raw_len = prepared
        node, disk = target
        while True:
            chunk_id = new_chunk_id(block_id, index)
            try:
                await self.nodes[node].write_chunk(disk, chunk_id, stored, crc32c=crc, flags=flags)
            except (OSError, EOFError):
                failed.add(node)
                node, disk = self._replacement(enc, taken, failed)
                taken.add((node, disk))
                continue
            written.append(
                ChunkPlacement(index, node, disk, chunk_id, crc, len(stored), flags, raw_len)
            )
            return

    def _replacement(
        self, enc: Encoding, taken: set[tuple[int, int]], failed: set[int]
    ) -> tuple[int, int]:
        """A target for a chunk whose node failed: a live node the block does not use yet,
        else (as a degraded write does) a free disk of a node it uses; the block is then below
        redundancy until repair moves it."""
        used = {n for n, _ in taken}
        with contextlib.suppress(NotEnoughNodesError):
            ((node, disk),) = self.place(enc, 1, avoid=used | failed)
            return node, disk
        for n in self.live_nodes():
            if n in failed:
                continue
            for d in range(self.disks_per_node):
                if (n, d) not in taken:
                    return n, d
        raise NotEnoughNodesError(
            f"encoding {enc}: no live node left to take a chunk that failed to write "
            f"({len(failed)} nodes failed, {len(self.live_nodes())} of {len(self.nodes)} up)"
        )

    async def delete_chunks(self, chunks: Iterable[ChunkPlacement]) -> int:
        """Delete chunks, ignoring nodes that are down. Returns how many were deleted."""

        async def one(c: ChunkPlacement) -> bool:
            try:
                await self.nodes[c.node].delete_chunk(c.disk, c.chunk_id)
                return True
            except OSError:
                return False

        results = await asyncio.gather(*(one(c) for c in chunks))
        return sum(results)

    # -- read ------------------------------------------------------------------------------
    def _verify(self, c: ChunkPlacement, stored: BytesLike) -> BytesLike:
        if len(stored) != c.stored_len or crc32c(stored) != c.crc32c:
            raise ChunkCorruptError(f"chunk {c.chunk_id} fails its checksum", f"node {c.node}")
        if c.flags:
            return decompress(stored, c.flags, c.raw_len)
        return stored

    async def fetch_chunk(self, c: ChunkPlacement) -> BytesLike:
        """One chunk's raw (decompressed) bytes, checked end to end against the Block layer."""
        stored, _info = await self.nodes[c.node].read_chunk(c.disk, c.chunk_id)
        return await self._cpu_call(len(stored), self._verify, c, stored)

    def _read_order(self, chunks: Iterable[ChunkPlacement], data: int) -> list[ChunkPlacement]:
        """Live nodes first; for RS, data chunks before parity (no decoding needed)."""
        spread = self._rng.random()
        return sorted(
            chunks,
            key=lambda c: (
                not self.nodes[c.node].available,
                c.index >= data,
                (c.index + spread * 1000) % 1000 if data == 1 else c.index,
            ),
        )

    async def read_range(self, rec: BlockRecord, lo: int, hi: int) -> list[tuple[int, BytesLike]]:
        """Pieces ``(offset in the block, bytes)`` that together cover [lo, hi) of a block.

        For Reed-Solomon only the data chunks overlapping the range are fetched, and no block
        is assembled: its bytes go straight from the chunk buffers to the caller (a fresh
        48 MiB block per read would cost more than the read on this VM). When one of them is
        missing, corrupt or on a node that is down, the block is decoded from any D chunks.
        """
        enc = Encoding.parse(rec.encoding)
        if enc.kind == "rs" and hi > lo:
            sizes = codec_for(enc).chunk_sizes(rec.length)[: enc.data]
            starts = list(itertools.accumulate([0, *sizes[:-1]]))
            by_index = {c.index: c for c in rec.chunks}
            wanted = [
                i
                for i in range(enc.data)
                if sizes[i] and starts[i] < hi and starts[i] + sizes[i] > lo
            ]
            if all(i in by_index and self.nodes[by_index[i].node].available for i in wanted):
                results = await asyncio.gather(
                    *(self.fetch_chunk(by_index[i]) for i in wanted), return_exceptions=True
                )
                for r in results:
                    if isinstance(r, BaseException) and not isinstance(r, (OSError, EOFError)):
                        raise r
                have = {
                    i: r
                    for i, r in zip(wanted, results, strict=True)
                    if not isinstance(r, BaseException)
                }
                if len(have) == len(wanted):
                    pieces: list[tuple[int, BytesLike]] = []
                    for i in wanted:
                        a, b = max(lo, starts[i]), min(hi, starts[i] + sizes[i])
                        pieces.append((a, memoryview(have[i])[a - starts[i] : b - starts[i]]))
                    return pieces
                # Decode, reusing the chunks already fetched and skipping the ones that failed.
                failed = set(wanted) - set(have)
                data = await self.read_block(rec, have=have, failed=failed)
                return [(lo, memoryview(data)[lo:hi])]
        data = await self.read_block(rec)
        return [(lo, memoryview(data)[lo:hi])]

    async def read_block(
        self,
        rec: BlockRecord,
        *,
        have: dict[int, BytesLike] | None = None,
        failed: Iterable[int] = (),
    ) -> BytesLike:
        """The block's exact bytes, or DataUnavailableError. Never wrong bytes.

        ``have``: chunks already fetched and checked; ``failed``: indexes not to try again.
        """
        if rec.length == 0:
            return b""
        enc = Encoding.parse(rec.encoding)
        order = self._read_order(rec.chunks, enc.min_chunks if enc.kind == "rs" else 1)
        good: dict[int, BytesLike] = dict(have or {})
        skip = set(good) | set(failed)
        errors: list[BaseException] = []
        pending = [c for c in order if c.index not in skip]
        while len(good) < enc.min_chunks:
            want = enc.min_chunks - len(good)
            batch, pending = pending[:want], pending[want:]
            if not batch:
                raise DataUnavailableError(
                    f"block {rec.block_id:016x}: {len(good)} of {enc.min_chunks} needed chunks "
                    f"readable ({'; '.join(str(e) for e in errors[-3:])})"
                )
            results = await asyncio.gather(
                *(self.fetch_chunk(c) for c in batch), return_exceptions=True
            )
            for c, r in zip(batch, results, strict=True):
                if isinstance(r, BaseException):
                    if not isinstance(r, (OSError, EOFError)):
                        raise r
                    errors.append(r)
                else:
                    good[c.index] = r
        if enc.kind == "replication":
            return next(iter(good.values()))
        codec = codec_for(enc)
        return await self._cpu_call(rec.length, codec.decode, good, rec.length)


__all__ = ["DataPath", "new_chunk_id"]
