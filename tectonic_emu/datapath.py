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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import itertools
import logging
import random
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

from tectonic_emu.chunkstore.base import BytesLike, StorageNode
from tectonic_emu.coding import Encoding, codec_for, crc32c, decompress, maybe_compress
from tectonic_emu.config import Compression
from tectonic_emu.errors import (
    ChunkCorruptError,
    DataUnavailableError,
    NoSpaceError,
    NotEnoughNodesError,
)
from tectonic_emu.metadata.records import BlockRecord, ChunkPlacement

T = TypeVar("T")
log = logging.getLogger(__name__)

# Stragglers (chunk writes still running after their block was acknowledged) a DataPath keeps
# before write_block waits for one to finish: bounds the memory they hold.
MAX_STRAGGLERS = 32
# Latency samples kept per chunk-size class, and how many before reads start hedging.
_LATENCY_SAMPLES = 256
_MIN_SAMPLES = 20
_NODE_SAMPLES = 4  # per node and size class, for slow-node detection
# Before that, a chunk read this slow is raced anyway (a cold client meeting a stuck node).
DEFAULT_HEDGE_AFTER = 1.0
# Over the hedge share, a read still hedges once it is this many times the hedge delay late.
STUCK_FACTOR = 10.0
# A node whose fastest read of its last _NODE_SAMPLES (of a size class) took over SLOW_FACTOR
# times the median of the other nodes' fastest reads plus SLOW_MIN seconds, or caught stuck
# (a read STUCK_FACTOR times late), is read around for SLOW_NODE_PENALTY seconds: replicas elsewhere
# first, parity in place of its chunks in whole-block reads (as many reads, one rebuild), so a
# wrong guess costs a little CPU, never extra I/O. Minimums, not medians: queueing and cold
# reads make any node's median swing 2-3x, but leave some of its reads fast, while a node that
# delays everything has no fast read left.
SLOW_FACTOR = 2.0
SLOW_MIN = 0.02
SLOW_NODE_PENALTY = 10.0

# Below this many bytes a checksum or copy is cheaper than a hop to a worker thread.
_INLINE_CPU_BYTES = 256 << 10


def _is_full(exc: BaseException) -> bool:
    return getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT)


@dataclass(slots=True)
class _BlockWrite:
    """Shared state of the chunk writes of one block."""

    taken: set[tuple[int, int]]
    failed: set[int] = field(default_factory=set)
    full: set[int] = field(default_factory=set)  # failed for want of space (ENOSPC)
    current: dict[int, ChunkPlacement] = field(default_factory=dict)  # the latest attempt
    written: list[ChunkPlacement] = field(default_factory=list)  # durable
    acked: bool = False  # the block was acknowledged: stragglers no longer retry


