"""The bytes of ``bench checkpoint``: the plan's files (``clients/ckpt_models.py``: MLPerf Storage
v2.0's checkpoint of a model, its files and their sizes per rank) laid end to end in one buffer
of random bytes, and the buffer that reads land in.

Every path writes from and reads into these same two buffers, so no path pays for allocating
memory the others do not, and a read's bytes are checked against the payload outside the
timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.store import aligned_buffer
from clients.ckpt_models import CheckpointFile, CheckpointPlan
from tectonic_emu.config import parse_size

GB = 1e9
MAX_TOTAL = parse_size("6GiB")  # the payload and the read buffers both live in memory


class BenchError(RuntimeError):
    """A path's bytes came back wrong, or the bench cannot run as asked."""


@dataclass(frozen=True, slots=True)
class Placed:
    """One checkpoint file, and where its bytes sit in the payload and in the read buffer."""

    file: CheckpointFile
    offset: int


class Payload:
    """The plan's files laid end to end in one random buffer; a second buffer of the same size
    receives reads (both page aligned, touched once, reused by every path and round)."""

    def __init__(self, plan: CheckpointPlan) -> None:
        self.plan = plan
        self.total = plan.total
        if self.total > MAX_TOTAL:
            raise BenchError(
                f"the checkpoint is {self.total / GB:.1f} GB at this scale; lower --scale "
                f"(at most {MAX_TOTAL / GB:.1f} GB here)"
            )
        self.data = aligned_buffer(self.total)
        fill = np.random.default_rng()  # PCG64: random bytes at memory speed; urandom is 0.2 GB/s
        words = np.frombuffer(self.data, dtype=np.uint8)
        for off in range(0, self.total, 64 << 20):
            n = min(64 << 20, self.total - off)
            words[off : off + n] = np.frombuffer(fill.bytes(n), dtype=np.uint8)
        self.back = aligned_buffer(self.total)
        self.ranks: list[list[Placed]] = []  # by rank, its files
        at = 0
        for r in plan.per_rank:
            self.ranks.append([])
            for f in r.files:
                self.ranks[-1].append(Placed(f, at))
                at += f.size

    def src(self, p: Placed) -> memoryview:
        return self.data[p.offset : p.offset + p.file.size]

    def dst(self, p: Placed) -> memoryview:
        return self.back[p.offset : p.offset + p.file.size]

    def clear_back(self) -> None:
        """Zero the read buffer, so that a read that skips a file cannot pass the check."""
        np.frombuffer(self.back, dtype=np.uint8)[:] = 0

    def check_back(self, key: str) -> None:
        if not np.array_equal(byte_array(self.back), byte_array(self.data)):
            raise BenchError(f"{key}: the bytes read back differ from those written")

    def source_rank(self, rank: int, shift: int) -> int:
        return (rank + shift) % self.plan.ranks


def byte_array(view: memoryview) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """``view`` as an array of bytes, without a copy."""
    return np.frombuffer(view, dtype=np.uint8)


__all__ = ["GB", "MAX_TOTAL", "BenchError", "Payload", "Placed", "byte_array"]
