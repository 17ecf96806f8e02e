"""Page-aligned buffers of one size, mapped once and reused.

On this kind of VM memory handed back to the kernel is slow to touch again
(../shared/MACHINE.md), so buffers on the data path are kept and reused rather than
allocated per request. Two users:

- the mount's read handles fetch files ahead in block-sized segments. Allocated per handle,
  those buffers came from the arenas of libfuse's threads, zeroed on allocation and handed
  back to the kernel once a whole arena heap fell free: reading 8 files at once spent more
  time faulting in and zeroing fresh pages than copying data (``perf``: memset, page faults
  and munmap);
- a storage node writing a chunk with ``O_DIRECT`` copies a payload that is not page-aligned
  through one of these first (``chunkstore/_local.py``).
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