@dataclass(slots=True)
class HedgeStats:
    reads: int = 0  # chunk-read operations (a block or range read)
    hedged_reads: int = 0  # of which raced a second replica or a decode, on tail latency
    slow_node_reads: int = 0  # whole-block reads that read parity around a node marked slow
    slow_nodes_marked: int = 0  # times a node was found slow (stuck, or slow for a while)
    writes: int = 0
    hedged_writes: int = 0  # reserved on more nodes than needed
    stragglers: int = 0  # chunk writes left running after the block was acknowledged
    straggler_failures: int = 0  # of which failed (repair rebuilds those chunks)


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
        write_ack: str = "all",
        hedge_extra: int = 2,
        hedge_percentile: float = 95.0,
        hedge_share: float = 0.05,
        hedge_reads: bool = True,
        domains: Sequence[str] | None = None,
    ) -> None:
        if write_ack not in ("all", "quorum"):
            raise ValueError(f"write_ack must be 'all' or 'quorum', not {write_ack!r}")
        self.nodes = nodes
        # Each node's failure domain (its host, in a cluster across hosts): a block's chunks
        # go to distinct domains first. None: every node is its own.
        self.domains = list(domains) if domains is not None else None
        if self.domains is not None and len(self.domains) != len(nodes):
            raise ValueError(f"{len(self.domains)} failure domains for {len(nodes)} nodes")
        self.disks_per_node = disks_per_node
        self.compression: Compression = compression
        self.write_ack = write_ack
        self.hedge_extra = hedge_extra
        self.hedge_percentile = hedge_percentile
        self.hedge_share = hedge_share
        # False: reads never race (no tail hedges, no stuck or slow nodes): for comparisons.
        self.hedge_reads = hedge_reads
        self.stats = HedgeStats()
        self._cpu = cpu
        self._rng = random.Random()
        # Insertion-ordered (a dict), so the oldest straggler is the first key.
        self._stragglers: dict[asyncio.Future[None], None] = {}
        # Nodes whose chunk reads had to be hedged: read last until this time.monotonic().
        self._slow_until: dict[int, float] = {}
        self._node_latency: dict[tuple[int, int], collections.deque[float]] = {}
        self._latency: dict[int, collections.deque[float]] = {}

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
        """``count`` (node, disk) targets on live nodes, distinct nodes first, and with
        ``domains``, distinct domains before a second node of any one domain.

        Raises NotEnoughNodesError when the live nodes cannot hold the block safely.
        """
        avoid_set = set(avoid)
        all_live = self.live_nodes()
        live = [n for n in all_live if n not in avoid_set]
        self._rng.shuffle(live)
        if self.domains is not None:
            live = self._across_domains(live)
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

    def _across_domains(self, nodes: list[int]) -> list[int]:
        """``nodes`` (shuffled) reordered to take one node of each domain in turn."""
        assert self.domains is not None
        by_domain: dict[str, list[int]] = {}
        for n in nodes:
            by_domain.setdefault(self.domains[n], []).append(n)
        rows = list(by_domain.values())
        return [n for turn in itertools.zip_longest(*rows) for n in turn if n is not None]

    # -- write -----------------------------------------------------------------------------
    def _prepare(self, enc: Encoding, block: BytesLike) -> list[tuple[BytesLike, int, int, int]]:
        """(stored bytes, flags, crc32c, raw length) for each chunk index. Runs in a worker."""
        codec = codec_for(enc)
        chunks = codec.encode(block)
        if enc.kind == "replication":
            return [self._prepare_one(block)] * enc.width
        return [self._prepare_one(chunk) for chunk in chunks]

    def ack_quorum(self, enc: Encoding) -> int:
        """Chunks that must be durable before a block is acknowledged."""
        if self.write_ack == "all" or enc.width <= 2:
            return enc.width
        return max(enc.min_chunks + 1, enc.width - 1)

    async def _reserve_targets(self, enc: Encoding, nbytes: int) -> list[tuple[int, int]]:
        """``enc.width`` targets on distinct nodes; with spare live nodes, the first to accept
        a reservation among ``hedge_extra`` more than needed. With failure domains, the race
        goes on until the accepted targets span as many domains as the candidates that have
        not failed can (or every answer is in)."""
        extra = min(self.hedge_extra, len(self.live_nodes()) - enc.width)
        if extra <= 0:
            return self.place(enc, enc.width)
        self.stats.hedged_writes += 1
        candidates = self.place(enc, enc.width + extra)
        asks = {asyncio.ensure_future(self.nodes[n].reserve(nbytes)): (n, d) for n, d in candidates}
        accepted: list[tuple[int, int]] = []
        failed: set[int] = set()
        full: set[int] = set()
        pending = set(asks)
        try:
            while pending and not self._enough(accepted, candidates, failed, enc.width):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for ask in done:
                    exc = ask.exception()
                    if exc is None:
                        accepted.append(asks[ask])
                    elif isinstance(exc, OSError):
                        failed.add(asks[ask][0])
                        if _is_full(exc):
                            full.add(asks[ask][0])
                    else:
                        raise exc
        finally:
            for ask in pending:
                ask.cancel()
        accepted = self._spread(accepted)
        taken = set(accepted)
        while len(accepted) < enc.width:  # too few accepted: fill as a failed write would
            target = self._replacement(enc, taken, failed, full)
            taken.add(target)
            accepted.append(target)
        return accepted[: enc.width]

    def _spread(self, targets: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """``targets`` in order, one per failure domain in turn (as ``place`` orders them)."""
        if self.domains is None:
            return targets
        order = self._across_domains([n for n, _ in targets])
        disk = dict(targets)
        return [(n, disk[n]) for n in order]

    def _enough(
        self,
        accepted: list[tuple[int, int]],
        candidates: list[tuple[int, int]],
        failed: set[int],
        width: int,
    ) -> bool:
        if len(accepted) < width:
            return False
        if self.domains is None:
            return True
        domains = self.domains
        have = {domains[n] for n, _ in self._spread(accepted)[:width]}
        could = {domains[n] for n, _ in candidates if n not in failed}
        return len(have) >= min(width, len(could))

    async def write_block(
        self, enc: Encoding, block: BytesLike, *, block_id: int, file_id: int
    ) -> BlockRecord:
        """Encode and durably store one block's chunks. The caller commits the record.

        Returns once ``ack_quorum(enc)`` chunks are durable; the record names every chunk,
        the stragglers' included. Raises NotEnoughNodesError if too few nodes accept chunks.
        On any error or cancellation the chunks already written are deleted (best effort;
        repair's garbage collection removes what could not be).
        """
        prepared = await self._cpu_call(len(block), self._prepare, enc, block)
        targets = await self._reserve_targets(enc, max(len(p[0]) for p in prepared))
        state = _BlockWrite(taken=set(targets))
        self.stats.writes += 1
        tasks = [
            asyncio.ensure_future(self._put_chunk(enc, block_id, i, prepared[i], target, state))
            for i, target in enumerate(targets)
        ]
        quorum = self.ack_quorum(enc)
        pending = set(tasks)
        try:
            durable = 0
            while durable < quorum:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                    durable += 1
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.shield(self._abandon(tasks, state))
            raise
        state.acked = True
        for task in pending:
            self.stats.stragglers += 1
            self._stragglers[task] = None
            task.add_done_callback(self._straggler_done)
        while len(self._stragglers) > MAX_STRAGGLERS:
            # A node that slow would hold every writer back: give up on its oldest chunk
            # write (the record names it; repair rebuilds it) rather than wait.
            oldest = next(iter(self._stragglers))
            self._stragglers.pop(oldest)
            oldest.cancel()
        chunks = sorted(state.current.values(), key=lambda c: c.index)
        return BlockRecord(block_id, file_id, len(block), enc.name, tuple(chunks))

    async def _abandon(self, tasks: Sequence[asyncio.Future[None]], state: _BlockWrite) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.delete_chunks(state.written)

    def _straggler_done(self, task: asyncio.Future[None]) -> None:
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
        _, late = await asyncio.wait(set(self._stragglers), timeout=wait)
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)

    async def write_chunks(
        self, enc: Encoding, block_id: int, raw: dict[int, BytesLike], *, avoid: set[int]
    ) -> list[ChunkPlacement]:
        """Store rebuilt chunks (repair) on live nodes not in ``avoid``, as distinct as can be.
        On failure deletes what it wrote and raises."""
        targets = self.place(enc, len(raw), avoid=avoid)
        # Nodes in ``avoid`` hold chunks of the block: count all their disks as taken.
        state = _BlockWrite(
            taken=set(targets) | {(n, d) for n in avoid for d in range(self.disks_per_node)}
        )
        try:
            for (index, data), target in zip(sorted(raw.items()), targets, strict=True):
                prep = await self._cpu_call(len(data), self._prepare_one, data)
                await self._put_chunk(enc, block_id, index, prep, target, state)
        except BaseException:
            await asyncio.shield(self.delete_chunks(state.written))
            raise
        return state.written

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
        state: _BlockWrite,
    ) -> None:
        """Write one chunk; if its node fails, retry (under a new id) on a replacement, unless
        the block was acknowledged meanwhile (its record names this attempt: repair will
        rebuild the chunk)."""
        stored, flags, crc, raw_len = prepared
        node, disk = target
        while True:
            chunk_id = new_chunk_id(block_id, index)
            placement = ChunkPlacement(
                index, node, disk, chunk_id, crc, len(stored), flags, raw_len
            )
            state.current[index] = placement
            try:
                await self.nodes[node].write_chunk(disk, chunk_id, stored, crc32c=crc, flags=flags)
            except (OSError, EOFError) as exc:
                if state.acked:
                    raise
                state.failed.add(node)
                if _is_full(exc):
                    state.full.add(node)
                node, disk = self._replacement(enc, state.taken, state.failed, state.full)
                state.taken.add((node, disk))
                continue
            state.written.append(placement)
            return

    def _replacement(
        self,
        enc: Encoding,
        taken: set[tuple[int, int]],
        failed: set[int],
        full: Collection[int] = (),
    ) -> tuple[int, int]:
        """A target for a chunk whose node failed: a live node the block does not use yet,
        else (as a degraded write does) a free disk of a node it uses; the block is then below
        redundancy until repair moves it. Raises NoSpaceError when none is left and some of
        the ``failed`` nodes are ``full``, NotEnoughNodesError when none is left otherwise."""
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
        if full:
            raise NoSpaceError(
                f"encoding {enc}: no room left for a chunk (nodes {sorted(full)} are full, "
                f"{len(failed)} failed, {len(self.live_nodes())} of {len(self.nodes)} up)"
            )
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
    def _decode(self, c: ChunkPlacement, stored: BytesLike) -> BytesLike:
        if c.flags:
            return decompress(stored, c.flags, c.raw_len)
        return stored

    async def fetch_chunk(self, c: ChunkPlacement) -> BytesLike:
        """One chunk's raw (decompressed) bytes, checked end to end against the Block layer."""
        t0 = time.monotonic()
        stored, info = await self.nodes[c.node].read_chunk(c.disk, c.chunk_id)
        self._record_latency(c.node, c.stored_len, time.monotonic() - t0)
        # Every node checks the payload against the checksum stored with it (a served node's
        # client does so after the wire); that checksum must be the one the Block layer
        # recorded when the block was written. One pass over the bytes, end to end.
        if len(stored) != c.stored_len or info.crc32c != c.crc32c:
            raise ChunkCorruptError(f"chunk {c.chunk_id} fails its checksum", f"node {c.node}")
        if not c.flags:
            return stored
        return await self._cpu_call(c.raw_len, self._decode, c, stored)

    async def fetch_chunk_into(self, c: ChunkPlacement, dest: memoryview) -> memoryview:
        """``fetch_chunk`` for an uncompressed chunk, received straight into ``dest`` (exactly
        its length); returns ``dest``."""
        t0 = time.monotonic()
        info = await self.nodes[c.node].read_chunk_into(c.disk, c.chunk_id, dest)
        self._record_latency(c.node, c.stored_len, time.monotonic() - t0)
        if dest.nbytes != c.stored_len or info.crc32c != c.crc32c:
            raise ChunkCorruptError(f"chunk {c.chunk_id} fails its checksum", f"node {c.node}")
        return dest

    # -- hedged reads ----------------------------------------------------------------------
    def _record_latency(self, node: int, size: int, seconds: float) -> None:
        """One chunk read's latency, for the hedge delay of its size class and for the
        node's own record: a node none of whose recent reads was fast is marked slow (a
        persistently slow node fills the tail percentile itself, so the percentile alone
        stops flagging it)."""
        size_class = size.bit_length()
        samples = self._latency.get(size_class)
        if samples is None:
            samples = self._latency[size_class] = collections.deque(maxlen=_LATENCY_SAMPLES)
        samples.append(seconds)
        mine = self._node_latency.get((node, size_class))
        if mine is None:
            mine = self._node_latency[(node, size_class)] = collections.deque(maxlen=_NODE_SAMPLES)
        mine.append(seconds)
        if len(mine) < _NODE_SAMPLES:
            return  # judge a node on a full window only: first reads include connecting
        # Even its fastest recent read is well over what the other nodes' fastest reads take:
        # a delay the node adds to everything. Queueing (in the client, the network, the
        # disks) raises every node's fastest read alike and leaves the comparison alone.
        others = [
            min(window)
            for (n, c), window in self._node_latency.items()
            if c == size_class and n != node and len(window) == _NODE_SAMPLES
        ]
        if len(others) < 3:
            return
        others.sort()
        if min(mine) > SLOW_FACTOR * others[len(others) // 2] + SLOW_MIN:
            self._mark_slow(node)

    def is_slow(self, node: int, now: float | None = None) -> bool:
        """Marked slow lately (and read hedging is on)."""
        if not self.hedge_reads:
            return False
        return self._slow_until.get(node, 0.0) > (time.monotonic() if now is None else now)

    def _mark_slow(self, node: int) -> None:
        if not self.hedge_reads:
            return
        now = time.monotonic()
        if self._slow_until.get(node, 0.0) <= now:
            self.stats.slow_nodes_marked += 1
            log.info("node %d reads slowly: read around for %.0f s", node, SLOW_NODE_PENALTY)
        self._slow_until[node] = now + SLOW_NODE_PENALTY

    def hedge_after(self, size: int) -> float:
        """Seconds after which a read of a chunk of ``size`` bytes is slow: the
        ``hedge_percentile`` of recent reads of chunks of that size class, or
        ``DEFAULT_HEDGE_AFTER`` until there are enough of them)."""
        samples = self._latency.get(size.bit_length())
        if samples is None or len(samples) < _MIN_SAMPLES:
            return DEFAULT_HEDGE_AFTER
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(len(ordered) * self.hedge_percentile / 100))]

    def _may_hedge(self) -> bool:
        return self.stats.hedged_reads < self.hedge_share * self.stats.reads

    def _count_read(self) -> None:
        self.stats.reads += 1
        if self.stats.reads >= 10_000:  # a sliding share: old reads weigh less
            self.stats.reads //= 2
            self.stats.hedged_reads //= 2

    async def _race(
        self,
        primary: list[ChunkPlacement],
        spare: list[ChunkPlacement],
        *,
        enough: int,
        direct: dict[int, memoryview] | None = None,
    ) -> tuple[dict[int, BytesLike], set[int]]:
        """Fetch ``primary``; if they are not all in after the hedge delay (and the hedge
        share allows), also fetch as many ``spare`` chunks as primaries are late. Stops when
        every primary is in, or (once hedged) when ``enough`` chunks are in, or when a primary
        failed and nothing was hedged. Returns (good chunks by index, failed indexes).

        ``direct``: primaries received straight into these buffers (their result is the
        buffer itself); spares never are, so two reads never write one buffer."""
        direct = direct or {}
        tasks = {
            asyncio.ensure_future(
                self.fetch_chunk_into(c, direct[c.index])
                if c.index in direct
                else self.fetch_chunk(c)
            ): c
            for c in primary
        }
        wanted = {c.index for c in primary}
        good: dict[int, BytesLike] = {}
        failed: set[int] = set()
        delay: float | None = self.hedge_after(max(c.stored_len for c in primary))
        hedged = stuck = False
        try:
            while tasks and not wanted <= good.keys():
                if hedged and len(good) >= enough:
                    break
                if failed & wanted and not hedged:
                    break
                timeout = delay if not hedged and spare else None
                done, _ = await asyncio.wait(
                    tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    if not self.hedge_reads:
                        delay = None
                        continue
                    if not stuck and not self._may_hedge():
                        # Over the hedge share: wait longer. A read this late is a stuck
                        # node, not tail latency, and is raced whatever the share.
                        stuck = True
                        delay = max(STUCK_FACTOR * (delay or 0.0), DEFAULT_HEDGE_AFTER)
                        continue
                    delay = None  # hedge once per read
                    hedged = True
                    self.stats.hedged_reads += 1
                    if stuck:  # tail latency is normal; a node this late is not
                        for c in tasks.values():
                            self._mark_slow(c.node)
                    late = len(wanted - good.keys())
                    for c in spare[:late]:
                        tasks[asyncio.ensure_future(self.fetch_chunk(c))] = c
                    spare = spare[late:]
                    continue
                for task in done:
                    c = tasks.pop(task)
                    exc = task.exception()
                    if exc is None:
                        good[c.index] = task.result()
                    elif isinstance(exc, (OSError, EOFError)):
                        failed.add(c.index)
                    else:
                        raise exc
        finally:
            for task in tasks:
                task.cancel()
            # Let the cancelled fetches unwind; their results (if any) are not needed.
            await asyncio.gather(*tasks, return_exceptions=True)
        return good, failed

    def _read_order(self, chunks: Iterable[ChunkPlacement], data: int) -> list[ChunkPlacement]:
        """Live nodes first; for RS, data chunks before parity (no decoding needed)."""
        spread = self._rng.random()
        now = time.monotonic()
        return sorted(
            chunks,
            key=lambda c: (
                not self.nodes[c.node].available,
                self.is_slow(c.node, now),
                c.index >= data,
                (c.index + spread * 1000) % 1000 if data == 1 else c.index,
            ),
        )

    async def read_range(
        self, rec: BlockRecord, lo: int, hi: int, *, into: memoryview | None = None
    ) -> list[tuple[int, BytesLike]]:
        """Pieces ``(offset in the block, bytes)`` that together cover [lo, hi) of a block;
        with ``into`` (``hi - lo`` bytes), the bytes land there instead and the list is empty.

        For Reed-Solomon only the data chunks overlapping the range are fetched, and no block
        is assembled: its bytes go straight from the chunk buffers to the caller (a fresh
        48 MiB block per read would cost more than the read on this VM); chunks the range
        covers whole are received straight into ``into``. When one of them is missing,
        corrupt, on a node that is down, or slow (hedged), the block is decoded from any D
        chunks.
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
                self._count_read()
                direct: dict[int, memoryview] = {}
                if into is not None:
                    for i in wanted:
                        a, b = starts[i], starts[i] + sizes[i]
                        if not by_index[i].flags and lo <= a and b <= hi:
                            direct[i] = into[a - lo : b - lo]
                spare = [
                    c
                    for c in self._read_order(rec.chunks, enc.data)
                    if c.index not in wanted and self.nodes[c.node].available
                ]
                primary = [by_index[i] for i in wanted]
                now = time.monotonic()
                slow = [c for c in primary if self.is_slow(c.node, now)]
                fast_spare = [c for c in spare if not self.is_slow(c.node, now)]
                if slow and len(wanted) == enc.data and len(fast_spare) >= len(slow):
                    # A whole-block range with a chunk on a node marked slow: read a parity
                    # chunk in its place (as many reads as before) and rebuild it. A smaller
                    # range would need D reads to rebuild one chunk: it reads the slow one.
                    self.stats.slow_node_reads += 1
                    primary = [c for c in primary if c not in slow] + fast_spare[: len(slow)]
                    spare = [c for c in spare if c not in primary] + slow
                    for c in slow:
                        direct.pop(c.index, None)
                have, failed = await self._race(primary, spare, enough=enc.data, direct=direct)
                missing = [i for i in wanted if i not in have]
                if missing:
                    # Rebuild just the data chunks the range lacks, from any D good chunks
                    # (fetching more if needed): no 48 MiB block is assembled.
                    good = await self._collect(rec, enc, have, failed)
                    missing = [i for i in wanted if i not in good]  # (may have come in now)
                    rebuilt: dict[int, BytesLike] = {}
                    if missing:
                        rebuilt = await self._cpu_call(
                            sum(sizes[i] for i in missing),
                            codec_for(enc).reconstruct,
                            good,
                            missing,
                            rec.length,
                        )
                    have = {**good, **rebuilt}
                pieces: list[tuple[int, BytesLike]] = []
                for i in wanted:
                    a, b = max(lo, starts[i]), min(hi, starts[i] + sizes[i])
                    piece = memoryview(have[i])[a - starts[i] : b - starts[i]]
                    if into is None:
                        pieces.append((a, piece))
                    elif have[i] is not direct.get(i):
                        into[a - lo : b - lo] = piece
                return pieces
        if (
            enc.kind == "replication"
            and into is not None
            and (lo, hi) == (0, rec.length)
            and rec.chunks
            and not any(c.flags for c in rec.chunks)
        ):
            self._count_read()
            live = [c for c in self._read_order(rec.chunks, 1) if self.nodes[c.node].available]
            if live:
                good, failed = await self._race(
                    live[:1], live[1:], enough=1, direct={live[0].index: into}
                )
                if good:
                    got = next(iter(good.values()))
                    if got is not into:
                        into[:] = got
                    return []
                data = await self.read_block(rec, failed=failed)
                return _deliver(data, lo, hi, into)
        data = await self.read_block(rec)
        return _deliver(data, lo, hi, into)

    async def _collect(
        self,
        rec: BlockRecord,
        enc: Encoding,
        have: dict[int, BytesLike],
        failed: set[int],
    ) -> dict[int, BytesLike]:
        """At least ``enc.min_chunks`` good chunks of a block (``have`` and more), or
        DataUnavailableError."""
        order = self._read_order(rec.chunks, enc.min_chunks if enc.kind == "rs" else 1)
        good: dict[int, BytesLike] = dict(have)
        if not good:  # a plain read: race the chunks it needs against slow nodes
            self._count_read()
            live = [c for c in order if self.nodes[c.node].available and c.index not in failed]
            need = enc.min_chunks
            if len(live) >= need:
                good, raced_failed = await self._race(live[:need], live[need:], enough=need)
                failed |= raced_failed
        skip = set(good) | failed
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
        return good

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
        good = await self._collect(rec, enc, have or {}, set(failed))
        if enc.kind == "replication":
            return next(iter(good.values()))
        codec = codec_for(enc)
        return await self._cpu_call(rec.length, codec.decode, good, rec.length)


def _deliver(
    data: BytesLike, lo: int, hi: int, into: memoryview | None
) -> list[tuple[int, BytesLike]]:
    if into is None:
        return [(lo, memoryview(data)[lo:hi])]
    into[:] = memoryview(data)[lo:hi]
    return []


__all__ = ["DataPath", "new_chunk_id"]
