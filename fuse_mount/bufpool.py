"""Segment buffers shared by every read handle of a mount, mapped once and reused.

A read handle fetches a file ahead in block-sized segments, each into a buffer of its own.
Allocated per handle, those buffers came from the arenas of libfuse's threads: each an 8 MiB
``bytearray`` zeroed on allocation, and handed back to the kernel once a whole arena heap fell
free. On this kind of VM memory handed back is slow to touch again (../shared/MACHINE.md), so
reading 8 files at once spent more time faulting in and zeroing fresh pages than copying
data (``perf``: memset, page faults and munmap). A pool of page-aligned ``mmap`` buffers,
touched once and kept, serves every handle instead (docs/performance.md has the figures).
"""

from __future__ import annotations

import mmap
import threading


class BufferPool:
    """Page-aligned buffers (``mmap``) of ``size`` bytes; at most ``keep`` kept while free.

    ``take`` never blocks: it hands out a kept buffer or maps a new one, so a reader never
    waits for another's readahead. ``give`` keeps a buffer for reuse, or drops it (unmapped
    once no view of it is left) when ``keep`` are kept already. A buffer never given back is
    unmapped when the last reference to it goes. Thread-safe.
    """

    def __init__(self, size: int, keep: int) -> None:
        self.size = size
        self.keep = keep
        self._lock = threading.Lock()
        self._free: list[mmap.mmap] = []

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, self.size)

    def give(self, buf: mmap.mmap) -> None:
        """Back for reuse: the caller is done with ``buf``, and nothing writes to it."""
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)

    @property
    def kept(self) -> int:
        """Free buffers held for reuse now."""
        with self._lock:
            return len(self._free)

    def close(self) -> None:
        """Drop the free buffers and keep none from now on."""
        with self._lock:
            self._free, self.keep = [], 0


__all__ = ["BufferPool"]
