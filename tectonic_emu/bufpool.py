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

import ctypes
import mmap
import threading

import numpy as np

from tectonic_emu.coding._native import pinned

PAGE = 4096
# Below this a copy holds the GIL (a slice assignment); above, ctypes.memmove releases it.
_GIL_FREE_COPY = 256 << 10


def uninitialised(n: int) -> memoryview:
    """``n`` writable bytes, page-aligned and not zeroed: from malloc (through numpy), which
    recycles freed blocks warm, unlike a fresh ``mmap`` (and unlike ``bytearray``, which
    zeroes them first)."""
    raw = np.empty(n + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + n].data


def address_of(buf: mmap.mmap) -> int:
    """The address of a writable buffer's first byte (valid while ``buf`` lives)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def copy_into(dest: memoryview, at: int, src: memoryview) -> None:
    """``dest[at : at + len(src)] = src``, releasing the GIL for big copies (other threads
    run meanwhile; a slice assignment holds it throughout)."""
    n = src.nbytes
    if n < _GIL_FREE_COPY:
        dest[at : at + n] = src
        return
    with pinned([dest], writable=True) as [(d, _)], pinned([src]) as [(s, _)]:
        ctypes.memmove(d + at, s, n)


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


__all__ = ["PAGE", "BufferPool", "address_of", "copy_into", "uninitialised"]
