"""Writing a block: encode, compress and checksum its chunks, write them, acknowledge it.

A block is encoded in memory (in a worker thread, so the event loop keeps serving other
ranks), and its chunks go concurrently to the targets ``Placement`` picked. A chunk write that
fails is retried under a new chunk id on a replacement target. With ``write_ack="quorum"``
``write_block`` returns once ``ack_quorum(enc)`` chunks are durable and leaves the last one
writing (a straggler); ``drain()`` waits for the stragglers. Only after ``write_block``
returns may the caller commit the block to metadata.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from tectonic_emu import buggify, entropy
from tectonic_emu.bufpool import uninitialised
from tectonic_emu.chunkstore.base import StorageNode
from tectonic_emu.coding import Encoding, codec_for, crc32c, maybe_compress
from tectonic_emu.coding.synthetic import Payload, Synthetic, nbytes
from tectonic_emu.config import Compression
from tectonic_emu.errors import NotEnoughNodesError
from tectonic_emu.hedging import HedgeStats
from tectonic_emu.metadata.records import BlockRecord, ChunkPlacement
from tectonic_emu.offload import offload
from tectonic_emu.placement import Placement, Target, is_full

log = logging.getLogger("tectonic_emu.datapath")  # the data path's log, as before its split

# Stragglers (chunk writes still running after their block was acknowledged) a DataPath keeps
# before write_block waits for one to finish: bounds the memory they hold.
MAX_STRAGGLERS = 32

# A chunk ready to write: (stored bytes, flags, crc32c of the stored bytes, raw length).
Prepared = tuple[Payload, int, int, int]


def new_chunk_id(block_id: int, index: int) -> str:
    """Unique per write, so a rebuilt chunk never collides with a stale copy of the old one."""
    return f"{block_id:016x}.{index}.{entropy.token_hex(4)}"


@dataclass(slots=True)
class _BlockWrite:
    """Shared state of the chunk writes of one block."""

    taken: set[Target]
    failed: set[int] = field(default_factory=set)
    full: set[int] = field(default_factory=set)  # failed for want of space (ENOSPC)
    current: dict[int, ChunkPlacement] = field(default_factory=dict)  # the latest attempt
    written: list[ChunkPlacement] = field(default_factory=list)  # durable
    acked: bool = False  # the block was acknowledged: stragglers no longer retry
    sync: bool = True  # False: chunks written unsynced (``write_block(sync=False)``)
    # Kept as long as any chunk write of the block (``write_block``'s ``holds``).
    holds: object = None


class BlockWriter:
    """Chunk writes of one data path: its nodes, placement, CPU pool and write settings.

    ``write_ack``: ``"all"`` (every chunk durable before a block is acknowledged) or
    ``"quorum"``. ``hedge_extra``: reservations beyond what a block needs when nodes spare.
    """

    def __init__(
        self,
        nodes: Sequence[StorageNode],
        placement: Placement,
        stats: HedgeStats,
        *,
        cpu: Executor,
        compression: Compression,
        write_ack: str,
        hedge_extra: int,
    ) -> None:
        self.nodes = nodes
        self.placement = placement
        self.stats = stats
        self.compression: Compression = compression
        self.write_ack = write_ack
        self.hedge_extra = hedge_extra
        self._cpu = cpu
        # Insertion-ordered (a dict), so the oldest straggler is the first key.
        self._stragglers: dict[asyncio.Future[Any], None] = {}
        # Chunk ids of stragglers still writing: ``sync_chunks`` leaves their disks alone
        # (a straggler syncs its own once it lands; a node 30 s slow must not hold a flush).
        self._landing: set[str] = set()

    def ack_quorum(self, enc: Encoding) -> int:
        """Chunks that must be durable before a block is acknowledged."""
        if self.write_ack == "all" or enc.width <= 2:
            return enc.width
        return max(enc.min_chunks + 1, enc.width - 1)

    async def reserve_targets(self, enc: Encoding, nbytes: int) -> list[Target]:
        """``enc.width`` targets on distinct nodes; with spare live nodes, the first to accept
        a reservation among ``hedge_extra`` more than needed (``Placement.reserve``)."""
        live = self.placement.live_up_to(enc.width + self.hedge_extra)
        extra = min(self.hedge_extra, live - enc.width)
        if extra <= 0:  # no spare nodes, maybe too few: degraded down to the minimum
            return self.placement.place(
                enc, enc.width, at_least=self.placement.min_write_chunks(enc)
            )
        self.stats.hedged_writes += 1
        return await self.placement.reserve(enc, nbytes, extra)

    async def write_block(
        self,
        enc: Encoding,
        block: Payload,
        *,
        block_id: int,
        file_id: int,
        holds: object = None,
        sync: bool = True,
    ) -> BlockRecord:
        """Encode and durably store one block's chunks. The caller commits the record.
        ``holds``: kept as long as any of its chunk writes runs, stragglers' included, as
        the views of a block's buffer are (``pipeline.BlockPipeline.submit``). ``sync=False``:
        the chunks are written unsynced, for the caller to make durable with
        ``sync_chunks`` before it commits the record; a straggler (a chunk write still
        running when the block is acknowledged) syncs its own disk once written.

        Returns once ``ack_quorum(enc)`` chunks are durable; the record names every chunk,
        the stragglers' included. Raises NotEnoughNodesError if too few nodes accept chunks.
        On any error or cancellation the chunks already written are deleted (best effort;
        repair's garbage collection removes what could not be).
        """
        prepared = await offload(self._cpu, len(block), self._prepare, enc, block)
        targets = await self.reserve_targets(enc, max(len(p[0]) for p in prepared))
        state = _BlockWrite(taken=set(targets), holds=holds, sync=sync)
        self.stats.writes += 1
        tasks = [
            asyncio.ensure_future(
                self._put_chunk(enc, block_id, i, prepared[i], target, state, may_drop=True)
            )
            for i, target in enumerate(targets)
        ]
        least = self.placement.min_write_chunks(enc)
        pending = set(tasks)
        try:
            durable = dropped = 0
            # Degraded (fewer targets, or chunks dropped for want of a node): the quorum
            # shrinks with them, never below ``least``.
            while durable < min(self.ack_quorum(enc), len(tasks) - dropped):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in [t for t in tasks if t in done]:  # chunk order, the same every run
                    if task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                    if task.result():
                        durable += 1
                    else:
                        dropped += 1
                if len(tasks) - dropped < least:
                    raise NotEnoughNodesError(
                        f"encoding {enc}: {len(tasks) - dropped} chunks of a block could be "
                        f"written, {least} needed ({len(self.placement.live_nodes())} of "
                        f"{len(self.nodes)} nodes are up)"
                    )
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.shield(self._abandon(tasks, state))
            raise
        state.acked = True
        for i, task in enumerate(tasks):
            if task not in pending:
                continue
            self.stats.stragglers += 1
            self._stragglers[task] = None
            task.add_done_callback(self._straggler_done)
            if not sync:
                landing = state.current[i].chunk_id
                self._landing.add(landing)
                task.add_done_callback(functools.partial(self._landed, landing))
        while len(self._stragglers) > MAX_STRAGGLERS:
            # A node that slow would hold every writer back: give up on its oldest chunk
            # write (the record names it; repair rebuilds it) rather than wait.
            oldest = next(iter(self._stragglers))
            self._stragglers.pop(oldest)
            oldest.cancel()
        chunks = sorted(state.current.values(), key=lambda c: c.index)
        return BlockRecord(block_id, file_id, len(block), enc.name, tuple(chunks))

    async def _abandon(self, tasks: Sequence[asyncio.Future[bool]], state: _BlockWrite) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.delete_chunks(state.written)

    def _landed(self, chunk_id: str, _: asyncio.Future[bool]) -> None:
        self._landing.discard(chunk_id)

    def _straggler_done(self, task: asyncio.Future[Any]) -> None:
        self._stragglers.pop(task, None)
        if task.cancelled():
            self.stats.straggler_failures += 1
        elif task.exception() is not None:
            self.stats.straggler_failures += 1
            log.info("a straggling chunk write failed (repair rebuilds it): %s", task.exception())

    async def drain(self, wait: float = 60.0) -> None:
        """Wait for the stragglers of acknowledged blocks (at most ``wait`` seconds, then
        cancel them: repair rebuilds what they did not write)."""
        if not self._stragglers:
            return
        _, pending = await asyncio.wait(set(self._stragglers), timeout=wait)
        late = [t for t in self._stragglers if t in pending]  # oldest first, every run alike
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)

    async def write_chunks(
        self, enc: Encoding, block_id: int, raw: dict[int, Payload], *, avoid: set[int]
    ) -> list[ChunkPlacement]:
        """Store rebuilt chunks (repair) on live nodes not in ``avoid``, as distinct as can be.
        On failure deletes what it wrote and raises."""
        targets = self.placement.place(enc, len(raw), avoid=avoid)
        # Nodes in ``avoid`` hold chunks of the block: count all their disks as taken.
        disks = self.placement.disks_per_node
        state = _BlockWrite(taken=set(targets) | {(n, d) for n in avoid for d in range(disks)})
        try:
            for (index, data), target in zip(sorted(raw.items()), targets, strict=True):
                prep = await offload(self._cpu, len(data), self._prepare_one, data)
                await self._put_chunk(enc, block_id, index, prep, target, state)
        except BaseException:
            await asyncio.shield(self.delete_chunks(state.written))
            raise
        return state.written

    async def _sync_disk(self, node: int, disk: int) -> None:
        if buggify.fires():  # a slow fsync (docs/dst.md)
            await asyncio.sleep(buggify.draw(0.0, 0.05))
        await self.nodes[node].sync_disk(disk)

    async def sync_chunks(self, records: Sequence[BlockRecord]) -> dict[int, set[int]]:
        """Make the records' chunks, written unsynced, durable as ``write_block`` makes a
        block's: one ``sync_disk`` per node disk they are on, all at once, returning once
        each block has ``ack_quorum`` chunks on synced disks (fewer when syncs fail, down
        to ``min_write_chunks``: a degraded write). Syncs still running then go on as
        stragglers (``drain``): a chunk one leaves unsynced is repair's, as a straggling
        write's is; a straggler's chunk still being written syncs its own disk when it
        lands. Returns, for each block that failed syncs leave below ``min_write_chunks``
        (by position in ``records``), the indexes of its chunks on synced disks: the
        caller rebuilds the rest (``DataPath.sync_chunks``)."""
        on = [
            [(c.index, (c.node, c.disk)) for c in r.chunks if c.chunk_id not in self._landing]
            for r in records
        ]
        syncs = {
            key: asyncio.ensure_future(self._sync_disk(*key))
            for key in sorted({key for chunks in on for _, key in chunks})
        }
        encodings = [Encoding.parse(r.encoding) for r in records]
        try:
            while (short := self._synced_enough(on, encodings, syncs)) is None:
                running = [t for t in syncs.values() if not t.done()]
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            for task in syncs.values():
                task.cancel()
            await asyncio.gather(*syncs.values(), return_exceptions=True)
            raise
        for task in syncs.values():
            if not task.done():
                self._stragglers[task] = None
                task.add_done_callback(self._straggler_done)
        return short

    def _synced_enough(
        self,
        on: list[list[tuple[int, Target]]],
        encodings: list[Encoding],
        syncs: Mapping[Target, asyncio.Future[None]],
    ) -> dict[int, set[int]] | None:
        """``sync_chunks``'s answer once every block has its quorum of chunks on synced
        disks or is short of its minimum with all its disks' syncs over; None before."""
        done = {k: t for k, t in syncs.items() if t.done() and not t.cancelled()}
        ok = {k for k, t in done.items() if t.exception() is None}
        short: dict[int, set[int]] = {}
        for pos, (chunks, enc) in enumerate(zip(on, encodings, strict=True)):
            alive = [k for _, k in chunks if k not in done or k in ok]
            if len(alive) < self.placement.min_write_chunks(enc):
                if any(k not in done for _, k in chunks):
                    return None
                short[pos] = {i for i, k in chunks if k in ok}
            elif sum(k in ok for k in alive) < min(self.ack_quorum(enc), len(alive)):
                return None
        return short

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

    # -- internals ---------------------------------------------------------------------------
    def _prepare(self, enc: Encoding, block: Payload) -> list[Prepared]:
        """What ``_prepare_one`` makes of each chunk of the block. Runs in a worker."""
        if enc.kind == "replication":  # every chunk is the block itself
            return [self._prepare_one(block)] * enc.width
        codec = codec_for(enc)
        if isinstance(block, Synthetic):
            chunks = codec.encode(block)
        else:
            # Parity into page-aligned, unzeroed buffers from the heap (warm when reused):
            # a node writes them straight from there with O_DIRECT. The codec's own
            # bytearray is zeroed first and is not page-aligned, so each parity chunk cost a
            # memset and a bounce copy (82 of a 16-rank rs-6-3 save's chunk writes).
            s = codec.chunk_sizes(nbytes(block))[-1]  # a parity chunk's
            parity = [uninitialised(s) for _ in range(enc.parity)]
            chunks = codec.encode(block, parity_out=parity)
        return [self._prepare_one(chunk) for chunk in chunks]

    def _prepare_one(self, raw: Payload) -> Prepared:
        stored, flags = maybe_compress(raw, self.compression)
        return stored, flags, crc32c(stored), len(raw)

    async def _put_chunk(
        self,
        enc: Encoding,
        block_id: int,
        index: int,
        prepared: Prepared,
        target: Target,
        state: _BlockWrite,
        *,
        may_drop: bool = False,
    ) -> bool:
        """Write one chunk; if its node fails, retry (under a new id) on a replacement, unless
        the block was acknowledged meanwhile (its record names this attempt: repair will
        rebuild the chunk). ``may_drop``: with no replacement left, give the chunk up (returns
        False; the record will not name it, and ``write_block`` decides whether the block
        still has enough) instead of raising NotEnoughNodesError."""
        stored, flags, crc, raw_len = prepared
        node, disk = target
        while True:
            chunk_id = new_chunk_id(block_id, index)
            placement = ChunkPlacement(
                index, node, disk, chunk_id, crc, len(stored), flags, raw_len
            )
            state.current[index] = placement
            try:
                if buggify.fires():  # a request held back: a straggler (docs/dst.md)
                    await asyncio.sleep(buggify.draw(0.0, 0.05))
                synced = state.sync and not buggify.planted("ack-before-durable")
                await self.nodes[node].write_chunk(
                    disk, chunk_id, stored, crc32c=crc, flags=flags, sync=synced
                )
                if state.acked and not state.sync:
                    # A straggler: the caller's sync of the block's disks may be over.
                    await self._sync_disk(node, disk)
            except (OSError, EOFError) as exc:
                if state.acked:
                    raise
                state.failed.add(node)
                if is_full(exc):
                    state.full.add(node)
                try:
                    node, disk = self.placement.replacement(
                        enc, state.taken, state.failed, state.full
                    )
                except NotEnoughNodesError:
                    if not may_drop:
                        raise
                    del state.current[index]
                    return False
                state.taken.add((node, disk))
                continue
            state.written.append(placement)
            return True


__all__ = ["MAX_STRAGGLERS", "BlockWriter", "Prepared", "new_chunk_id"]
