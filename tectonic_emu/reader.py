"""Reads of file bytes: the blocks a range needs, their parallel reads, and ``FileReader``.

``blocks_in`` looks up the blocks (and their records) that hold a byte range of a file, and
``read_blocks`` reads them through the data path, a few blocks at a time; ``Client``'s reads
are these two.

``Client.read_into`` looks the path, the file record and the file's block list up in a
metadata transaction on every call. A program reading a file in pieces (the mount's 8 MiB
segments, a checkpoint's parts) paid that per piece: for a 140 MB file 17 transactions, each
scanning all of the file's block entries, which made the mount's event loop, not the disks,
the limit of its reads. Tectonic's clients cache a file's block map instead, and so does
``FileReader``:

- A file's block list never changes once committed (files are append-only, and a replaced
  file is a new version with an id of its own), so the entries for [0, size) are read once.
- A hole (a File-layer entry with no block behind it, ``BlockEntry.is_hole``) has no record:
  its bytes are zeros, filled in here without asking any node.
- A block's record, where its chunks live, can change under repair. Records are fetched in
  batches as reads reach them, and a read that fails is retried once with its records looked
  up afresh, so a record moved by repair costs one retry, never a wrong or failed read.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from typing import Protocol

from tectonic_emu.argcheck import buffer_arg, int_arg
from tectonic_emu.buffers import BytesLike
from tectonic_emu.coding.synthetic import Payload, Synthetic, joined, put_into
from tectonic_emu.datapath import DataPath
from tectonic_emu.errors import (
    DataUnavailableError,
    InvalidArgumentError,
    NotFoundError,
    first_error,
)
from tectonic_emu.metadata.layers import Metadata, MetaTxn
from tectonic_emu.metadata.records import BlockEntry, BlockRecord, FileRecord

# Block records fetched in one transaction when a read needs one that is not held yet.
RECORD_BATCH = 32
# Zeros handed out for a hole per piece (a read of a 1 TiB hole through ``sink`` is pieces of
# this, never one 1 TiB buffer at once).
ZERO_PIECE = 8 << 20
_ZEROS = memoryview(bytes(ZERO_PIECE))  # sliced without copies; never written
# Most blocks one read has in flight, however small they are: each is a request queued on a
# node, and thousands at once starve the event loops of the client and the nodes alike.
MAX_BLOCKS_IN_FLIGHT = 64


def regular(f: FileRecord | None, file_id: int) -> FileRecord:
    """``f``, the record of file ``file_id``, if it is a regular file: NotFoundError when
    there is none, InvalidArgumentError for a symlink, fifo, device node or socket (the
    native client reads no bytes of those, and follows no links)."""
    if f is None:
        raise NotFoundError(f"no file {file_id:016x}")
    if f.kind != "file":
        where = f"file {file_id:016x}" if f.name is None else f.name
        raise InvalidArgumentError(f"not a regular file (a {f.kind})", where)
    return f


async def blocks_in(
    m: MetaTxn, file_id: int, start: int, size: int
) -> tuple[FileRecord, list[BlockEntry], list[BlockRecord | None]]:
    """File ``file_id``'s record, and the blocks (with their records; None for a hole) that
    hold bytes [start, start + size), to the end when ``size`` < 0: a 1 MiB read of a large
    file looks up one block record, not all of them."""
    f = regular(await m.files.get(file_id), file_id)
    end = f.size if size < 0 else min(f.size, start + size)
    blocks = [b for b in await m.files.blocks(file_id) if b.end > start and b.offset < end]
    recs: list[BlockRecord | None] = []
    for b in blocks:
        if b.is_hole:
            recs.append(None)
            continue
        rec = await m.blocks.get(b.block_id)
        assert rec is not None, "a committed block has a block record"
        recs.append(rec)
    return f, blocks, recs


def fill_zeros(
    b: BlockEntry,
    lo: int,
    hi: int,
    sink: Callable[[int, Payload], None],
    dest: memoryview | None,
) -> None:
    """Bytes [lo, hi) of hole ``b`` (offsets within it): zeros into ``dest`` (the
    destination of exactly those bytes), or handed to ``sink`` in pieces of ZERO_PIECE."""
    for at in range(lo, hi, ZERO_PIECE):
        n = min(ZERO_PIECE, hi - at)
        if dest is None:
            sink(b.offset + at, _ZEROS[:n])
        else:
            dest[at - lo : at - lo + n] = _ZEROS[:n]


async def read_blocks(
    datapath: DataPath,
    blocks: list[BlockEntry],
    recs: list[BlockRecord | None],
    start: int,
    end: int,
    sink: Callable[[int, Payload], None],
    *,
    into: memoryview | None = None,
    depth: int,
    ahead_bytes: int,
) -> None:
    """Read file bytes [start, end) of the given blocks (entries and their records, None for
    a hole, whose zeros are filled in without asking any node), handing ``sink(file
    offset, piece)`` each piece, or with ``into`` (the destination of [start, end))
    receiving them straight there. ``depth`` blocks are read at once, or more
    small ones up to ``ahead_bytes``. Raises DataUnavailableError rather than hand over
    wrong bytes."""
    wanted = [(b, r) for b, r in zip(blocks, recs, strict=True) if b.end > start and b.offset < end]

    async def one(b: BlockEntry, rec: BlockRecord | None) -> None:
        lo, hi = max(0, start - b.offset), min(b.length, end - b.offset)
        dest = None
        if into is not None:
            dest = into[b.offset + lo - start : b.offset + hi - start]
        if rec is None:
            fill_zeros(b, lo, hi, sink, dest)
            return
        pieces = await datapath.read_range(rec, lo, hi, into=dest)
        for at, piece in pieces:
            sink(b.offset + at, piece)

    if len(wanted) == 1:
        await one(*wanted[0])
        return
    # In flight: depth blocks, or more small ones up to the bytes of that many rs-6-3 blocks
    # (an r3 block is one 8 MiB chunk; one at a time per node leaves a served cluster's
    # nodes idle between round trips), never more than MAX_BLOCKS_IN_FLIGHT.
    largest = max((b.length for b, r in wanted if r is not None), default=1)
    width = min(max(depth, ahead_bytes // max(largest, 1)), MAX_BLOCKS_IN_FLIGHT)
    # ``width`` workers take the blocks in order from one iterator: a task per block, made
    # up front, was 29,496 tasks (and as many requests queued at once on the nodes) for a
    # read of a file of small blocks, which stalled this event loop for seconds.
    todo = iter(wanted)

    async def worker() -> None:
        for b, rec in todo:
            await one(b, rec)

    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(min(width, len(wanted))):
                tg.create_task(worker())
    except BaseExceptionGroup as eg:
        raise first_error(eg) from None


class BlockSource(Protocol):
    """What a ``FileReader`` reads through (``Client`` is one): the metadata, for block
    records, and the read of file bytes from blocks whose records it holds."""

    @property
    def meta(self) -> Metadata: ...

    async def read_blocks(
        self,
        blocks: list[BlockEntry],
        recs: list[BlockRecord | None],
        start: int,
        end: int,
        sink: Callable[[int, Payload], None],
        *,
        into: memoryview | None = None,
    ) -> None: ...


class FileReader:
    """The committed bytes [0, ``size``) of file ``file_id`` as of when it was opened
    (``Client.reader``), readable from many tasks at once."""

    def __init__(
        self,
        client: BlockSource,
        file_id: int,
        size: int,
        blocks: list[BlockEntry],
        path: str | None = None,
    ) -> None:
        self.client = client
        self.file_id = file_id
        self.path = path  # where it was opened (None: by id)
        self.size = size
        self._blocks = [b for b in blocks if b.offset < size]
        self._ends = [b.end for b in self._blocks]
        self._records: dict[int, BlockRecord] = {}
        self._fetching = asyncio.Lock()

    @property
    def block_ids(self) -> tuple[int, ...]:
        """The ids of the blocks it reads (which contents it opened: ``Replaced``)."""
        return tuple(b.block_id for b in self._blocks)

    def _covering(self, start: int, end: int) -> list[BlockEntry]:
        first = bisect.bisect_right(self._ends, start)
        last = first
        while last < len(self._blocks) and self._blocks[last].offset < end:
            last += 1
        return self._blocks[first:last]

    async def _records_for(self, blocks: list[BlockEntry]) -> list[BlockRecord | None]:
        if any(self._missing(b) for b in blocks):
            async with self._fetching:  # one fetch for readers wanting the same batch
                while missing := [b for b in blocks if self._missing(b)]:
                    await self._fetch_from(missing[0])
        return [None if b.is_hole else self._records[b.block_id] for b in blocks]

    def _missing(self, b: BlockEntry) -> bool:
        return not b.is_hole and b.block_id not in self._records

    def data_ranges(self) -> list[tuple[int, int]]:
        """The [start, end) ranges of the file's bytes that are not holes, in order and
        merged where they touch (a copy of the file can skip the rest: it reads as zeros)."""
        out: list[tuple[int, int]] = []
        for b in self._blocks:
            if b.is_hole:
                continue
            end = min(b.end, self.size)
            if out and out[-1][1] == b.offset:
                out[-1] = (out[-1][0], end)
            else:
                out.append((b.offset, end))
        return out

    async def _fetch_from(self, first: BlockEntry) -> None:
        """Records of up to RECORD_BATCH blocks from ``first`` on, in one transaction."""
        at = bisect.bisect_left(self._ends, first.end)
        batch = [b for b in self._blocks[at : at + RECORD_BATCH] if self._missing(b)]
        async with self.client.meta.view() as m:
            for b in batch:
                rec = await m.blocks.get(b.block_id)
                if rec is None:
                    raise NotFoundError(f"file {self.file_id:016x} was deleted")
                self._records[b.block_id] = rec

    async def read_into(self, offset: int, buf: BytesLike) -> int:
        """Read into ``buf`` (writable) from ``offset``; returns the byte count (0 at or past
        ``size``). Raises DataUnavailableError rather than return wrong bytes, NotFoundError
        once the file is deleted, ArgumentTypeError for an offset that is not an int or a
        ``buf`` that is not a writable buffer."""
        int_arg("FileReader.read_into", "offset", offset)
        if offset < 0:
            raise InvalidArgumentError("negative offset", f"file {self.file_id:016x}")
        out = buffer_arg("FileReader.read_into", "buf", buf).cast("B")
        end = min(self.size, offset + len(out))
        if end <= offset:
            return 0
        into = out[: end - offset]

        def place(at: int, piece: Payload) -> None:
            put_into(into[at - offset : at - offset + len(piece)], piece)

        await self._read(offset, end, place, into)
        return end - offset

    async def read(self, offset: int, size: int) -> bytes | Synthetic:
        """Up to ``size`` bytes from ``offset``, as ``Client.read`` returns them: short at
        ``size``'s end, a ``Synthetic`` where they were written as one (a projection's).
        Raises as ``read_into`` does."""
        int_arg("FileReader.read", "offset", offset, at_least=0)
        int_arg("FileReader.read", "size", size, at_least=0)
        end = min(self.size, offset + size)
        if end <= offset:
            return b""
        parts: dict[int, Payload] = {}
        await self._read(offset, end, parts.__setitem__, None)
        return joined(parts[k] for k in sorted(parts))

    async def _read(
        self, offset: int, end: int, place: Callable[[int, Payload], None], into: memoryview | None
    ) -> None:
        blocks = self._covering(offset, end)
        records = await self._records_for(blocks)
        try:
            await self.client.read_blocks(blocks, records, offset, end, place, into=into)
        except DataUnavailableError:
            # Perhaps repair moved a chunk since its record was fetched: once more, afresh.
            for b in blocks:
                self._records.pop(b.block_id, None)
            records = await self._records_for(blocks)
            await self.client.read_blocks(blocks, records, offset, end, place, into=into)


__all__ = [
    "MAX_BLOCKS_IN_FLIGHT",
    "RECORD_BATCH",
    "ZERO_PIECE",
    "BlockSource",
    "FileReader",
    "blocks_in",
    "fill_zeros",
    "read_blocks",
]
