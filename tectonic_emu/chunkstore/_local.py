"""``LocalNode``: a storage node whose disks are directories on the local file system.

Layout: ``root/d{disk}/{fan}/{chunk_id}``, where ``fan`` is two hex digits taken from a hash of
the chunk id (so directories stay small whatever the ids look like). Each chunk is one file in the
format of ``_format.py``. Blocking I/O runs in small sync functions on an executor
(``_chunkfile.py``); the coroutines only validate, submit and wait.

Durability (``sync=True``): the file is created with ``O_CREAT|O_EXCL`` at its final name; the
header (and the payload's last partial page) go through the page cache, the payload's whole
pages with ``O_DIRECT``; then ``fdatasync``, then ``fsync`` of its directory (and once per
process of the disk directory above a fan-out directory) so the name survives a crash too.

Why ``O_DIRECT``: on this kind of VM, page-cache pages freed by deleted chunks go back to the
host and are slow to touch again (../shared/MACHINE.md), so a buffered write of a payload
cost 0.4-5 GB/s of kernel CPU by the luck of which pages it got: two writers of 560 MB each
(1.17 GB of r1 blocks) spent 0.6-1.9 s of system time and wrote 0.7-1.2 GB/s. Written with
``O_DIRECT`` from the caller's buffer (or a reused page-aligned bounce buffer), the same
writes took 0.16-0.25 s of system time and ran at 1.15-1.43 GB/s, as fast as the raw disk
(docs/performance.md). A file system without ``O_DIRECT`` (tmpfs) is written through the page
cache as before. Reads go through the page cache, whose readahead is the fastest way to read
here, and drop the chunk's pages when done (``close_read``), for the same reason.

A write that fails or is cancelled unlinks its file; a writer killed outright leaves a file
that fails the size or checksum test and so reads as ``ChunkCorruptError``, never as data.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from tectonic_emu.chunkstore._chunkfile import (
    _CREATE_FLAGS,
    _DIR_MODE,
    _DIRECT_FLAGS,
    _FILE_MODE,
    _PAGE,
    _chunk_files,
    _fsync_dir,
    _open_checked,
    _open_chunk,
    _pread_exact,
    _read_head,
    _syncfs,
    _unlink_best_effort,
    _unlink_quiet,
    _write_all,
    _write_torn_file,
    _WriteAborted,
    _WriteJob,
)
from tectonic_emu.chunkstore._format import (
    HEADER_SIZE,
    PAYLOAD_OFFSET,
    ChunkHeader,
    as_byte_view,
    check_payload,
    check_pieces,
    head_of,
    pack_header,
    unpack_header,
)
from tectonic_emu.chunkstore._opencache import OpenChunk, OpenChunks
from tectonic_emu.chunkstore.base import (
    ChunkInfo,
    DiskUsage,
    Payload,
    StorageNode,
    check_chunk_id,
    check_range,
    stored_bytes,
)
from tectonic_emu.coding.checksum import crc32c as crc32c_of
from tectonic_emu.errors import (
    AlreadyExistsError,
    ChunkCorruptError,
    ChunkNotFoundError,
    InvalidArgumentError,
    NodeUnavailableError,
    retrieved,
)
from tectonic_emu.groupsync import GroupCommit
from tectonic_emu.localfile import make_private

T = TypeVar("T")

# Ranges up to this many bytes are read on the event loop from a kept-open file.
INLINE_RANGE = 128 << 10


def fan_out(chunk_id: str) -> str:
    """The fan-out directory name of a chunk: 256 buckets, stable across versions."""
    return f"{zlib.crc32(chunk_id.encode('ascii')) & 0xFF:02x}"


class LocalNode(StorageNode):
    """A storage node on local directories, one per disk: ``root/d0``, ``root/d1``...

    ``sync=False`` skips fdatasync and directory fsync (page-cache mode: fast, not crash-safe).
    ``executor`` runs the blocking I/O; when None the node makes its own (8 threads) and shuts
    it down in ``close()``. Set ``available = False`` to make the node answer nothing
    (every coroutine raises NodeUnavailableError) until it is set back to True, and
    ``delay`` to a number of seconds that every call waits first (a slow node, in this
    process: ``Cluster.set_node_delay``).

    ``read_chunk`` returns a read-only view of a fresh ``bytes`` object that the caller alone
    holds: glibc recycles freed heap blocks (up to 32 MiB), so this is as fast as a buffer pool
    and much faster than fresh ``mmap`` buffers on this machine (see docs/chunk-format.md).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        node_id: int,
        disks: int,
        *,
        sync: bool = True,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        if disks < 1:
            raise InvalidArgumentError(f"a node needs at least one disk, not {disks}")
        self.root = Path(root)
        self.node_id = node_id
        self.disks = disks
        self.sync = sync
        self.available = True
        self.delay = 0.0
        self._closed = False
        self._own_executor: concurrent.futures.ThreadPoolExecutor | None = None
        if executor is None:
            executor = self._own_executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=8, thread_name_prefix=f"node{node_id}-io"
            )
        self._executor = executor
        # Fan-out directories whose entry in the disk directory is known durable.
        self._durable_dirs: set[tuple[int, str]] = set()
        # Disks whose file system refused O_DIRECT (tmpfs): written through the page cache.
        self._no_direct: set[int] = set()
        self._open = OpenChunks()  # chunk files kept open for small ranged reads
        # Per disk: chunks written with sync=False, counted, and the syncfs that covers them.
        self._unsynced = [GroupCommit(self._syncer(disk)) for disk in range(disks)]
        for d in (self.root, *(self._disk_dir(disk) for disk in range(disks))):
            d.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            make_private(d, _DIR_MODE)
        if sync:
            _fsync_dir(str(self.root))

    # -- paths and checks --------------------------------------------------------------------
    def _disk_dir(self, disk: int) -> Path:
        return self.root / f"d{disk}"

    def chunk_path(self, disk: int, chunk_id: str) -> str:
        """The chunk's file path (whether or not it exists). Answers even while unavailable:
        the files are still there, and fault-injection tests use them."""
        self._check_args(disk, chunk_id)
        return str(self._disk_dir(disk) / fan_out(chunk_id) / chunk_id)

    def _check_args(self, disk: int, chunk_id: str | None = None) -> None:
        if not 0 <= disk < self.disks:
            raise InvalidArgumentError(f"node {self.node_id} has no disk {disk}")
        if chunk_id is not None:
            check_chunk_id(chunk_id)

    async def _enter(self) -> None:
        """Wait out ``delay``, then raise NodeUnavailableError if the node is down or closed."""
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        self._check_up()

    def _check_up(self) -> None:
        if self._closed:
            raise NodeUnavailableError(f"node {self.node_id} is closed")
        if not self.available:
            raise NodeUnavailableError(f"node {self.node_id} is down")

    def _syncer(self, disk: int) -> Callable[[], Awaitable[None]]:
        path = str(self._disk_dir(disk))
        return lambda: self._run(_syncfs, path)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- the seam ----------------------------------------------------------------------------
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
        """Store a new chunk; durable on return when the node and the call say ``sync``
        (else once a ``sync_disk`` of its disk returns). ``payload`` must not change
        until this returns (a ``Synthetic`` one is refused: this node stores bytes).

        Raises ChunkCorruptError (a payload that does not match ``crc32c``: nothing is
        written), AlreadyExistsError (chunk id present, even as a torn file),
        InvalidArgumentError, NodeUnavailableError, or the OSError of the file system
        (ENOSPC, EIO...). After an error
        or cancellation no file of this write remains; cancellation waits for the worker thread
        to stop (at most one fdatasync) so that this holds when CancelledError propagates.
        """
        await self._enter()
        view = as_byte_view(stored_bytes(payload, self.node_id))
        path = self.chunk_path(disk, chunk_id)
        pack_header(chunk_id, view.nbytes, crc32c, flags)  # bad fields: raise here, not later
        job = _WriteJob(chunk_id, path, view, crc32c, flags, durable=sync)
        loop = asyncio.get_running_loop()
        # Through the loop (not executor.submit), so a virtual-time loop sees the job out
        # on a thread and holds its clock till it is back (clock.py).
        fut = loop.run_in_executor(self._executor, self._write_file, disk, job)
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            if job.drop():  # still queued: it will do nothing, so nothing to wait for
                fut.add_done_callback(retrieved)
                raise
            await _settle(fut)
            if job.created:  # the worker finished before it saw the abort
                await _settle(loop.run_in_executor(self._executor, _unlink_best_effort, path))
            raise
        if not sync and self.sync:
            self._unsynced[disk].count()  # for the next sync_disk to cover

    async def sync_disk(self, disk: int) -> None:
        """One ``syncfs`` of the disk's file system covers every chunk written unsynced
        before it (and their directories); concurrent calls, and the disks sharing a file
        system here, share it when it starts after them (``GroupCommit``). A no-op when
        nothing was written unsynced since the last, or in page-cache mode."""
        await self._enter()
        self._check_args(disk)
        await self._unsynced[disk].sync()

    def _write_file(self, disk: int, job: _WriteJob) -> None:
        if not job.take():
            raise _WriteAborted
        job.prepare()
        fan_dir = os.path.dirname(job.path)
        try:
            try:
                fd = os.open(job.path, _CREATE_FLAGS, _FILE_MODE)
            except FileNotFoundError:
                os.makedirs(fan_dir, mode=_DIR_MODE, exist_ok=True)
                fd = os.open(job.path, _CREATE_FLAGS, _FILE_MODE)
        except FileExistsError:
            raise AlreadyExistsError("chunk already exists", job.chunk_id) from None
        job.created = True
        try:
            try:
                direct = self._open_direct(disk, job) if self.sync else None
                try:
                    _write_all(fd, job, direct)
                except OSError as exc:
                    if direct is None or exc.errno != errno.EINVAL:
                        raise
                    self._no_direct.add(disk)  # refused after all: the page cache it is
                    _write_all(fd, job, None)
                finally:
                    if direct is not None:
                        os.close(direct)
                if self.sync and job.durable:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            if job.abort.is_set():
                raise _WriteAborted
            if self.sync and job.durable:
                key = (disk, os.path.basename(fan_dir))
                if key not in self._durable_dirs:
                    _fsync_dir(str(self._disk_dir(disk)))
                    self._durable_dirs.add(key)
                _fsync_dir(fan_dir)
        except BaseException:
            _unlink_best_effort(job.path)
            job.created = False
            raise

    def _open_direct(self, disk: int, job: _WriteJob) -> int | None:
        """A second, ``O_DIRECT`` descriptor of the chunk file ``job`` just created, or None:
        for a payload without a whole page, or where the file system refuses ``O_DIRECT``."""
        if job.payload.nbytes < _PAGE or disk in self._no_direct or not _DIRECT_FLAGS:
            return None
        try:
            return os.open(job.path, _DIRECT_FLAGS)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._no_direct.add(disk)
            return None

    async def read_chunk(self, disk: int, chunk_id: str) -> tuple[memoryview, ChunkInfo]:
        """The payload (a read-only view the caller owns) and its header information.

        Raises ChunkNotFoundError, ChunkCorruptError (checksum, size or header mismatch; also
        for a chunk still being written), InvalidArgumentError, NodeUnavailableError.
        """
        await self._enter()
        path = self.chunk_path(disk, chunk_id)
        payload, info = await self._run(self._read_file, disk, chunk_id, path)
        return memoryview(payload), info

    def _read_file(self, disk: int, chunk_id: str, path: str) -> tuple[bytes, ChunkInfo]:
        fd = _open_chunk(path, chunk_id)
        try:
            st = os.fstat(fd)
            header = _read_head(fd, chunk_id, st.st_size, whole=True)
            payload = _pread_exact(fd, header.payload_len, header.payload_offset, chunk_id)
        finally:
            self.close_read(fd)
        check_payload(payload, header, chunk_id)
        return payload, _info(chunk_id, disk, header, st)

    async def read_chunk_into(self, disk: int, chunk_id: str, dest: memoryview) -> ChunkInfo:
        """Read the payload straight into ``dest`` (one ``preadv``, no buffer of our own) and
        check it. If cancelled, waits for the worker's read to end before it re-raises, so
        nothing lands in ``dest`` afterwards."""
        await self._enter()
        path = self.chunk_path(disk, chunk_id)
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor, self._read_file_into, disk, chunk_id, path, dest)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await _settle(fut)
            raise

    def _read_file_into(self, disk: int, chunk_id: str, path: str, dest: memoryview) -> ChunkInfo:
        fd = _open_chunk(path, chunk_id)
        try:
            st = os.fstat(fd)
            header = _read_head(fd, chunk_id, st.st_size, whole=True)
            if header.payload_len != dest.nbytes:
                raise ChunkCorruptError(
                    f"chunk is {header.payload_len} bytes where {dest.nbytes} were expected",
                    chunk_id,
                )
            _preadv_exact(fd, dest, header.payload_offset, chunk_id)
        finally:
            self.close_read(fd)
        if crc32c_of(dest) != header.payload_crc32c:
            raise ChunkCorruptError("chunk payload checksum mismatch", chunk_id)
        return _info(chunk_id, disk, header, st)

    async def read_chunk_range(
        self, disk: int, chunk_id: str, offset: int, length: int
    ) -> tuple[memoryview, ChunkInfo]:
        """Read and check only the pieces that hold the range (a version 3 chunk; an older
        one is read whole, checked); the pages stay cached, as a small read's should. The
        range is a read-only view the caller owns.

        A range of at most ``INLINE_RANGE`` bytes is read here, on the event loop, from the
        chunk's file kept open (``_opencache.py``): a thread hop, an open and a header read
        cost more than its pieces (a 4 KiB read from the disk blocks the loop about 0.1 ms).
        Larger ones go to an I/O thread."""
        await self._enter()
        if length > INLINE_RANGE:
            path = self.chunk_path(disk, chunk_id)
            return await self._run(self._read_range, disk, chunk_id, path, offset, length)
        entry = self._open.get(disk, chunk_id, lambda: self.chunk_path(disk, chunk_id))
        try:
            return self._read_open_range(entry, disk, chunk_id, offset, length)
        except ChunkCorruptError:
            self._open.drop(disk, chunk_id)  # opened afresh next time
            raise

    def _read_open_range(
        self, entry: OpenChunk, disk: int, chunk_id: str, offset: int, length: int
    ) -> tuple[memoryview, ChunkInfo]:
        header = entry.header
        check_range(offset, length, header.payload_len, chunk_id)
        info = ChunkInfo(
            chunk_id, disk, header.payload_len, header.payload_crc32c, header.flags, entry.mtime
        )
        if not header.piece_size:  # no piece checksums: the whole payload, checked
            payload = _pread_exact(entry.fd, header.payload_len, header.payload_offset, chunk_id)
            check_payload(payload, header, chunk_id)
            return memoryview(payload)[offset : offset + length].toreadonly(), info
        return _pieces_of(entry.fd, header, chunk_id, offset, length, entry.table), info

    def _read_range(
        self, disk: int, chunk_id: str, path: str, offset: int, length: int
    ) -> tuple[memoryview, ChunkInfo]:
        fd = _open_chunk(path, chunk_id)
        try:
            st = os.fstat(fd)
            header = unpack_header(os.pread(fd, HEADER_SIZE, 0), chunk_id, st.st_size)
            end = offset + length
            check_range(offset, length, header.payload_len, chunk_id)
            if not header.piece_size:  # no piece checksums: the whole payload, checked
                payload = _pread_exact(fd, header.payload_len, header.payload_offset, chunk_id)
                check_payload(payload, header, chunk_id)
                got = memoryview(payload)[offset:end].toreadonly()
            else:
                got = _pieces_of(fd, header, chunk_id, offset, length)
        finally:
            os.close(fd)
        return got, _info(chunk_id, disk, header, st)

    def close_read(self, fd: int) -> None:
        """Close a chunk file read through the page cache, first dropping its pages (with
        ``sync``; without, they may not be written back yet, and are what serves reads).

        Why: the kernel's readahead makes buffered reads of a chunk the fastest way to read
        it here, but the page cache then grows into memory the VM has handed back to its
        host, which is slow to touch (../shared/MACHINE.md). Dropped at once, the same few
        pages serve read after read, warm. 8 threads reading 128 MiB files in 8 MiB reads,
        cold, three rounds: 0.98-1.24 GB/s with 0.6-1.0 s of system time buffered, 1.47-1.69
        GB/s with 0.3 s dropping each read's pages, 0.77-1.02 GB/s with ``O_DIRECT``
        (docs/chunk-format.md). What it costs: a chunk read twice comes from the disk twice,
        as from a storage node on another machine."""
        try:
            if self.sync:
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    async def open_chunk(self, disk: int, chunk_id: str) -> tuple[int, ChunkInfo, int]:
        """An open file descriptor of the chunk (the caller closes it), its header
        information, checked against the file size, and the offset of its payload, which is
        not read or checked (the node server sends it with ``sendfile``, and its client
        checks it). Raises as ``stat_chunk``."""
        await self._enter()
        return await self._run(self._open_checked, disk, chunk_id, self.chunk_path(disk, chunk_id))

    def _open_checked(self, disk: int, chunk_id: str, path: str) -> tuple[int, ChunkInfo, int]:
        fd, st, header = _open_checked(path, chunk_id, whole=True)  # sent with sendfile
        return fd, _info(chunk_id, disk, header, st), header.payload_offset

    async def delete_chunk(self, disk: int, chunk_id: str) -> None:
        """Unlink the chunk file; no error if absent. Not fsynced: a delete lost in a crash
        leaves an orphan chunk for garbage collection, never wrong data."""
        await self._enter()
        self._open.drop(disk, chunk_id)
        await self._run(_unlink_quiet, self.chunk_path(disk, chunk_id))

    async def stat_chunk(self, disk: int, chunk_id: str) -> ChunkInfo:
        """Header information, checked against the file size (so a torn file raises
        ChunkCorruptError); the payload is not read."""
        await self._enter()
        return await self._run(self._stat_file, disk, chunk_id, self.chunk_path(disk, chunk_id))

    def _stat_file(self, disk: int, chunk_id: str, path: str) -> ChunkInfo:
        fd = _open_chunk(path, chunk_id)
        try:
            st = os.fstat(fd)
            header = unpack_header(os.pread(fd, HEADER_SIZE, 0), chunk_id, st.st_size)
        finally:
            os.close(fd)
        return _info(chunk_id, disk, header, st)

    async def list_chunks(self, disk: int) -> list[ChunkInfo]:
        """Every chunk file on the disk, as its header describes it (files whose names are not
        chunk ids are skipped). A file whose header is unreadable is still listed, so garbage
        collection and scrubbing see it: with crc32c=0, flags=0 and the stored_len its size
        implies. A chunk being written is listed too; collectors should spare recent mtimes."""
        await self._enter()
        self._check_args(disk)
        return await self._run(self._list_disk, disk)

    def _list_disk(self, disk: int) -> list[ChunkInfo]:
        infos: list[ChunkInfo] = []
        for chunk_id, path in _chunk_files(self._disk_dir(disk)):
            try:
                infos.append(self._stat_file(disk, chunk_id, path))
            except ChunkNotFoundError:  # deleted while we walked
                continue
            except ChunkCorruptError:
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(path)
                    stored_len = max(st.st_size - PAYLOAD_OFFSET, 0)
                    infos.append(ChunkInfo(chunk_id, disk, stored_len, 0, 0, st.st_mtime))
        return infos

    async def usage(self) -> list[DiskUsage]:
        """Per disk: chunk files, their total size (headers included) and free bytes."""
        await self._enter()
        return await self._run(self._usage_sync)

    def _usage_sync(self) -> list[DiskUsage]:
        result = []
        for disk in range(self.disks):
            chunks = used = 0
            for _, path in _chunk_files(self._disk_dir(disk)):
                with contextlib.suppress(FileNotFoundError):
                    used += os.stat(path).st_size
                    chunks += 1
            vfs = os.statvfs(self._disk_dir(disk))
            result.append(DiskUsage(disk, chunks, used, vfs.f_bavail * vfs.f_frsize))
        return result

    async def write_torn_chunk(
        self,
        disk: int,
        chunk_id: str,
        payload: Payload,
        *,
        crc32c: int,
        flags: int = 0,
        keep: int,
    ) -> None:
        """Test hook: leave what a writer killed mid-write leaves (the header and the first
        ``keep`` payload bytes, no fsync, no cleanup)."""
        await self._enter()
        view = as_byte_view(stored_bytes(payload, self.node_id))
        path = self.chunk_path(disk, chunk_id)
        head = head_of(chunk_id, view, crc32c, flags)
        await self._run(_write_torn_file, chunk_id, path, head, view[:keep])

    async def close(self) -> None:
        """Stop answering; shut down the executor if the node made it. Idempotent."""
        self._closed = True
        self._open.close()
        if self._own_executor is not None:
            executor, self._own_executor = self._own_executor, None
            await asyncio.to_thread(executor.shutdown)


