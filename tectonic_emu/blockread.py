"""Reading a block: the fewest chunks that return it, checked, raced when late, rebuilt.

Reads fetch the fewest chunks that can return the range asked for, require every chunk's
CRC32C to be the one the Block layer recorded, and fall back to other replicas or parity
chunks when a chunk is missing, corrupt or on a dead node. A chunk read slower than the
hedge delay (``ReadHedging``) is raced against another replica, or for Reed-Solomon against a
decode from parity.

A small range (at most ``RANGED_SHARE`` of the chunks it touches) reads only those chunks'
bytes it needs (``StorageNode.read_chunk_range``: the node reads and checks just the 8 KiB
pieces that hold them), where a read used to fetch whole chunks: 8 MiB for 4 KiB asked. A
replica that fails is raced against the next; a Reed-Solomon data chunk that fails is
decoded from the same bytes of D others (``ReedSolomonCodec.reconstruct_range``), not from
the block.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor

from tectonic_emu import buggify, clock
from tectonic_emu.chunkstore.base import StorageNode
from tectonic_emu.coding import Encoding, codec_for, crc32c, decompress
from tectonic_emu.coding.reed_solomon import ReedSolomonCodec
from tectonic_emu.coding.synthetic import Payload, Synthetic, put_into, sliced
from tectonic_emu.errors import ChunkCorruptError, DataUnavailableError, reason
from tectonic_emu.hedging import DEFAULT_HEDGE_AFTER, STUCK_FACTOR, ReadHedging
from tectonic_emu.metadata.records import BlockRecord, ChunkPlacement
from tectonic_emu.offload import offload

# A range reads only its bytes of the chunks it touches when it is at most this share of
# them; a larger one fetches them whole (one read each, sendfile on a served node).
RANGED_SHARE = 0.5


class BlockReader:
    """Chunk reads of one data path: its nodes, CPU pool and read-hedging state.

    ``rng`` spreads replicated reads over the replicas (shared with placement, so one seed
    fixes a run).
    """

    def __init__(
        self,
        nodes: Sequence[StorageNode],
        hedging: ReadHedging,
        *,
        cpu: Executor,
        rng: random.Random,
    ) -> None:
        self.nodes = nodes
        self.hedging = hedging
        self.stats = hedging.stats
        self._cpu = cpu
        self._rng = rng

    # -- one chunk ---------------------------------------------------------------------------
    async def fetch_chunk(self, c: ChunkPlacement) -> Payload:
        """One chunk's raw (decompressed) bytes, checked end to end against the Block layer."""
        t0 = clock.monotonic()
        stored, info = await self.nodes[c.node].read_chunk(c.disk, c.chunk_id)
        self.hedging.record(c.node, c.stored_len, clock.monotonic() - t0)
        if buggify.fires():  # a short read (docs/dst.md): the check below must catch it
            stored = stored[: len(stored) // 2]
        # Every node checks the payload against the checksum stored with it (a served node's
        # client does so after the wire); that checksum must be the one the Block layer
        # recorded when the block was written. One pass over the bytes, end to end.
        if len(stored) != c.stored_len or info.crc32c != c.crc32c:
            raise ChunkCorruptError(f"chunk {c.chunk_id} fails its checksum", f"node {c.node}")
        if not c.flags:
            return stored
        return await offload(self._cpu, c.raw_len, _decompressed, c, stored)

    async def scrub_chunk(self, c: ChunkPlacement) -> Payload:
        """``fetch_chunk`` for scrub and repair: each piece checked against the node's piece
        checksums as the whole is against the Block layer's. A bad entry in a chunk's piece
        table fails the small reads of its piece (they fall back), so scrub must see it and
        repair rewrite the chunk."""
        data, info = await self.nodes[c.node].read_chunk_range(c.disk, c.chunk_id, 0, c.stored_len)
        whole = await offload(self._cpu, c.stored_len, crc32c, data)
        if len(data) != c.stored_len or info.crc32c != c.crc32c or whole != c.crc32c:
            raise ChunkCorruptError(f"chunk {c.chunk_id} fails its checksum", f"node {c.node}")
        if not c.flags:
            return data
        return await offload(self._cpu, c.raw_len, _decompressed, c, data)

    async def fetch_chunk_into(self, c: ChunkPlacement, dest: memoryview) -> memoryview:
        """``fetch_chunk`` for an uncompressed chunk, received straight into ``dest`` (exactly
        its length); returns ``dest``."""
        t0 = clock.monotonic()
        info = await self.nodes[c.node].read_chunk_into(c.disk, c.chunk_id, dest)
        self.hedging.record(c.node, c.stored_len, clock.monotonic() - t0)
        if dest.nbytes != c.stored_len or info.crc32c != c.crc32c:
            raise ChunkCorruptError(f"chunk {c.chunk_id} fails its checksum", f"node {c.node}")
        return dest

    async def fetch_range(self, c: ChunkPlacement, start: int, stop: int) -> Payload:
        """Bytes ``[start, stop)`` of one uncompressed chunk, read and checked by its node
        piece by piece; the chunk must be the one the Block layer recorded (its length and
        checksum, as the node's header gives them)."""
        t0 = clock.monotonic()
        data, info = await self.nodes[c.node].read_chunk_range(
            c.disk, c.chunk_id, start, stop - start
        )
        self.hedging.record(c.node, stop - start, clock.monotonic() - t0)
        if info.stored_len != c.stored_len or info.crc32c != c.crc32c:
            raise ChunkCorruptError(f"chunk {c.chunk_id} is not the one written", f"node {c.node}")
        return data

    # -- blocks and ranges -------------------------------------------------------------------
    async def read_range(
        self, rec: BlockRecord, lo: int, hi: int, *, into: memoryview | None = None
    ) -> list[tuple[int, Payload]]:
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
        compressed = any(c.flags for c in rec.chunks)
        small = 0 < hi - lo <= RANGED_SHARE * rec.length
        if enc.kind == "replication" and small and not compressed:
            return await self._read_replica_range(rec, lo, hi, into)
        if enc.kind == "rs" and hi > lo:
            sizes, starts = _data_chunks(enc, rec.length)
            by_index = {c.index: c for c in rec.chunks}
            wanted = [
                i
                for i in range(enc.data)
                if sizes[i] and starts[i] < hi and starts[i] + sizes[i] > lo
            ]
            if all(i in by_index and self.nodes[by_index[i].node].available for i in wanted):
                if not compressed and hi - lo <= RANGED_SHARE * sum(sizes[i] for i in wanted):
                    pieces = await self._read_rs_pieces(
                        rec, enc, lo, hi, into, sizes, starts, wanted, by_index
                    )
                    if pieces is not None:
                        return pieces
                return await self._read_rs_range(rec, enc, lo, hi, into, sizes, starts, wanted)
        if (
            enc.kind == "replication"
            and into is not None
            and (lo, hi) == (0, rec.length)
            and rec.chunks
            and not compressed
        ):
            self.hedging.count_read()
            live = [c for c in self._read_order(rec.chunks, 1) if self.nodes[c.node].available]
            if live:
                good, failed = await self._race(
                    live[:1], live[1:], enough=1, direct={live[0].index: into}
                )
                if good:
                    got = next(iter(good.values()))
                    if got is not into:
                        put_into(into, got)
                    return []
                data = await self.read_block(rec, failed=failed)
                return _deliver(data, lo, hi, into)
        data = await self.read_block(rec)
        return _deliver(data, lo, hi, into)

    async def _read_replica_range(
        self, rec: BlockRecord, lo: int, hi: int, into: memoryview | None
    ) -> list[tuple[int, Payload]]:
        """A small range of a replicated block: its bytes of one replica, raced against the
        next when late, the next tried when it fails; the whole block from what is left
        when none returns them."""
        self.hedging.count_read()
        live = [c for c in self._read_order(rec.chunks, 1) if self.nodes[c.node].available]
        failed: dict[int, BaseException] = {}
        if live:
            good, failed = await self._race(
                live[:1], live[1:], enough=1, fetch=lambda c: self.fetch_range(c, lo, hi)
            )
            for c in live[1:]:  # one failed and nothing was hedged: the next, in turn
                if good or c.index in failed:
                    continue
                try:
                    good = {c.index: await self.fetch_range(c, lo, hi)}
                except (OSError, EOFError) as e:
                    failed[c.index] = e
            if good:
                return _deliver(next(iter(good.values())), 0, hi - lo, into, at=lo)
        data = await self.read_block(rec, failed=failed)
        return _deliver(data, lo, hi, into)

    async def _read_rs_pieces(
        self,
        rec: BlockRecord,
        enc: Encoding,
        lo: int,
        hi: int,
        into: memoryview | None,
        sizes: Sequence[int],
        starts: Sequence[int],
        wanted: list[int],
        by_index: dict[int, ChunkPlacement],
    ) -> list[tuple[int, Payload]] | None:
        """A small range of a Reed-Solomon block (``read_range``'s ``wanted`` data chunks,
        of ``sizes`` at ``starts``, all on live nodes) from its bytes of them; a chunk that
        fails is decoded from the same bytes of D others. None when too few return them, or
        the pieces are synthetic and one failed (the block path then decodes it)."""
        spans = {
            i: (max(lo, starts[i]) - starts[i], min(hi, starts[i] + sizes[i]) - starts[i])
            for i in wanted
        }
        self.hedging.count_read()
        # All of them, none cancelled when another fails (not raced: a late one is waited
        # for; a hedge would be a decode from D others).
        fetches = [self.fetch_range(by_index[i], *spans[i]) for i in wanted]
        if len(fetches) == 1:  # (no task to make)
            try:
                results: list[Payload | BaseException] = [await fetches[0]]
            except (OSError, EOFError) as e:
                results = [e]
        else:
            results = await asyncio.gather(*fetches, return_exceptions=True)
        have: dict[int, Payload] = {}
        failed: dict[int, BaseException] = {}
        for i, r in zip(wanted, results, strict=True):
            if isinstance(r, (OSError, EOFError)):
                failed[i] = r
            elif isinstance(r, BaseException):
                raise r
            else:
                have[i] = r
        lost = [i for i in wanted if i not in have]
        if lost:
            rebuilt = await self._decode_spans(rec, enc, spans, lost, failed)
            if rebuilt is None:
                return None
            have.update(rebuilt)
        pieces: list[tuple[int, Payload]] = []
        for i in wanted:
            at = starts[i] + spans[i][0]
            pieces += _deliver(have[i], 0, spans[i][1] - spans[i][0], into, at=at, base=lo)
        return pieces

    async def _decode_spans(
        self,
        rec: BlockRecord,
        enc: Encoding,
        spans: dict[int, tuple[int, int]],
        lost: list[int],
        failed: dict[int, BaseException],
    ) -> dict[int, Payload] | None:
        """The ``spans`` of the ``lost`` data chunks, decoded from the same columns of D
        other chunks (fetched anew, data chunks first), or None when too few return them or
        they are synthetic (the block path then decodes the block)."""
        a = min(spans[i][0] for i in lost)
        b = max(spans[i][1] for i in lost)
        codec = codec_for(enc)
        assert isinstance(codec, ReedSolomonCodec)
        sizes = codec.chunk_sizes(rec.length)
        order = [
            c
            for c in self._read_order(rec.chunks, enc.data)
            if c.index not in lost and c.index not in failed and self.nodes[c.node].available
        ]
        fragments: dict[int, Payload] = {}
        for c in order:
            if len(fragments) >= enc.data:
                break
            start, stop = min(a, sizes[c.index]), min(b, sizes[c.index])
            if start == stop:  # a short last data chunk: its columns here are zeros
                fragments[c.index] = b""
                continue
            try:
                fragments[c.index] = await self.fetch_range(c, start, stop)
            except (OSError, EOFError) as e:
                failed[c.index] = e
        if len(fragments) < enc.data or any(isinstance(f, Synthetic) for f in fragments.values()):
            return None
        rebuilt = await offload(
            self._cpu,
            (b - a) * enc.data,
            codec.reconstruct_range,
            fragments,
            lost,
            a,
            b,
            rec.length,
        )
        return {i: sliced(rebuilt[i], spans[i][0] - a, spans[i][1] - a) for i in lost}

    async def _read_rs_range(
        self,
        rec: BlockRecord,
        enc: Encoding,
        lo: int,
        hi: int,
        into: memoryview | None,
        sizes: Sequence[int],
        starts: Sequence[int],
        wanted: list[int],
    ) -> list[tuple[int, Payload]]:
        """``read_range`` of a Reed-Solomon block whose ``wanted`` data chunks (those the
        range overlaps, at ``starts`` in the block, of ``sizes``) are all on live nodes."""
        self.hedging.count_read()
        by_index = {c.index: c for c in rec.chunks}
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
        now = clock.monotonic()
        slow = [c for c in primary if self.hedging.is_slow(c.node, now)]
        fast_spare = [c for c in spare if not self.hedging.is_slow(c.node, now)]
        if slow and len(wanted) == enc.data and len(fast_spare) >= len(slow):
            # A whole-block range with a chunk on a node marked slow: read a parity chunk in
            # its place (as many reads as before) and rebuild it. A smaller range would need D
            # reads to rebuild one chunk: it reads the slow one.
            self.stats.slow_node_reads += 1
            primary = [c for c in primary if c not in slow] + fast_spare[: len(slow)]
            spare = [c for c in spare if c not in primary] + slow
            for c in slow:
                direct.pop(c.index, None)
        have, failed = await self._race(primary, spare, enough=enc.data, direct=direct)
        missing = [i for i in wanted if i not in have]
        if missing:
            # Rebuild just the data chunks the range lacks, from any D good chunks (fetching
            # more if needed): no 48 MiB block is assembled.
            good = await self._collect(rec, enc, have, set(failed), list(failed.values()))
            missing = [i for i in wanted if i not in good]  # (may have come in now)
            rebuilt: dict[int, Payload] = {}
            if missing:
                rebuilt = await offload(
                    self._cpu,
                    sum(sizes[i] for i in missing),
                    codec_for(enc).reconstruct,
                    good,
                    missing,
                    rec.length,
                )
            have = {**good, **rebuilt}
        pieces: list[tuple[int, Payload]] = []
        for i in wanted:
            a, b = max(lo, starts[i]), min(hi, starts[i] + sizes[i])
            piece = sliced(have[i], a - starts[i], b - starts[i])
            if into is None:
                pieces.append((a, piece))
            elif have[i] is not direct.get(i):
                put_into(into[a - lo : b - lo], piece)
        return pieces

    async def read_block(
        self,
        rec: BlockRecord,
        *,
        have: dict[int, Payload] | None = None,
        failed: Iterable[int] | Mapping[int, BaseException] = (),
    ) -> Payload:
        """The block's exact bytes, or DataUnavailableError. Never wrong bytes.

        ``have``: chunks already fetched and checked; ``failed``: indexes not to try again
        (with the errors they failed with, which the DataUnavailableError then names).
        """
        if rec.length == 0:
            return b""
        enc = Encoding.parse(rec.encoding)
        errors = list(failed.values()) if isinstance(failed, Mapping) else []
        good = await self._collect(rec, enc, have or {}, set(failed), errors)
        if enc.kind == "replication":
            return next(iter(good.values()))
        codec = codec_for(enc)
        return await offload(self._cpu, rec.length, codec.decode, good, rec.length)

    # -- internals ---------------------------------------------------------------------------
    async def _race(
        self,
        primary: list[ChunkPlacement],
        spare: list[ChunkPlacement],
        *,
        enough: int,
        direct: dict[int, memoryview] | None = None,
        fetch: Callable[[ChunkPlacement], Awaitable[Payload]] | None = None,
    ) -> tuple[dict[int, Payload], dict[int, BaseException]]:
        """Fetch ``primary``; if they are not all in after the hedge delay (and the hedge
        share allows), also fetch as many ``spare`` chunks as primaries are late. Stops when
        every primary is in, or (once hedged) when ``enough`` chunks are in, or when a primary
        failed and nothing was hedged. Returns (good chunks by index, the error of each
        index that failed).

        ``direct``: primaries received straight into these buffers (their result is the
        buffer itself); spares never are, so two reads never write one buffer. ``fetch``:
        how each chunk is read (a range of it), in place of ``fetch_chunk``."""
        direct = direct or {}
        get = fetch or self.fetch_chunk
        tasks = {
            asyncio.ensure_future(
                self.fetch_chunk_into(c, direct[c.index]) if c.index in direct else get(c)
            ): c
            for c in primary
        }
        wanted = {c.index for c in primary}
        good: dict[int, Payload] = {}
        failed: dict[int, BaseException] = {}
        delay: float | None = self.hedging.hedge_after(max(c.stored_len for c in primary))
        hedged = stuck = False
        try:
            while tasks and not wanted <= good.keys():
                if hedged and len(good) >= enough:
                    break
                if failed.keys() & wanted and not hedged:
                    break
                timeout = delay if not hedged and spare else None
                done, _ = await asyncio.wait(
                    tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    if not self.hedging.enabled:
                        delay = None
                        continue
                    if not stuck and not self.hedging.may_hedge():
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
                            self.hedging.mark_slow(c.node)
                    late = len(wanted - good.keys())
                    for c in spare[:late]:
                        tasks[asyncio.ensure_future(get(c))] = c
                    spare = spare[late:]
                    continue
                for task in [t for t in tasks if t in done]:  # fetch order, every run alike
                    c = tasks.pop(task)
                    exc = task.exception()
                    if exc is None:
                        good[c.index] = task.result()
                    elif isinstance(exc, (OSError, EOFError)):
                        failed[c.index] = exc
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
        now = clock.monotonic()
        return sorted(
            chunks,
            key=lambda c: (
                not self.nodes[c.node].available,
                self.hedging.is_slow(c.node, now),
                c.index >= data,
                (c.index + spread * 1000) % 1000 if data == 1 else c.index,
            ),
        )

    async def _collect(
        self,
        rec: BlockRecord,
        enc: Encoding,
        have: dict[int, Payload],
        failed: set[int],
        errors: list[BaseException],
    ) -> dict[int, Payload]:
        """At least ``enc.min_chunks`` good chunks of a block (``have`` and more), or
        DataUnavailableError naming the last few of ``errors`` (those of earlier attempts,
        and the ones met here). Before giving up, the chunks that failed their checksum
        here are read once more: a short or damaged read (a NIC, a cable, a buggify point)
        fails it as a bad sector does, and only the sector's fails again."""
        order = self._read_order(rec.chunks, enc.min_chunks if enc.kind == "rs" else 1)
        good: dict[int, Payload] = dict(have)
        corrupt: set[int] = set()  # indexes that failed their checksum here
        retried = False
        if not good:  # a plain read: race the chunks it needs against slow nodes
            self.hedging.count_read()
            live = [c for c in order if self.nodes[c.node].available and c.index not in failed]
            need = enc.min_chunks
            if len(live) >= need:
                good, raced_failed = await self._race(live[:need], live[need:], enough=need)
                failed |= raced_failed.keys()
                errors.extend(raced_failed.values())
                corrupt |= {i for i, e in raced_failed.items() if isinstance(e, ChunkCorruptError)}
        skip = set(good) | failed
        pending = [c for c in order if c.index not in skip]
        while len(good) < enc.min_chunks:
            want = enc.min_chunks - len(good)
            batch, pending = pending[:want], pending[want:]
            if not batch and corrupt and not retried:  # once more, those that failed it
                pending = [c for c in order if c.index in corrupt and c.index not in good]
                retried = True
                continue
            if not batch:
                why = "; ".join(reason(e) for e in errors[-3:]) or "no chunk left to try"
                raise DataUnavailableError(
                    f"block {rec.block_id:016x}: {len(good)} of {enc.min_chunks} needed chunks "
                    f"readable ({why})"
                )
            results = await asyncio.gather(
                *(self.fetch_chunk(c) for c in batch), return_exceptions=True
            )
            for c, r in zip(batch, results, strict=True):
                if isinstance(r, BaseException):
                    if not isinstance(r, (OSError, EOFError)):
                        raise r
                    errors.append(r)
                    if isinstance(r, ChunkCorruptError):
                        corrupt.add(c.index)
                else:
                    good[c.index] = r
        return good


def _decompressed(c: ChunkPlacement, stored: Payload) -> Payload:
    return decompress(stored, c.flags, c.raw_len)


@functools.lru_cache(maxsize=64)
def _data_chunks(enc: Encoding, length: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sizes of a Reed-Solomon block's data chunks and where each starts in the block
    (the block lengths a cluster uses are few: asked once each, not per read)."""
    sizes = tuple(codec_for(enc).chunk_sizes(length)[: enc.data])
    return sizes, tuple(itertools.accumulate((0, *sizes[:-1])))


def _deliver(
    data: Payload,
    lo: int,
    hi: int,
    into: memoryview | None,
    *,
    at: int | None = None,
    base: int | None = None,
) -> list[tuple[int, Payload]]:
    """Bytes [lo, hi) of ``data``, which sit at ``at`` in the block (default: ``lo``): as a
    piece, or copied into ``into``, which holds the block from ``base`` (default: ``at``)."""
    at = lo if at is None else at
    base = at if base is None else base
    piece = sliced(data, lo, hi)
    if into is None:
        return [(at, piece)]
    put_into(into[at - base : at - base + hi - lo], piece)
    return []


__all__ = ["BlockReader"]
