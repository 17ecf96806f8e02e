"""``ReadHandle``: a file open for reading on the mount, its chunk-sized segments fetched
ahead into buffers of the mount's pool (``docs/fuse.md``, *How reads are served*)."""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import mmap
import threading
from typing import Protocol

from tectonic_emu.bridge import Bridge
from tectonic_emu.bufpool import BufferPool, address_of
from tectonic_emu.reader import FileReader

# How much of a file a read handle fetches ahead of the reader, in segments (chunks).
READAHEAD_SEGMENTS = 8
# Reads that fall in no segment already fetched, in a row, after which a handle lets its
# segments go and reads each straight from the store: only its bytes (the store reads just
# the 8 KiB pieces that hold them), no segment, no readahead.
RANDOM_AFTER = 2
# Bytes read in a row, each read continuing the last, that bring segments back. A handle
# starts reading straight from the store, too. Not one read that continues another: random
# reads make such pairs (the kernel splits a request around pages it has cached, and reads
# context readahead of up to 640 KiB before one whose neighbour it has), and each such pair
# fetched a 48 MiB rs-6-3 segment and started 8 more (``bench random``: 128 KiB reads went
# from 2-3 bytes read per byte asked to 1.1).
STREAM_AFTER = 1 << 20


class View(Protocol):
    """A write handle's view of a file it rewrites (``WriteHandle.read``)."""

    def read(self, size: int, offset: int) -> bytes: ...


class Host(Protocol):
    """What a read handle asks of its mount (``TectonicFS``)."""

    bridge: Bridge
    pool: BufferPool
    segment: int

    def unpublished(self, file_id: int) -> View | None: ...

    def streamed_more(self, file_id: int) -> bool: ...

    def moved_on(self, handle: ReadHandle) -> None: ...


def _copy_out(dest: int, src: int, n: int) -> None:
    ctypes.memmove(dest, src, n)  # ctypes releases the GIL for the copy


@dataclasses.dataclass(slots=True, eq=False)
class _Segment:
    buf: mmap.mmap  # page-aligned, ``segment`` bytes, from the mount's pool
    address: int  # of ``buf``'s first byte
    fetched: concurrent.futures.Future[int] | None = None  # bytes read into it
    pins: int = 0  # reads copying out of it right now
    settled: bool = False  # its fetch has ended: nothing more lands in ``buf``
    dropped: bool = False  # out of the handle: ``buf`` goes back once unpinned and settled


