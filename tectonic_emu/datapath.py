"""Blocks to chunks and back: placement, encoding, checksums, chunk I/O.

This is the client library's hot path. A block is encoded in memory (in a worker thread, so
the event loop keeps serving other ranks), its chunks are written concurrently to distinct
nodes, and only then may the caller commit the block to metadata. Reads fetch the fewest
chunks that can return the block, check every chunk's CRC32C against the Block layer, and fall
back to other replicas or parity chunks when a chunk is missing, corrupt or on a dead node.

Hedging (Tectonic's answer to slow nodes, section 5 of the FAST'21 paper):

- *Hedged writes*: when more nodes are live than a block needs, the write first reserves on
  ``hedge_extra`` more nodes than it needs and writes to the first that accept, so a slow node
  is rarely picked.
- *Quorum acknowledgment* (``write_ack="quorum"``, served mode's default): ``write_block``
  returns once ``ack_quorum(enc)`` chunks are durable (all but one: 2 of 3 replicas, 8 of 9
  RS(6,3) chunks). The straggler keeps writing in the background; if it fails, its chunk is
  missing and repair rebuilds it. ``drain()`` waits for the stragglers.
- *Hedged reads*: a chunk read slower than the ``hedge_percentile`` of recent reads of chunks
  of its size is raced against another replica, or for Reed-Solomon against a decode from
  parity; at most ``hedge_share`` of reads may hedge.

The parts, each in a module of its own: ``placement.py`` (which nodes and disks take a
block's chunks, the reservation race), ``blockwrite.py`` (encode, compress, checksum, chunk
writes, quorum acknowledgment, stragglers), ``blockread.py`` (chunk reads with fallback, hedged
reads, rebuilds) and ``hedging.py`` (the counters, and when a read is late or a node slow).
``DataPath`` owns one of each and is the face the client library, repair and scrub use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor

from tectonic_emu import entropy
from tectonic_emu.blockread import BlockReader
from tectonic_emu.blockwrite import MAX_STRAGGLERS, BlockWriter, new_chunk_id
from tectonic_emu.chunkstore.base import StorageNode
from tectonic_emu.coding import Encoding, codec_for
from tectonic_emu.coding.synthetic import Payload, nbytes
from tectonic_emu.config import Compression
from tectonic_emu.errors import InvalidArgumentError, NotEnoughNodesError
from tectonic_emu.hedging import (
    DEFAULT_HEDGE_AFTER,
    SLOW_FACTOR,
    SLOW_MIN,
    SLOW_NODE_PENALTY,
    STUCK_FACTOR,
    HedgeStats,
    ReadHedging,
)
from tectonic_emu.metadata.records import BlockRecord, ChunkPlacement
from tectonic_emu.placement import Placement, Target
from tectonic_emu.qos.pacing import Pacing


class DataPath:
    """Chunk placement and chunk I/O for one cluster's nodes.

    The settings (``write_ack``, ``hedge_extra``, ``hedge_percentile``, ``hedge_share``,
    ``hedge_reads``, ``compression``) may be changed at any time; they take effect on the next
    block written or read.
    """

    def __init__(
        self,
        nodes: Sequence[StorageNode],
        *,
        disks_per_node: int,
        compression: Compression,
        cpu: Executor,
        write_ack: str = "all",
        hedge_extra: int = 2,
        hedge_percentile: float = 95.0,
        hedge_share: float = 0.05,
        hedge_reads: bool = True,
        domains: Sequence[str] | None = None,
    ) -> None:
        if write_ack not in ("all", "quorum"):
            raise ValueError(f"write_ack must be 'all' or 'quorum', not {write_ack!r}")
        self._stats = HedgeStats()
        # One random source for placement and replica order, so one seed fixes a run.
        self._rng = entropy.new_rng()
        self._placement = Placement(
            nodes, disks_per_node=disks_per_node, domains=domains, rng=self._rng
        )
        self._writer = BlockWriter(
            nodes,
            self._placement,
            self._stats,
            cpu=cpu,
            compression=compression,
            write_ack=write_ack,
            hedge_extra=hedge_extra,
        )
        # False: reads never race (no tail hedges, no stuck or slow nodes): for comparisons.
        self._hedging = ReadHedging(
            self._stats, percentile=hedge_percentile, share=hedge_share, enabled=hedge_reads
        )
        self._reader = BlockReader(nodes, self._hedging, cpu=cpu, rng=self._rng)
        # Each paced TrafficGroup's bucket in this client (``qos/pacing.py``).
        self.pacing = Pacing()

    # -- the cluster -------------------------------------------------------------------------
    @property
    def stats(self) -> HedgeStats:
        """Counters of hedged writes and reads (one record, shared by writer and reader)."""
        return self._stats

    @property
    def nodes(self) -> Sequence[StorageNode]:
        return self._placement.nodes

    @property
    def domains(self) -> list[str] | None:
        """Each node's failure domain (its host, in a cluster across hosts): a block's chunks
        go to distinct domains first. None: every node is its own."""
        return self._placement.domains

    @property
    def disks_per_node(self) -> int:
        return self._placement.disks_per_node

    # -- settings ----------------------------------------------------------------------------
    @property
    def compression(self) -> Compression:
        return self._writer.compression

    @compression.setter
    def compression(self, value: Compression) -> None:
        self._writer.compression = value

    @property
    def write_ack(self) -> str:
        """``"all"``: a block is acknowledged once every chunk is durable; ``"quorum"``: once
        ``ack_quorum`` are."""
        return self._writer.write_ack

    @write_ack.setter
    def write_ack(self, value: str) -> None:
        self._writer.write_ack = value

    @property
    def hedge_extra(self) -> int:
        """Nodes reserved on beyond what a block needs, when that many more are live."""
        return self._writer.hedge_extra

    @hedge_extra.setter
    def hedge_extra(self, value: int) -> None:
        self._writer.hedge_extra = value

    @property
    def hedge_percentile(self) -> float:
        """A chunk read slower than this percentile of its size class is raced."""
        return self._hedging.percentile

    @hedge_percentile.setter
    def hedge_percentile(self, value: float) -> None:
        self._hedging.percentile = value

    @property
    def hedge_share(self) -> float:
        """At most this share of reads may hedge (stuck reads aside)."""
        return self._hedging.share

    @hedge_share.setter
    def hedge_share(self, value: float) -> None:
        self._hedging.share = value

    @property
    def hedge_reads(self) -> bool:
        """False: reads never race (no tail hedges, no stuck or slow nodes): for comparisons."""
        return self._hedging.enabled

    @hedge_reads.setter
    def hedge_reads(self, value: bool) -> None:
        self._hedging.enabled = value

    # -- placement ---------------------------------------------------------------------------
    def live_nodes(self) -> list[int]:
        return self._placement.live_nodes()

    def min_live_nodes(self, enc: Encoding) -> int:
        """The fewest live nodes (chunks) a write of ``enc`` accepts (``min_live_nodes``)."""
        return self._placement.min_write_chunks(enc)

    @property
    def write_margin(self) -> int:
        """Chunks beyond a read's need a degraded write must place (default 1: data chunks
        + 1 for RS, 2 for r3); the width itself turns degraded writes off."""
        return self._placement.write_margin

    @write_margin.setter
    def write_margin(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"write_margin must be a whole number >= 1, not {value!r}")
        self._placement.write_margin = value

    def place(self, enc: Encoding, count: int, *, avoid: Iterable[int] = ()) -> list[Target]:
        """``count`` (node, disk) targets on live nodes, distinct nodes (and domains) first.
        Raises NotEnoughNodesError when the live nodes cannot hold the block safely."""
        return self._placement.place(enc, count, avoid=avoid)

    async def _reserve_targets(self, enc: Encoding, nbytes: int) -> list[Target]:
        return await self._writer.reserve_targets(enc, nbytes)

    # -- write -------------------------------------------------------------------------------
    def ack_quorum(self, enc: Encoding) -> int:
        """Chunks that must be durable before a block is acknowledged."""
        return self._writer.ack_quorum(enc)

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

        Returns once ``ack_quorum(enc)`` chunks are durable; the record names every chunk,
        the stragglers' included. Raises NotEnoughNodesError if too few nodes accept chunks.
        On any error or cancellation the chunks already written are deleted (best effort;
        repair's garbage collection removes what could not be). ``holds``: kept as long as
        any of its chunk writes runs (``BlockWriter.write_block``). ``sync=False``: the
        chunks are written but durable only once their disks are synced (``sync_chunks``).
        """
        await self.pacing.take(nbytes(block))
        return await self._writer.write_block(
            enc, block, block_id=block_id, file_id=file_id, holds=holds, sync=sync
        )

    async def sync_chunks(self, records: Sequence[BlockRecord]) -> list[BlockRecord]:
        """Make the chunks of ``records``, written with ``sync=False``, durable: one
        ``sync_disk`` per node disk they are on, all at once, each block done once its
        write quorum of chunks is on synced disks (``BlockWriter.sync_chunks``). A block
        that failed syncs (nodes gone down since) leave short of its minimum has its other
        chunks made again from the synced ones, as repair would, and written synced on
        other nodes. Returns the records to commit: those, with the rebuilt blocks' new
        placements. Raises NotEnoughNodesError when a block cannot be rebuilt."""
        recs = list(records)
        short = await self._writer.sync_chunks(recs)
        for pos, synced in sorted(short.items()):
            recs[pos] = await self._rebuild_unsynced(recs[pos], synced)
        return recs

    async def _rebuild_unsynced(self, rec: BlockRecord, synced: set[int]) -> BlockRecord:
        """``rec`` with the chunks not in ``synced`` (indexes) made again from those that
        are and written synced elsewhere; the others deleted where their nodes answer."""
        enc = Encoding.parse(rec.encoding)
        keep = [c for c in rec.chunks if c.index in synced]
        if len(keep) < enc.min_chunks:
            raise NotEnoughNodesError(
                f"block {rec.block_id:016x}: {len(keep)} of its chunks are on disks that "
                f"could be synced, {enc.min_chunks} needed to make the others again"
            )
        data = await asyncio.gather(*(self.scrub_chunk(c) for c in keep))
        sources = {c.index: d for c, d in zip(keep, data, strict=True)}
        lost = [i for i in range(enc.width) if i not in sources]
        rebuilt = codec_for(enc).reconstruct(sources, lost, rec.length)  # a copy, replicated
        new = await self.write_chunks(enc, rec.block_id, rebuilt, avoid={c.node for c in keep})
        await self.delete_chunks(c for c in rec.chunks if c.index not in synced)
        chunks = tuple(sorted(keep + new, key=lambda c: c.index))
        return BlockRecord(rec.block_id, rec.file_id, rec.length, rec.encoding, chunks)

    async def drain(self, wait: float = 60.0) -> None:
        """Wait for the stragglers of acknowledged blocks (at most ``wait`` seconds, then
        cancel them: repair rebuilds what they did not write)."""
        await self._writer.drain(wait)

    async def write_chunks(
        self, enc: Encoding, block_id: int, raw: dict[int, Payload], *, avoid: set[int]
    ) -> list[ChunkPlacement]:
        """Store rebuilt chunks (repair) on live nodes not in ``avoid``, as distinct as can be.
        On failure deletes what it wrote and raises."""
        return await self._writer.write_chunks(enc, block_id, raw, avoid=avoid)

    async def delete_chunks(self, chunks: Iterable[ChunkPlacement]) -> int:
        """Delete chunks, ignoring nodes that are down. Returns how many were deleted."""
        return await self._writer.delete_chunks(chunks)

    # -- read --------------------------------------------------------------------------------
    async def fetch_chunk(self, c: ChunkPlacement) -> Payload:
        """One chunk's raw (decompressed) bytes, checked end to end against the Block layer."""
        await self.pacing.take(c.stored_len)
        return await self._reader.fetch_chunk(c)

    async def scrub_chunk(self, c: ChunkPlacement) -> Payload:
        """``fetch_chunk`` with every piece checked too (scrub and repair)."""
        return await self._reader.scrub_chunk(c)

    async def fetch_chunk_into(self, c: ChunkPlacement, dest: memoryview) -> memoryview:
        """``fetch_chunk`` for an uncompressed chunk, received straight into ``dest`` (exactly
        its length); returns ``dest``."""
        await self.pacing.take(dest.nbytes)
        return await self._reader.fetch_chunk_into(c, dest)

    async def read_range(
        self, rec: BlockRecord, lo: int, hi: int, *, into: memoryview | None = None
    ) -> list[tuple[int, Payload]]:
        """Pieces ``(offset in the block, bytes)`` that together cover [lo, hi) of a block;
        with ``into`` (``hi - lo`` bytes), the bytes land there instead and the list is empty.
        Reed-Solomon ranges fetch only the data chunks they overlap (``BlockReader``)."""
        await self.pacing.take(hi - lo)
        return await self._reader.read_range(rec, lo, hi, into=into)

    async def read_block(
        self,
        rec: BlockRecord,
        *,
        have: dict[int, Payload] | None = None,
        failed: Iterable[int] = (),
    ) -> Payload:
        """The block's exact bytes, or DataUnavailableError. Never wrong bytes.

        ``have``: chunks already fetched and checked; ``failed``: indexes not to try again.
        """
        await self.pacing.take(rec.length)
        return await self._reader.read_block(rec, have=have, failed=failed)

    # -- hedged reads ------------------------------------------------------------------------
    def hedge_after(self, size: int) -> float:
        """Seconds after which a read of a chunk of ``size`` bytes is slow: the
        ``hedge_percentile`` of recent reads of chunks of that size class, or
        ``DEFAULT_HEDGE_AFTER`` until there are enough of them)."""
        return self._hedging.hedge_after(size)

    def is_slow(self, node: int, now: float | None = None) -> bool:
        """Marked slow lately (and read hedging is on)."""
        return self._hedging.is_slow(node, now)


__all__ = [
    "DEFAULT_HEDGE_AFTER",
    "MAX_STRAGGLERS",
    "SLOW_FACTOR",
    "SLOW_MIN",
    "SLOW_NODE_PENALTY",
    "STUCK_FACTOR",
    "DataPath",
    "HedgeStats",
    "new_chunk_id",
]