def _pieces_of(
    fd: int,
    header: ChunkHeader,
    chunk_id: str,
    offset: int,
    length: int,
    table: bytes | None = None,
) -> memoryview:
    """Payload bytes ``[offset, offset + length)`` of a version 3 chunk open as ``fd``,
    from the pieces that hold them, each checked against its checksum (a read-only view).
    ``table``: the chunk's whole piece table, read before (else its entries are read)."""
    end = offset + length
    pieces = header.pieces(offset, end)
    if table is None:
        entries: bytes | memoryview = _pread_exact(
            fd, 4 * len(pieces), HEADER_SIZE + 4 * pieces.start, chunk_id
        )
    else:
        entries = memoryview(table)[4 * pieces.start : 4 * pieces.stop]
    start = pieces.start * header.piece_size
    stop = min(pieces.stop * header.piece_size, header.payload_len)
    got = memoryview(bytearray(max(stop - start, 0)))
    _preadv_exact(fd, got, header.payload_offset + start, chunk_id)
    check_pieces(got, pieces.start, entries, header, chunk_id)
    return got[offset - start : end - start].toreadonly()


def _preadv_exact(fd: int, dest: memoryview, offset: int, chunk_id: str) -> None:
    """Fill ``dest`` from ``fd`` at ``offset`` (resuming short reads)."""
    got = 0
    while got < dest.nbytes:
        n = os.preadv(fd, [dest[got:]], offset + got)
        if n <= 0:
            raise ChunkCorruptError("chunk file shorter than its header says", chunk_id)
        got += n


def _info(chunk_id: str, disk: int, header: ChunkHeader, st: os.stat_result) -> ChunkInfo:
    return ChunkInfo(
        chunk_id, disk, header.payload_len, header.payload_crc32c, header.flags, st.st_mtime
    )


async def _settle(fut: asyncio.Future[Any]) -> None:
    """Wait until ``fut`` is done, through further cancellations, and swallow its outcome.

    Used only on a cancellation path, where the caller re-raises CancelledError afterwards.
    """
    while not fut.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([fut])
    retrieved(fut)


__all__ = ["LocalNode"]
