"""Scrub: read every chunk the Block layer references and check it end to end.

Stateless and restartable: it walks the Block layer in key order and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tectonic_emu.errors import ChunkCorruptError, ChunkNotFoundError, NodeUnavailableError
from tectonic_emu.metadata.records import BlockRecord, ChunkPlacement
from tectonic_emu.store import StoreView

Progress = Callable[[int], None]  # called with the bytes just checked


@dataclass(frozen=True, slots=True)
class ChunkProblem:
    block_id: str
    index: int
    node: int
    disk: int
    chunk_id: str
    path: str | None
    error: str


@dataclass(slots=True)
class ScrubReport:
    blocks: int = 0
    chunks: int = 0
    bytes_checked: int = 0
    corrupt: list[ChunkProblem] = field(default_factory=list)
    missing: list[ChunkProblem] = field(default_factory=list)
    unavailable: list[ChunkProblem] = field(default_factory=list)  # on nodes that are down

    @property
    def clean(self) -> bool:
        return not (self.corrupt or self.missing or self.unavailable)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["clean"] = self.clean
        return d


def problem(
    cluster: StoreView, rec: BlockRecord, c: ChunkPlacement, err: BaseException
) -> ChunkProblem:
    path = cluster.nodes[c.node].chunk_path(c.disk, c.chunk_id)
    return ChunkProblem(f"{rec.block_id:016x}", c.index, c.node, c.disk, c.chunk_id, path, str(err))


async def check_block(
    cluster: StoreView, rec: BlockRecord
) -> tuple[
    dict[int, tuple[ChunkPlacement, memoryview | bytes]], list[tuple[ChunkPlacement, BaseException]]
]:
    """Read every chunk of a block: (good chunks by index with their raw bytes, bad ones)."""

    async def one(c: ChunkPlacement) -> tuple[ChunkPlacement, Any]:
        try:
            return c, await cluster.datapath.scrub_chunk(c)
        except (OSError, EOFError) as e:
            return c, e

    good: dict[int, tuple[ChunkPlacement, Any]] = {}
    bad: list[tuple[ChunkPlacement, BaseException]] = []
    for c, r in await asyncio.gather(*(one(c) for c in rec.chunks)):
        if isinstance(r, BaseException):
            bad.append((c, r))
        elif c.index not in good:
            good[c.index] = (c, r)
    return good, bad


async def scrub(
    cluster: StoreView, *, progress: Progress | None = None, depth: int = 4
) -> ScrubReport:
    """Verify every chunk; report corrupt, missing and unreachable ones. Changes nothing."""
    report = ScrubReport()

    async def one(rec: BlockRecord) -> None:
        good, bad = await check_block(cluster, rec)
        report.blocks += 1
        report.chunks += len(rec.chunks)
        nbytes = sum(c.stored_len for c, _ in good.values())
        report.bytes_checked += nbytes
        for c, err in bad:
            p = problem(cluster, rec, c, err)
            if isinstance(err, ChunkCorruptError):
                report.corrupt.append(p)
            elif isinstance(err, ChunkNotFoundError):
                report.missing.append(p)
            elif isinstance(err, NodeUnavailableError):
                report.unavailable.append(p)
            else:
                report.corrupt.append(p)
        if progress is not None:
            progress(nbytes)

    await for_each_block(cluster, one, depth=depth)
    return report


async def for_each_block(
    cluster: StoreView, fn: Callable[[BlockRecord], Awaitable[None]], *, depth: int
) -> None:
    """Run ``fn`` over every block record, ``depth`` blocks at a time."""
    batch: list[BlockRecord] = []
    async for rec in cluster.meta.iter_blocks():
        batch.append(rec)
        if len(batch) == depth:
            await asyncio.gather(*(fn(r) for r in batch))
            batch = []
    await asyncio.gather(*(fn(r) for r in batch))


__all__ = ["ChunkProblem", "ScrubReport", "check_block", "for_each_block", "problem", "scrub"]
