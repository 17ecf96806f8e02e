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

``Recycler`` serves a third, the writers' block buffers, which have no single owner to give
them back: after a block is acknowledged, chunk writes to straggling nodes still send from it.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
import weakref
from typing import Any

import numpy as np

from tectonic_emu.coding._native import pinned

PAGE = 4096
# Below this a copy holds the GIL (a slice assignment); above, ctypes.memmove releases it.
_GIL_FREE_COPY = 256 << 10


def uninitialised(n: int) -> memoryview:
    """``n`` writable bytes, page-aligned and not zeroed: from malloc (through numpy), which
    recycles freed blocks warm, unlike a fresh ``mmap`` (and unlike ``bytearray``, which
    zeroes them first)."""
    return _aligned_array(n).data


def _aligned_array(n: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    raw = np.empty(n + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + n]


# sys.getrefcount of an array in Recycler.take's loop that nothing else refers to: the list,
# the loop variable and getrefcount's own argument.
_UNREFERENCED = 3


class Recycler:
    """Page-aligned, unzeroed buffers of ``size`` bytes (as ``uninitialised``), handed out
    again once nothing refers to them any more; at most ``keep`` are tracked.

    Nothing is given back: ``take`` reuses a tracked buffer whose every view is gone (a
    memoryview, a slice of one, a numpy array over it: each holds a reference to the
    buffer's array, which a native call also holds while it runs). A buffer above malloc's
    mmap threshold (32 MiB here: an RS block of 6 x 8 MiB chunks) is fresh memory each time
    it is allocated, and on this kind of VM copying a checkpoint's 64 KiB parts into fresh
    memory ran at 0.5-1 GB/s, into reused memory at 3.5-7.5 GB/s (docs/performance.md).
    Thread-safe.

    ``stand_ins``: the buffers are empty arrays that stand for buffers of ``size`` bytes,
    for bytes described and never made (``stand_in``).
    """

    def __init__(self, size: int, keep: int, *, stand_ins: bool = False) -> None:
        self.size = size
        self.keep = keep
        self._lock = threading.Lock()
        self._arrays: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
        self._stand_ins = stand_ins
        self.reused = 0  # takes served by a tracked buffer (for tests and benches)

    def take(self) -> memoryview:
        return self.take_noting()[0]

    def take_noting(self) -> tuple[memoryview, bool]:
        """``take``, and whether the buffer is new: allocated now, its pages not touched
        yet, so the first copy into each faults it in (``coding/work.py``'s ``new-pages``).
        Below malloc's mmap threshold the heap may hand back memory touched before."""
        with self._lock:
            for arr in self._arrays:
                if sys.getrefcount(arr) <= _UNREFERENCED:
                    self.reused += 1
                    return arr.data, False
            arr = np.empty(0, dtype=np.uint8) if self._stand_ins else _aligned_array(self.size)
            if len(self._arrays) < self.keep:
                self._arrays.append(arr)
            return arr.data, True

    @property
    def tracked(self) -> int:
        with self._lock:
            return len(self._arrays)


_recyclers: dict[int, Recycler] = {}
_recyclers_lock = threading.Lock()
RECYCLED_BYTES = 512 << 20  # the most a process keeps in recycled buffers of one size


def recycled(n: int) -> memoryview:
    """``n`` bytes from the process's ``Recycler`` of that size (made on first use, keeping up
    to RECYCLED_BYTES and at least 2 buffers)."""
    return recycled_noting(n)[0]


def recycled_noting(n: int) -> tuple[memoryview, bool]:
    """``recycled``, and whether the buffer is new (``Recycler.take_noting``)."""
    return _recycler(_recyclers, n, stand_ins=False).take_noting()


def stand_in(n: int, host: object, processes: int = 1) -> tuple[memoryview, bool]:
    """For ``n`` bytes described, not made (a projection's ``Synthetic``), that a real writer
    would copy into ``recycled(n)`` on ``host`` (a projection's client host, running
    ``processes`` client processes): an empty view standing for that buffer, and whether
    the buffer would be new. Held for as long as the real buffer would be (a writer's
    block, until its pipeline and every chunk write are done with it), it has the host's
    stand-in recycler hand out new buffers when the real ones would: one recycler for
    the host, keeping what its processes' recyclers keep together. None: a host of its
    own for what runs outside any projection's."""
    with _recyclers_lock:
        mine = _stand_ins.setdefault(_NO_HOST if host is None else host, {})
    return _recycler(mine, n, stand_ins=True, processes=processes).take_noting()


def _recycler(
    recyclers: dict[int, Recycler], n: int, *, stand_ins: bool, processes: int = 1
) -> Recycler:
    r = recyclers.get(n)
    if r is None:
        with _recyclers_lock:
            keep = max(2, RECYCLED_BYTES // n) * processes
            r = recyclers.setdefault(n, Recycler(n, keep, stand_ins=stand_ins))
    return r


# Each host's stand-in recyclers by size, dropped with the host (a projection's).
_stand_ins: weakref.WeakKeyDictionary[object, dict[int, Recycler]] = weakref.WeakKeyDictionary()


class _Host:
    """The host of stand-ins taken outside any projection's."""


_NO_HOST = _Host()


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


__all__ = [
    "PAGE",
    "BufferPool",
    "Recycler",
    "address_of",
    "copy_into",
    "recycled",
    "recycled_noting",
    "stand_in",
    "uninitialised",
]
