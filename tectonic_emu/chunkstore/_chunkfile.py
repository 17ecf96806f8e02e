"""One chunk file's blocking I/O, run on a node's executor (``_local.py``): the write job
that a waiter and a worker thread share, and the small sync functions that create, write,
read, sync and unlink chunk files. Nothing here awaits."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path

from tectonic_emu.bufpool import BufferPool, address_of
from tectonic_emu.chunkstore._format import (
    HEADER_SIZE,
    ChunkHeader,
    head_of,
    unpack_header,
)
from tectonic_emu.chunkstore.base import is_chunk_id
from tectonic_emu.coding._native import pinned
from tectonic_emu.errors import (
    AlreadyExistsError,
    ChunkCorruptError,
    ChunkNotFoundError,
)
from tectonic_emu.localfile import file_kind

# Writes bigger than this go out in several syscalls so a cancelled write stops soon.
_WRITE_SLICE = 8 << 20
_CREATE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
# Chunk files and the directories above them: the node's owner alone reads them.
_FILE_MODE = 0o600
_DIR_MODE = 0o700
# 0 where the platform has no O_DIRECT: then every write goes through the page cache.
_DIRECT_FLAGS = (
    os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_DIRECT if hasattr(os, "O_DIRECT") else 0
)
_PAGE = 4096  # O_DIRECT alignment of offsets, lengths and memory
# Page-aligned copies of payloads that are not, for O_DIRECT (shared by every node and thread).
_BOUNCE = BufferPool(_WRITE_SLICE, keep=16)


class _WriteAborted(Exception):
    """The coroutine that asked for this write was cancelled."""


class _WriteJob:
    """One chunk write as the worker thread sees it."""

    def __init__(
        self,
        chunk_id: str,
        path: str,
        payload: memoryview,
        crc32c: int,
        flags: int,
        *,
        durable: bool = True,
    ) -> None:
        self.chunk_id = chunk_id
        self.path = path
        self.payload = payload
        self.crc32c, self.flags = crc32c, flags
        self.durable = durable  # False: no fdatasync or directory fsync (``sync_disk`` later)
        self.head = b""  # header and piece table, up to the payload (the worker makes it)
        self.abort = threading.Event()
        # True while a file this job created exists; only the worker sets it.
        self.created = False
        # Whether a worker took the job; under ``_taking`` with the abort, so that exactly
        # one of the two sides decides whether the job runs.
        self.taken = False
        self._taking = threading.Lock()

    def prepare(self) -> None:
        """On the worker thread, before any file exists: make the head, checking the payload
        against the writer's checksum in the same pass (``head_of(check=True)``: the piece
        checksums certify the writer's bytes, end to end; about 1 ms for 8 MiB here).
        Raises ChunkCorruptError for a payload that does not match."""
        self.head = head_of(self.chunk_id, self.payload, self.crc32c, self.flags, check=True)

    def take(self) -> bool:
        """The worker's: take the job, unless it was aborted first."""
        with self._taking:
            self.taken = not self.abort.is_set()
            return self.taken

    def drop(self) -> bool:
        """The waiter's: abort the job; True if no worker had taken it (it never will)."""
        with self._taking:
            self.abort.set()
            return not self.taken


def _write_all(fd: int, job: _WriteJob, direct: int | None) -> None:
    """Header and payload. Through ``fd`` (the page cache): the header, then without
    ``direct`` the payload in slices, with it only the payload's last partial page; through
    ``direct`` (``O_DIRECT``) the payload's whole pages, in slices. A slice ends where a
    cancelled write may stop."""
    payload = job.payload
    at = len(job.head)  # the payload's offset (``prepare`` made the head)
    whole = payload.nbytes - payload.nbytes % _PAGE if direct is not None else 0
    head = [memoryview(job.head)]
    if whole == payload.nbytes:
        _pwritev_all(fd, head, 0)
    else:  # the header and the first (or, with ``direct``, the last partial) payload slice
        first = payload[whole : whole + _WRITE_SLICE]
        _pwritev_all(fd, [*head, first] if whole == 0 else head, 0)
        if whole:
            _pwritev_all(fd, [first], at + whole)
        for start in range(whole + _WRITE_SLICE, payload.nbytes, _WRITE_SLICE):
            if job.abort.is_set():
                raise _WriteAborted
            _pwritev_all(fd, [payload[start : start + _WRITE_SLICE]], at + start)
    if whole:
        assert direct is not None
        _write_direct(direct, job, payload[:whole], at)


def _write_direct(fd: int, job: _WriteJob, pages: memoryview, at: int) -> None:
    """``pages`` (a multiple of _PAGE bytes) at ``at`` through the ``O_DIRECT`` ``fd``:
    straight from the caller's memory when it is page-aligned, else through a bounce buffer
    (the copy releases the GIL)."""
    with pinned([pages]) as [(address, n)]:
        bounce = None if address % _PAGE == 0 else _BOUNCE.take()
        try:
            for start in range(0, n, _WRITE_SLICE):
                if job.abort.is_set():
                    raise _WriteAborted
                size = min(_WRITE_SLICE, n - start)
                if bounce is None:
                    piece = pages[start : start + size]
                else:
                    ctypes.memmove(address_of(bounce), address + start, size)
                    piece = memoryview(bounce)[:size]
                _pwritev_all(fd, [piece], at + start)
        finally:
            if bounce is not None:
                _BOUNCE.give(bounce)