class ReadHandle:
    """A file opened for reading: segments of ``segment`` bytes fetched ahead, in buffers
    lent by the mount's pool (``tectonic_emu.bufpool``).

    It reads the file as it is, as POSIX has it: new contents written through this mount
    (``TectonicFS.replaced``), and bytes a writer here streamed past what it has seen, are
    read from its next read on (``_catch_up``)."""

    def __init__(self, fs: Host, reader: FileReader) -> None:
        self.fs = fs
        self.reader = reader  # the file's block map, looked up at open or since
        self.file_id = reader.file_id
        # The file whose blocks ``reader`` reads: ``file_id``, or once new contents replaced
        # them, the nameless file they are kept in until this handle moves on (``stale``).
        self.holds = reader.file_id
        self.stale = False
        self.size = reader.size
        self.segment = fs.segment
        self._lock = threading.Lock()
        self._reloading = threading.Lock()
        self._segments: dict[int, _Segment] = {}
        self._next: int | None = None  # where the last read ended (None: no read yet)
        self._run = 0  # bytes read in a row, each continuing the last (``STREAM_AFTER``)
        self._jumps = 0  # reads in a row that did not, while streaming (``RANDOM_AFTER``)
        self._streaming = False  # reading through segments (else straight from the store)

    def _catch_up(self, end: int) -> None:
        """Look the block map up again if the file changed under it: new contents moved
        in, or a read reaching past its end while a writer here has streamed more."""
        if not self.stale and (end <= self.size or not self.fs.streamed_more(self.file_id)):
            return
        with self._reloading:
            if not self.stale and end <= self.size:
                return
            reader = self.fs.bridge.call(self.fs.bridge.client.reader_id(self.file_id))
            with self._lock:
                for seg in self._segments.values():
                    self._drop(seg)
                self._segments.clear()
                self.reader, self.size, self.stale = reader, reader.size, False
            self.fs.moved_on(self)

    def _want(self, index: int) -> _Segment:
        """Segment ``index``, its fetch started if it was not there (lock held)."""
        seg = self._segments.get(index)
        if seg is None:
            start = index * self.segment
            length = min(self.segment, self.size - start)
            buf = self.fs.pool.take()
            seg = self._segments[index] = _Segment(buf, address_of(buf))
            seg.fetched = self.fs.bridge.submit(self._fetch(self.reader, seg, start, length))
        return seg

    async def _fetch(self, reader: FileReader, seg: _Segment, start: int, length: int) -> int:
        try:
            return await reader.read_into(start, memoryview(seg.buf)[:length])
        finally:
            # The store's reads settle before they end, even when cancelled: from here on
            # nothing writes into the buffer, and it may go back to the pool.
            with self._lock:
                seg.settled = True
                self._give_back(seg)

    def _drop(self, seg: _Segment) -> None:
        """``seg`` leaves the handle (lock held): its fetch is cancelled if still running and
        no read waits for it."""
        seg.dropped = True
        assert seg.fetched is not None
        if not seg.settled and seg.pins == 0:
            seg.fetched.cancel()
        self._give_back(seg)

    def _give_back(self, seg: _Segment) -> None:
        if seg.dropped and seg.settled and seg.pins == 0:
            self.fs.pool.give(seg.buf)
            seg.pins = -1  # given: never twice

    def read_into(self, dest: int, size: int, offset: int) -> int:
        """Copy up to ``size`` bytes at ``offset`` to the address ``dest``; the count."""
        if size <= 0:
            return 0
        writing = self.fs.unpublished(self.file_id)
        if writing is not None:  # a rewrite here not yet published: read what it has
            data = writing.read(size, offset)
            ctypes.memmove(dest, data, len(data))
            return len(data)
        self._catch_up(offset + size)
        if offset >= self.size:
            return 0
        end = min(self.size, offset + size)
        first, last = offset // self.segment, (end - 1) // self.segment
        if self._random(offset, end, first, last):
            view = memoryview((ctypes.c_char * (end - offset)).from_address(dest)).cast("B")
            return int(self.fs.bridge.call(self.reader.read_into(offset, view)))
        with self._lock:
            segs = [self._want(i) for i in range(first, last + 1)]
            for seg in segs:
                seg.pins += 1
            for i in range(last + 1, last + 1 + READAHEAD_SEGMENTS):
                if i * self.segment < self.size:
                    self._want(i)
            for i in [i for i in self._segments if i < first - 1]:
                self._drop(self._segments.pop(i))  # behind the reader
        copied = 0
        try:
            for k, i in enumerate(range(first, last + 1)):
                lo = max(offset, i * self.segment) - i * self.segment
                try:
                    fetched = self._result(segs[k])
                except Exception:
                    # Fetched ahead, perhaps before a node came back: fetch it once more now,
                    # and fail (EIO) only if that fails too.
                    segs[k] = self._refetch(i, segs[k])
                    fetched = self._result(segs[k])
                seg = segs[k]
                hi = min(end - i * self.segment, self.segment, fetched)
                if lo >= hi:
                    break
                _copy_out(dest + copied, seg.address + lo, hi - lo)
                copied += hi - lo
        finally:
            with self._lock:
                for seg in segs:
                    seg.pins -= 1
                    self._give_back(seg)
        return copied

    def _random(self, offset: int, end: int, first: int, last: int) -> bool:
        """Whether to read ``[offset, end)`` (segments ``first`` to ``last``) straight from
        the store. A handle reads so until reads in a row, each continuing the last, cover
        ``STREAM_AFTER`` bytes; then segments serve the reads that fall in them, and the
        others are read straight, until ``RANDOM_AFTER`` of those in a row drop the segments
        (their readahead cancelled)."""
        with self._lock:
            continues = offset == self._next
            self._run = self._run + end - offset if continues else end - offset
            self._next = end
            if not self._streaming:
                self._streaming = continues and self._run >= STREAM_AFTER
                self._jumps = 0
                return not self._streaming
            if all(i in self._segments for i in range(first, last + 1)):
                self._jumps = 0
                return False
            self._jumps += 1
            if self._jumps >= RANDOM_AFTER:
                self._streaming = False
                for seg in self._segments.values():
                    self._drop(seg)
                self._segments.clear()
            return True

    @staticmethod
    def _result(seg: _Segment) -> int:
        assert seg.fetched is not None
        return seg.fetched.result()

    def _refetch(self, index: int, failed: _Segment) -> _Segment:
        """A fresh fetch of segment ``index`` in place of ``failed`` (pinned for the caller,
        who holds a pin on ``failed``, which it gives up); a failure is not kept, so the next
        read tries again too."""
        with self._lock:
            failed.pins -= 1
            if self._segments.get(index) is failed:
                self._drop(self._segments.pop(index))
            else:
                self._give_back(failed)
            seg = self._want(index)
            seg.pins += 1
        try:
            self._result(seg)
        except Exception:
            with self._lock:
                if self._segments.get(index) is seg:
                    self._drop(self._segments.pop(index))
        return seg

    def read(self, size: int, offset: int) -> bytes:
        out = bytearray(max(0, size))
        if not out:
            return b""
        n = self.read_into(ctypes.addressof(ctypes.c_char.from_buffer(out)), len(out), offset)
        return bytes(out[:n])

    def close(self) -> None:
        with self._lock:
            for seg in self._segments.values():
                self._drop(seg)
            self._segments.clear()


__all__ = ["RANDOM_AFTER", "READAHEAD_SEGMENTS", "STREAM_AFTER", "Host", "ReadHandle", "View"]
