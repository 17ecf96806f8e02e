"""Reading a committed checkpoint's parts into values, and checking them: ``PartReader``.

- A value's parts that lie back to back in one data file are read in runs (one read each, up
  to ``RUN_BYTES``), then checked part by part against their CRC32C.
- ``load_many`` lays values out in shared buffers (*arenas*, ``arenas``) of up to
  ``ARENA_BYTES``, in file order, each read in one read and checked in one pinned pass.
- A region of a global array (``assemble``) reads only the rows of the parts it meets; a
  part of a part is covered by the store's chunk checksums, not the part's.

Every read goes through one ``MergedReader`` (``clients/ckpt_reads.py``), which merges the
small reads of ranks loading at once. Nothing is returned unless what was read checks:
``CheckpointCorruptError`` names the step, the rank, the value and the rows.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clients.ckpt_catalog import Catalog, Indexed
from clients.ckpt_format import CheckpointCorruptError, Entry, Manifest, Part, Shard, Value
from clients.ckpt_reads import MergedReader
from clients.ckpt_region import Box, RowRead, plan
from tectonic_emu._malloc import MMAP_THRESHOLD
from tectonic_emu.bufpool import PAGE
from tectonic_emu.coding import work
from tectonic_emu.coding.checksum import crc32c, crc32c_many
from tectonic_emu.coding.synthetic import Payload, Synthetic, joined, nbytes
from tectonic_emu.errors import TectonicError

READS_IN_FLIGHT = 16  # reads of one load (or read, or verify) at once
RUN_BYTES = 64 << 20  # adjacent parts read at once, at most
# load_many's shared buffers: just under malloc's mmap threshold (tectonic_emu/_malloc.py;
# uninitialised adds a page for alignment), so a freed one comes back warm from the heap.
# At 64 MiB each was a fresh mapping, faulted in at 0.5-1 GB/s on this kind of VM: loads of
# 256 MiB by 4,096 ranks swung 0.17-0.41 s, 0.16-0.21 s with these.
ARENA_BYTES = MMAP_THRESHOLD - 2 * PAGE


@dataclass(slots=True)
class Arena:
    """Values lying back to back in ``file`` from ``start``: one buffer, one read."""

    file: str
    start: int
    length: int = 0
    members: list[tuple[int, int]] = field(default_factory=list)  # (value index, offset)


class PartReader:
    """The reads of one Checkpointer's loads, merged, and the checks of what they read."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._reader = MergedReader(catalog.client)  # the reads of ranks loading at once

    async def value(
        self,
        ix: Indexed,
        e: Entry,
        sem: asyncio.Semaphore,
        dest: tuple[Any, memoryview] | None = None,
    ) -> Value:
        """One rank's whole value, every part checked; read into ``dest`` (see
        ``ckpt_select.destination``) when given."""
        if e.kind == "synthetic":
            return await self.described(ix, e, sem)
        value, runs = empty_value(e) if dest is None else (dest[0], runs_of(e, dest[1]))
        await asyncio.gather(*(self.read_parts(ix, e, run, into, sem) for run, into in runs))
        if dest is None and isinstance(value, bytearray):
            value = as_bytes(value)
            await work.settle()
        return value

    async def read_arena(
        self, ix: Indexed, arena: Arena, entries: list[Entry], buf: memoryview | None
    ) -> Payload:
        """The values ``entries`` lying back to back from ``arena.start``, read into ``buf``
        at once (or, with no buffer, as the store returns them: a projection's synthetic
        values), then every part checked (pinned once: thousands of small parts cost one
        pass, in a worker thread when the arena is big). Returns what was read."""
        m = ix.manifest
        try:
            path = self.catalog.path(arena.file)
            data, n = await self._read(ix, path, arena.start, arena.length, buf)
        except TectonicError as exc:
            raise CheckpointCorruptError(
                f"step {m.step}: cannot read {arena.file} at {arena.start}: {exc}",
                self.catalog.root,
            ) from exc
        parts = [(e, p) for e in entries for p in e.parts]
        spans, at = [], 0
        for _, p in parts:
            spans.append((at, p.length))
            at += p.length
        for (e, p), (at, length) in zip(parts, spans, strict=True):
            if at + length > n:  # a short read
                raise self._corrupt(m, e, p)
        if n >= 1 << 20:
            crcs = await asyncio.to_thread(crc32c_many, data, spans)
        else:
            crcs = crc32c_many(data, spans)
        for (e, p), crc in zip(parts, crcs, strict=True):
            if crc != p.crc32c:
                raise self._corrupt(m, e, p)
        return data

    async def read_parts(
        self,
        ix: Indexed,
        e: Entry,
        parts: list[Part],
        dest: memoryview | None,
        sem: asyncio.Semaphore,
    ) -> Payload:
        """Parts that lie back to back in one file, read at once into ``dest`` (a part cut
        short of its block would make the store read that block whole for each part), or
        with no buffer as the store returns them (a projection's synthetic value), then each
        checked against its CRC32C. Returns what was read."""
        first, m = parts[0], ix.manifest
        async with sem:
            try:
                path = self.catalog.path(first.file)
                size = sum(p.length for p in parts)
                got, n = await self._read(ix, path, first.pos, size, dest)
            except TectonicError as exc:
                raise self._unreadable(m, e, first, exc) from exc
        await self._check_parts(m, e, parts, got, n)
        return got

    async def _read(
        self, ix: Indexed, path: str, pos: int, size: int, dest: memoryview | None
    ) -> tuple[Payload, int]:
        """``size`` bytes at ``pos`` into ``dest`` (of that size), or with no buffer as the
        store returns them; what was read and its byte count."""
        if dest is None:
            got = await self._reader.read_payload(path, pos, size, ix.files)
            return got, nbytes(got)
        return dest, await self._reader.read(path, pos, dest, ix.files)

    async def described(self, ix: Indexed, e: Entry, sem: asyncio.Semaphore) -> Payload:
        """A synthetic value (a projection's): its runs read with no buffer
        (``read_parts``), joined back into the ``Synthetic`` that was saved."""
        runs = _runs(e)
        got = await asyncio.gather(*(self.read_parts(ix, e, r, None, sem) for r in runs))
        value = as_bytes(joined(got))
        await work.settle()
        return value

    def _unreadable(self, m: Manifest, e: Entry, p: Part, exc: Exception) -> Exception:
        return CheckpointCorruptError(
            f"step {m.step}, rank {e.rank}, {e.name!r}: cannot read {p.file}: {exc}",
            self.catalog.root,
        )

    async def _check_parts(
        self, m: Manifest, e: Entry, parts: list[Part], dest: Payload, n: int
    ) -> None:
        """Each of ``parts``, read back to back into ``dest`` (``n`` bytes of it), against
        its CRC32C; CheckpointCorruptError names the first that does not match."""
        if len(dest) >= 1 << 20:
            bad = await asyncio.to_thread(_first_bad, parts, dest, n)
        else:
            bad = _first_bad(parts, dest, n)
        if bad is not None:
            raise self._corrupt(m, e, bad)

    def _corrupt(self, m: Manifest, e: Entry, bad: Part) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"step {m.step}, rank {e.rank}, {e.name!r}: rows {bad.row0}-{bad.row1} in "
            f"{bad.file} do not match their checksum",
            self.catalog.root,
        )

    async def assemble(
        self,
        ix: Indexed,
        entries: Sequence[Entry],
        box: Box,
        sem: asyncio.Semaphore,
        out: np.ndarray[Any, Any] | None = None,
    ) -> np.ndarray[Any, Any]:
        """The array ``box`` of a global array from the values (boxes) ``entries``, in
        ``out`` when given (of the box's shape and the values' dtype)."""
        dtype = np.dtype(entries[0].dtype)
        if out is None:
            out = np.empty(tuple(hi - lo for lo, hi in box), dtype=dtype)
        if out.size == 0:
            return out

        async def one(r: RowRead) -> None:
            # Rows that fill their place in ``out`` whole (full width, as resharding along
            # axis 0 cuts) are read straight into it; others through a buffer of their own.
            target = out[r.dest]
            direct = target.shape == r.rows_shape and target.flags.c_contiguous
            rows = target if direct else np.empty(r.rows_shape, dtype=dtype)
            dest = rows.reshape(-1).view(np.uint8).data
            if r.whole_part:
                await self.read_parts(ix, r.entry, [r.part], dest, sem)
            else:  # part of a part: the store's chunk checksums cover these bytes
                async with sem:
                    path = self.catalog.path(r.file)
                    await self._reader.read(path, r.pos, dest, ix.files)
            if not direct:
                target[...] = rows[r.source]

        await asyncio.gather(*(one(r) for r in plan(_distinct(entries), box)))
        return out


