"""Reads of many ranks loading at once, merged into few large reads.

A checkpoint's data file holds every rank's parts back to back, so when 4,096 ranks in one
process load their parts at the same moment, each asking the store for 4 KiB costs a path
lookup, a block lookup and a chunk read apiece: per-rank overhead, not bandwidth, sets the
time. ``MergedReader`` collects the small reads (under ``SMALL``) asked for in the same
event-loop iteration, sorts them by file and position, and reads each run of adjacent ranges
(up to ``MERGE_BYTES``) as one; each caller gets its own slice, copied out of a reused
buffer. Big reads, and a lone small one, go straight into the caller's buffer.

The files of a committed checkpoint never change, so reads can go through ``FileReaders``:
one ``FileReader`` per file, whose block map is looked up once, instead of a path lookup and
a scan of the file's block list per read.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tectonic_emu.chunkstore.remote import aligned_buffer
from tectonic_emu.client import Client
from tectonic_emu.coding.synthetic import Payload, Synthetic, nbytes, put_into, sliced
from tectonic_emu.reader import FileReader

MERGE_BYTES = 64 << 20  # the largest merged read
SMALL = 8 << 20  # reads at least a chunk long go straight to the store
IN_FLIGHT = 16  # merged reads at once


class FileReaders:
    """A ``FileReader`` per path, each opened once (concurrent callers share the opening):
    for files that do not change while this is in use."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._open: dict[str, asyncio.Future[FileReader]] = {}

    async def read_into(self, path: str, pos: int, dest: memoryview) -> int:
        """``Client.read_into`` through the file's reader."""
        return await (await self._reader(path)).read_into(pos, dest)

    async def read(self, path: str, pos: int, size: int) -> bytes | Synthetic:
        """``Client.read`` through the file's reader."""
        return await (await self._reader(path)).read(pos, size)

    async def _reader(self, path: str) -> FileReader:
        """The file's reader, opened once. A failed opening is not kept."""
        flight = self._open.get(path)
        if flight is None:
            flight = self._open[path] = asyncio.ensure_future(self.client.reader(path))
        try:
            return await asyncio.shield(flight)
        except Exception:
            if self._open.get(path) is flight:
                del self._open[path]
            raise


@dataclass(slots=True)
class _Want:
    """A read asked for: into ``dest`` (done with the byte count), or with no buffer, of
    ``size`` bytes (done with what was read: ``read_payload``)."""

    path: str
    pos: int
    size: int
    dest: memoryview | None
    done: asyncio.Future[Any] = field(repr=False)
    files: FileReaders | None = None

    @property
    def end(self) -> int:
        return self.pos + self.size


class MergedReader:
    """``read(path, pos, dest)`` like ``Client.read_into``, merged with the reads asked for in
    the same loop iteration. Errors of a merged read go to every read it served."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._queue: list[_Want] = []
        self._sem = asyncio.Semaphore(IN_FLIGHT)
        self._buffers: list[memoryview] = []  # MERGE_BYTES each, reused
        self._tasks: set[asyncio.Task[None]] = set()
        self.reads = 0  # store reads made (for tests and benches)

    async def read(
        self, path: str, pos: int, dest: memoryview, files: FileReaders | None = None
    ) -> int:
        """``dest`` filled from ``path`` at ``pos`` (the byte count); through ``files`` when
        given (a file read there is assumed unchanged)."""
        if len(dest) >= SMALL:
            self.reads += 1
            return await self._read_into(files, path, pos, dest)
        return int(await self._queued(path, pos, len(dest), dest, files))

    async def read_payload(
        self, path: str, pos: int, size: int, files: FileReaders | None = None
    ) -> Payload:
        """``size`` bytes of ``path`` at ``pos`` as the store returns them (short at the
        file's end), merged as ``read`` merges: for values with no buffer to read into, a
        projection's ``Synthetic`` ones (docs/simulate.md)."""
        if size >= SMALL:
            self.reads += 1
            return await self._read(files, path, pos, size)
        return await self._queued(path, pos, size, None, files)  # type: ignore[no-any-return]

    async def _queued(
        self, path: str, pos: int, size: int, dest: memoryview | None, files: FileReaders | None
    ) -> Any:
        loop = asyncio.get_running_loop()
        want = _Want(path, pos, size, dest, loop.create_future(), files)
        if not self._queue:
            loop.call_soon(self._flush)  # after this iteration's other callers queued theirs
        self._queue.append(want)
        return await want.done

    def _flush(self) -> None:
        batch, self._queue = self._queue, []
        for run in _runs(batch):
            task = asyncio.ensure_future(self._read_run(run))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read_run(self, run: list[_Want]) -> None:
        async with self._sem:
            try:
                if any(w.dest is None for w in run):
                    await self._read_described(run)
                    return
                if len(run) == 1:
                    self.reads += 1
                    w = run[0]
                    assert w.dest is not None
                    _resolve(w, await self._read_into(w.files, w.path, w.pos, w.dest))
                    return
                buf = self._buffers.pop() if self._buffers else aligned_buffer(MERGE_BYTES)
                try:
                    start, end = run[0].pos, max(w.end for w in run)
                    self.reads += 1
                    got = await self._read_into(
                        run[0].files, run[0].path, start, buf[: end - start]
                    )
                    for w in run:
                        assert w.dest is not None
                        n = max(0, min(w.size, start + got - w.pos))
                        w.dest[:n] = buf[w.pos - start : w.pos - start + n]
                        _resolve(w, n)
                finally:
                    self._buffers.append(buf)
            except BaseException as exc:
                for w in run:
                    if not w.done.done():
                        w.done.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise

    async def _read_described(self, run: list[_Want]) -> None:
        """A run with reads that have no buffer: read as the store returns it, each read
        given its slice (copied into those that have a buffer)."""
        start, end = run[0].pos, max(w.end for w in run)
        self.reads += 1
        got = await self._read(run[0].files, run[0].path, start, end - start)
        for w in run:
            piece = sliced(got, min(nbytes(got), w.pos - start), min(nbytes(got), w.end - start))
            if w.dest is None:
                _resolve(w, piece)
            else:
                put_into(w.dest[: nbytes(piece)], piece)
                _resolve(w, nbytes(piece))

    async def _read_into(
        self, files: FileReaders | None, path: str, pos: int, dest: memoryview
    ) -> int:
        if files is None:
            return await self.client.read_into(path, pos, dest)
        return await files.read_into(path, pos, dest)

    async def _read(self, files: FileReaders | None, path: str, pos: int, size: int) -> Payload:
        if files is None:
            return await self.client.read(path, pos, size)
        return await files.read(path, pos, size)


def _resolve(want: _Want, result: int | Payload) -> None:
    if not want.done.done():
        want.done.set_result(result)


def _runs(batch: list[_Want]) -> list[list[_Want]]:
    """The reads grouped into runs of adjacent or overlapping ranges of one file, each at
    most MERGE_BYTES long."""
    runs: list[list[_Want]] = []
    end = 0  # of the last run
    for w in sorted(batch, key=lambda w: (w.path, w.pos)):
        last = runs[-1] if runs else None
        if (
            last is not None
            and last[0].path == w.path
            and last[0].files is w.files
            and w.pos <= end
            and max(end, w.end) - last[0].pos <= MERGE_BYTES
        ):
            last.append(w)
            end = max(end, w.end)
        else:
            runs.append([w])
            end = w.end
    return runs


__all__ = ["MERGE_BYTES", "FileReaders", "MergedReader"]
