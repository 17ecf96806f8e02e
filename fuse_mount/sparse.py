"""Where a local sparse file (the mount's staging file) holds data and where it has holes.

Publishing a staging file walks it with these regions: data is appended as bytes, a hole as
a hole (``FileWriter.append_hole``), so a ``truncate -s 1T`` sends nothing to the nodes.
"""

from __future__ import annotations

import errno
import os

# Holes of a staging file shorter than this are published as zero bytes: a hole is a File-layer
# entry (and a short block before it), which a gap of a few pages between writes is not worth.
MIN_HOLE = 1 << 20


def staged_regions(fd: int, size: int, min_hole: int = MIN_HOLE) -> list[tuple[int, int, bool]]:
    """The [start, end) regions of the first ``size`` bytes of the file open as ``fd``, in
    order, each with whether it is data (False: a hole of at least ``min_hole`` bytes, which
    reads as zeros). Found with ``SEEK_DATA``/``SEEK_HOLE``; shorter holes go with the data
    around them. Where the file system cannot tell (EINVAL), the rest is data. Raises the
    ``OSError`` of a failed seek otherwise."""
    regions: list[tuple[int, int, bool]] = []

    def add(start: int, end: int, data: bool) -> None:
        if end <= start:
            return
        data = data or end - start < min_hole
        if regions and regions[-1][2] == data:
            regions[-1] = (regions[-1][0], end, data)
        else:
            regions.append((start, end, data))

    off = 0
    while off < size:
        try:
            data_at = min(size, os.lseek(fd, off, os.SEEK_DATA))
        except OSError as e:
            if e.errno == errno.ENXIO:  # nothing but a hole from here on
                data_at = size
            elif e.errno == errno.EINVAL:  # no SEEK_DATA on this file system: all data
                add(off, size, True)
                break
            else:
                raise
        add(off, data_at, False)
        if data_at >= size:
            break
        hole_at = min(size, os.lseek(fd, data_at, os.SEEK_HOLE))
        add(data_at, hole_at, True)
        off = hole_at
    return regions


__all__ = ["MIN_HOLE", "staged_regions"]