def _in_one_piece(e: Entry) -> bool:
    """Whether ``e``'s parts lie back to back in one file (and it has bytes at all)."""
    if not e.parts or e.nbytes == 0:
        return False
    return all(
        q.file == p.file and q.pos == p.pos + p.length for p, q in itertools.pairwise(e.parts)
    )


def arenas(entries: Sequence[Entry]) -> tuple[list[Arena], list[int]]:
    """The values in one piece, in file order, grouped into arenas of adjacent values of at
    most ARENA_BYTES (a value longer than that has one of its own); and the indexes of the
    others (read run by run into buffers of their own)."""
    whole: list[int] = []
    scattered: list[int] = []
    for i, e in enumerate(entries):
        (whole if _in_one_piece(e) else scattered).append(i)
    order = sorted(whole, key=lambda i: (entries[i].parts[0].file, entries[i].parts[0].pos))
    out: list[Arena] = []
    for i in order:
        first, n = entries[i].parts[0], entries[i].nbytes
        last = out[-1] if out else None
        if (
            last is None
            or last.file != first.file
            or last.start + last.length != first.pos
            or last.length + n > ARENA_BYTES
        ):
            last = Arena(first.file, first.pos)
            out.append(last)
        last.members.append((i, last.length))
        last.length += n
    return out, scattered