def _pwritev_all(fd: int, bufs: list[memoryview], offset: int) -> None:
    """``os.pwritev``, resumed after short writes."""
    bufs = [b for b in bufs if b.nbytes]
    while bufs:
        written = os.pwritev(fd, bufs, offset)
        if written <= 0:
            raise OSError(0, "pwritev wrote nothing")
        offset += written
        while bufs and written >= bufs[0].nbytes:
            written -= bufs[0].nbytes
            bufs.pop(0)
        if written:
            bufs[0] = bufs[0][written:]


def _pread_exact(fd: int, n: int, offset: int, chunk_id: str) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) == n:
        return data
    parts = [data]  # short read: a payload over 2 GiB, or the file shrank under us
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, offset + got)
        if not more:
            raise ChunkCorruptError("chunk file shorter than its header says", chunk_id)
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _open_chunk(path: str, chunk_id: str) -> int:
    """A read descriptor of a chunk file that is a regular file. Anything else at its path
    (a FIFO, whose open or read would block forever; a symlink, which could point anywhere; a
    directory, a device) is ChunkCorruptError, so readers fall back to other chunks and
    repair replaces it. ``O_NONBLOCK`` makes the open of a FIFO return at once."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise ChunkNotFoundError("no such chunk", chunk_id) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ChunkCorruptError(
                "chunk file is a symlink, not a regular file", chunk_id
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ChunkCorruptError(
                f"chunk file is {file_kind(st.st_mode)}, not a regular file", chunk_id
            )
        # Regular files ignore O_NONBLOCK; cleared so nothing downstream ever sees EAGAIN.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_checked(
    path: str, chunk_id: str, *, whole: bool
) -> tuple[int, os.stat_result, ChunkHeader]:
    """A read descriptor of a chunk file (``_open_chunk``), its stat, and its header,
    checked against the file size (``_read_head``, ``whole`` as there); the descriptor is
    closed if the header fails."""
    fd = _open_chunk(path, chunk_id)
    try:
        st = os.fstat(fd)
        return fd, st, _read_head(fd, chunk_id, st.st_size, whole=whole)
    except BaseException:
        os.close(fd)
        raise


def _read_head(fd: int, chunk_id: str, size: int, *, whole: bool) -> ChunkHeader:
    """The header of the chunk file open as ``fd`` (``size`` bytes), checked. ``whole``:
    the payload is read next, start to end, so the pages between the header and the
    payload (the piece table) are read too: the kernel then sees one sequential read and
    keeps its readahead growing. A page skipped there made it start over, and whole reads
    of 8 MiB chunks (payload at 8192) ran at 0.63x of those with the payload at 4096."""
    header = unpack_header(os.pread(fd, HEADER_SIZE, 0), chunk_id, size)
    if whole and header.payload_offset > _PAGE:
        os.pread(fd, header.payload_offset - _PAGE, _PAGE)
    return header


def _chunk_files(disk_dir: Path) -> list[tuple[str, str]]:
    """(chunk_id, path) of every regular file under a disk directory named like a chunk id."""
    found = []
    with os.scandir(disk_dir) as fans:
        fan_dirs = [e.path for e in fans if e.is_dir(follow_symlinks=False)]
    for fan_dir in fan_dirs:
        with contextlib.suppress(FileNotFoundError), os.scandir(fan_dir) as entries:
            for e in entries:
                if e.is_file(follow_symlinks=False) and is_chunk_id(e.name):
                    found.append((e.name, e.path))
    return found


def _write_torn_file(chunk_id: str, path: str, head: bytes, partial: memoryview) -> None:
    os.makedirs(os.path.dirname(path), mode=_DIR_MODE, exist_ok=True)
    try:
        fd = os.open(path, _CREATE_FLAGS, _FILE_MODE)
    except FileExistsError:
        raise AlreadyExistsError("chunk already exists", chunk_id) from None
    try:
        _pwritev_all(fd, [memoryview(head), partial], 0)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@cache
def _libc_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs`` (Linux), or None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int,)
    fn.restype = ctypes.c_int
    return fn


def _syncfs(path: str) -> None:
    """Flush the whole file system under the directory ``path`` (``syncfs``): every chunk
    written there unsynced, with its directory entries, in one call instead of an
    ``fdatasync`` per file and an ``fsync`` per directory (16 chunk files: 0.6 ms against
    3.3 ms here). Raises the OSError of writeback (Linux 5.8 on). ``os.sync`` without it."""
    fn = _libc_syncfs()
    if fn is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if fn(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs: {os.strerror(code)}", path)
    finally:
        os.close(fd)


def _unlink_quiet(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        try:
            os.unlink(path)
        except IsADirectoryError:  # a directory where a chunk was (corruption): if empty
            os.rmdir(path)


def _unlink_best_effort(path: str) -> None:
    """Cleanup after a failed write: must not mask the error that caused it."""
    with contextlib.suppress(OSError):
        os.unlink(path)
