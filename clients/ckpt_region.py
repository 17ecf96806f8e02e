"""Regions of global arrays: which stored rows a region needs, and even resharding.

Every stored array value is a box in its global array: a ``Shard`` at its offset, a plain
array at the origin of its own shape. A value is stored as parts of whole rows (axis 0), each
contiguous, so any box is read as one byte range per part it meets: the rows it needs, whole,
then cut along the other axes in memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clients.ckpt_format import CheckpointError, Entry, Part

Box = tuple[tuple[int, int], ...]  # [start, stop) per axis


def even_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of ``rank``'s rows when ``rows`` are split evenly over ``world_size``
    ranks (the first ``rows % world_size`` ranks get one more, as ``numpy.array_split``)."""
    base, extra = divmod(rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def region(index: Any, shape: tuple[int, ...]) -> tuple[Box, tuple[Any, ...]]:
    """For a numpy basic index (ints, slices, Ellipsis) into an array of ``shape``: the box
    covering what it selects, and the index that selects it from that box."""
    if index is None:
        index = ()
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        at = next(k for k, i in enumerate(index) if i is Ellipsis)
        fill = (slice(None),) * (len(shape) - len(index) + 1)
        index = index[:at] + fill + index[at + 1 :]
    if len(index) > len(shape):
        raise CheckpointError(f"index {index!r} has more axes than shape {shape}")
    index = index + (slice(None),) * (len(shape) - len(index))
    box: list[tuple[int, int]] = []
    inner: list[Any] = []
    for i, n in zip(index, shape, strict=True):
        if isinstance(i, (int, np.integer)):
            k = int(i) + n if i < 0 else int(i)
            if not 0 <= k < n:
                raise CheckpointError(f"index {i} is out of range for an axis of {n}")
            box.append((k, k + 1))
            inner.append(0)
        elif isinstance(i, slice):
            picked = range(*i.indices(n))
            if not picked:
                box.append((0, 0))
                inner.append(slice(0, 0))
                continue
            lo, hi = min(picked[0], picked[-1]), max(picked[0], picked[-1]) + 1
            box.append((lo, hi))
            stop = picked.stop - lo if picked.stop - lo >= 0 else None
            inner.append(slice(picked.start - lo, stop, picked.step))
        else:
            raise CheckpointError(f"only ints, slices and ... index a checkpoint, not {i!r}")
    return tuple(box), tuple(inner)


@dataclass(frozen=True, slots=True)
class RowRead:
    """Read ``length`` bytes at ``pos`` of ``file`` (rows of one part), shape them as
    ``rows_shape``, take ``source`` of them and put it at ``dest`` of the output."""

    entry: Entry
    part: Part
    file: str
    pos: int
    length: int
    rows_shape: tuple[int, ...]
    source: tuple[slice, ...]
    dest: tuple[slice, ...]
    whole_part: bool  # the read covers the whole part: its CRC can be checked


def plan(entries: Sequence[Entry], box: Box) -> list[RowRead]:
    """The reads that fill ``box`` from the array values ``entries`` (boxes of one global
    array); raises CheckpointError when they leave part of it uncovered."""
    reads: list[RowRead] = []
    covered = 0
    for e in entries:
        dtype = np.dtype(e.dtype)
        origin = e.offset or (0,) * len(e.shape)
        row_bytes = dtype.itemsize * math.prod(e.shape[1:])
        for p in e.parts:
            # This part is the box rows [row0, row1) x the rest of the value's shape.
            part_box = [(origin[0] + p.row0, origin[0] + p.row1)]
            part_box += [(o, o + n) for o, n in zip(origin[1:], e.shape[1:], strict=True)]
            meet = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(part_box, box, strict=True)]
            if any(lo >= hi for lo, hi in meet):
                continue
            covered += math.prod(hi - lo for lo, hi in meet)
            r0, r1 = meet[0][0] - part_box[0][0], meet[0][1] - part_box[0][0]
            across = zip(meet[1:], part_box[1:], strict=True)
            source = (slice(None), *(slice(lo - pb[0], hi - pb[0]) for (lo, hi), pb in across))
            dest = tuple(slice(lo - b[0], hi - b[0]) for (lo, hi), b in zip(meet, box, strict=True))
            reads.append(
                RowRead(
                    e,
                    p,
                    p.file,
                    p.pos + r0 * row_bytes,
                    (r1 - r0) * row_bytes,
                    (r1 - r0, *e.shape[1:]),
                    source,
                    dest,
                    whole_part=(r0, r1) == (0, p.row1 - p.row0),
                )
            )
    if covered < math.prod(hi - lo for lo, hi in box):
        raise CheckpointError(f"the stored pieces do not cover {box}")
    return reads


__all__ = ["Box", "RowRead", "even_rows", "plan", "region"]
