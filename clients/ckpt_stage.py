"""Staging a rank's state for a save: each value cut into parts of whole rows (``Item``), the
rank's values together (``Staged``), and the reused staging buffers ``save_async`` copies
into (``StagingPool``). Nothing here touches the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from clients.ckpt_format import CheckpointError, Entry, Kind, Shard, Value
from tectonic_emu.chunkstore.remote import aligned_buffer
from tectonic_emu.coding import work
from tectonic_emu.coding.synthetic import Payload, Synthetic

PART_BYTES = 4 << 20  # values are cut into parts of whole rows of at most this many bytes
_POOLED = 4096  # free staging buffers kept per size


@dataclass(slots=True)
class Item:
    """One named value of a rank, staged: its entry (parts still without places), the bytes
    of each part, and each part's rows."""

    entry: Entry
    pieces: list[Payload]  # memoryviews, or a Synthetic value (a projection's) whole
    rows: list[tuple[int, int]]


@dataclass(slots=True)
class Staged:
    rank: int
    items: list[Item]
    incremental: bool
    started: float
    written: asyncio.Future[int]  # resolves once the rank's parts are durable: bytes written
    buffers: list[memoryview] = field(default_factory=list)  # staging copies to give back
    blocked_s: float | None = None  # save_async: how long staging held the caller

    @property
    def nbytes(self) -> int:
        return sum(len(p) for item in self.items for p in item.pieces)


class StagingPool:
    """Page-aligned staging buffers by size, reused from one save to the next (fresh memory
    is slow to touch on this kind of machine, ../shared/MACHINE.md)."""

    def __init__(self) -> None:
        self._free: dict[int, list[memoryview]] = {}

    def copy(self, src: memoryview, buffers: list[memoryview]) -> memoryview:
        """A copy of ``src`` in a staging buffer, noted in ``buffers`` to give back."""
        free = self._free.get(len(src))
        buf = free.pop() if free else aligned_buffer(len(src))
        buf[:] = src
        work.count("copy", len(src))
        buffers.append(buf)
        return buf

    def give_back(self, buffers: list[memoryview]) -> None:
        for buf in buffers:
            free = self._free.setdefault(len(buf), [])
            if len(free) < _POOLED:
                free.append(buf)
        buffers.clear()


def stage_state(
    rank: int,
    state: Mapping[str, Value],
    *,
    incremental: bool,
    started: float,
    part_bytes: int,
    pool: StagingPool | None,
) -> Staged:
    """``rank``'s state staged: copied into ``pool``'s buffers when given (``save_async``),
    else referenced in place; the copies are given back if it fails. Raises CheckpointError
    for a bad name or value."""
    staged = Staged(rank, [], incremental, started, asyncio.get_running_loop().create_future())
    try:
        for name, value in state.items():
            staged.items.append(_stage(rank, name, value, part_bytes, pool, staged.buffers))
    except BaseException:
        if pool is not None:
            pool.give_back(staged.buffers)
        raise
    return staged


def _stage(
    rank: int,
    name: str,
    value: Value,
    part_bytes: int,
    pool: StagingPool | None,
    buffers: list[memoryview],
) -> Item:
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"state names are non-empty strings, not {name!r}")
    kind: Kind
    if isinstance(value, Shard):
        arr, kind = value.array, "shard"
        at: tuple[tuple[int, ...], tuple[int, ...]] = (value.global_shape, value.offset)
    elif isinstance(value, np.ndarray):
        arr, kind, at = value, "array", ((), ())
    elif isinstance(value, Synthetic):  # a projection's bytes (docs/simulate.md): no copy,
        if pool is not None:  # but the work of the copy a bytes value would get
            work.count("copy", len(value))
        return Item(Entry(rank, name, "synthetic"), [value], [(0, 0)])
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = memoryview(value).cast("B")
        if pool is not None:
            raw = pool.copy(raw, buffers)
        return Item(Entry(rank, name, "bytes"), [raw], [(0, 0)])
    else:
        raise CheckpointError(
            f"{name!r}: a state value is a numpy array, bytes or a Shard, "
            f"not {type(value).__name__}"
        )
    if arr.dtype.hasobject:
        raise CheckpointError(f"{name!r}: arrays of Python objects cannot be stored")
    shape = tuple(arr.shape)  # ascontiguousarray makes a 0-d array 1-d
    arr = np.ascontiguousarray(arr)
    flat = arr.reshape(-1).view(np.uint8).data if arr.size else memoryview(b"")
    if pool is not None:
        flat = pool.copy(flat, buffers)
    rows = arr.shape[0] if arr.ndim else 1
    row_bytes = arr.nbytes // rows if rows else 0
    step_rows = max(1, part_bytes // row_bytes) if row_bytes else max(rows, 1)
    pieces, bounds = [], []
    for r0 in range(0, max(rows, 1), step_rows):
        r1 = min(rows, r0 + step_rows)
        pieces.append(flat[r0 * row_bytes : r1 * row_bytes])
        bounds.append((r0, r1))
    entry = Entry(rank, name, kind, arr.dtype.str, shape, *at)
    return Item(entry, pieces, bounds)


__all__ = ["PART_BYTES", "Item", "Staged", "StagingPool", "stage_state"]