def as_bytes(value: Payload) -> bytes | Synthetic:
    """A bytes value's bytes, copied out of the buffer it was read into, counted as CPU
    work (coding/work.py); a ``Synthetic`` one (a projection's) as it is, counted the same."""
    work.count("copy", nbytes(value))
    return value if isinstance(value, Synthetic) else bytes(value)


def as_value(e: Entry, view: memoryview) -> Value:
    """``e``'s value over the bytes ``view`` (filled later): an array view, a Shard of one,
    or the view itself for bytes (made ``bytes`` once read)."""
    if e.kind == "bytes":
        return view
    arr = np.frombuffer(view, dtype=np.dtype(e.dtype)).reshape(e.shape)
    return Shard(arr, e.global_shape, e.offset) if e.kind == "shard" else arr


def empty_value(e: Entry) -> tuple[Any, list[tuple[list[Part], memoryview]]]:
    """A value to read ``e`` into (a numpy array, or a bytearray for bytes), and its runs
    (``runs_of``)."""
    if e.kind == "bytes":
        value: Any = bytearray(e.nbytes)
        view = memoryview(value)
    else:
        value = np.empty(e.shape, dtype=np.dtype(e.dtype))
        view = memoryview(value.reshape(-1).view(np.uint8)).cast("B")
    return value, runs_of(e, view)


def runs_of(e: Entry, view: memoryview) -> list[tuple[list[Part], memoryview]]:
    """``e``'s parts in runs (``_runs``), each with the slice of ``view`` (the value's
    bytes) it fills."""
    out = []
    at = 0
    for run in _runs(e):
        n = sum(p.length for p in run)
        out.append((run, view[at : at + n]))
        at += n
    return out


def _runs(e: Entry) -> list[list[Part]]:
    """``e``'s parts in runs that lie back to back in one file: one read each, at most
    RUN_BYTES."""
    runs: list[list[Part]] = []
    for p in e.parts:
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and last.file == p.file
            and last.pos + last.length == p.pos
            and sum(q.length for q in runs[-1]) + p.length <= RUN_BYTES
        ):
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def _first_bad(parts: list[Part], dest: Payload, n: int) -> Part | None:
    """The first of ``parts`` (back to back in ``dest``, ``n`` bytes of it read) that is
    short or does not match its CRC32C."""
    at = 0
    for p in parts:
        if n < at + p.length or crc32c(dest[at : at + p.length]) != p.crc32c:
            return p
        at += p.length
    return None


def _distinct(entries: Sequence[Entry]) -> list[Entry]:
    """One entry per box: ranks that saved the same shard (data-parallel replicas) are read
    once."""
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    out = []
    for e in entries:
        box = (e.offset, e.shape)
        if box not in seen:
            seen.add(box)
            out.append(e)
    return out


__all__ = [
    "ARENA_BYTES",
    "READS_IN_FLIGHT",
    "RUN_BYTES",
    "Arena",
    "PartReader",
    "arenas",
    "as_value",
    "empty_value",
    "runs_of",
]
