"""Repair: give every block full redundancy again, then collect garbage.

For each block it reads every chunk (as scrub does). Chunks that are missing, corrupt, on a
node that is down, or sharing a node with another chunk of the block are rebuilt from the good
ones (re-replicated, or re-encoded from any D chunks for Reed-Solomon) onto live nodes the block
does not use yet. The new placement is committed only if the block record did not change in the
meantime (the file may have been deleted); the old bad chunks are deleted afterwards.

Garbage collection then deletes chunks no block references (left by crashed writers, by
deletes while a node was down, or by the chunks repair replaced) once they are older than a
grace period, so that chunks of a write still in flight are never taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tectonic_emu.buffers import BytesLike
from tectonic_emu.coding import Encoding, codec_for
from tectonic_emu.errors import NotEnoughNodesError
from tectonic_emu.metadata.records import BlockRecord, ChunkPlacement
from tectonic_emu.services.scrub import check_block, for_each_block
from tectonic_emu.store import StoreView

# Unreferenced chunks younger than this may belong to a write in flight.
DEFAULT_GC_GRACE = 600.0


@dataclass(slots=True)
class RepairReport:
    blocks_checked: int = 0
    blocks_repaired: int = 0
    chunks_rebuilt: int = 0
    unrecoverable: list[str] = field(default_factory=list)  # block ids with < D good chunks
    not_enough_nodes: list[str] = field(default_factory=list)  # could not be placed now
    garbage_chunks_deleted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def repair_block(cluster: StoreView, rec: BlockRecord, report: RepairReport) -> None:
    enc = Encoding.parse(rec.encoding)
    good, bad = await check_block(cluster, rec)
    # One chunk per node: extra chunks sharing a node are moved (rebuilt elsewhere).
    keep: dict[int, tuple[ChunkPlacement, Any]] = {}
    seen_nodes: set[int] = set()
    moved: list[ChunkPlacement] = []
    for index, (c, data) in sorted(good.items()):
        if c.node in seen_nodes:
            moved.append(c)
        else:
            seen_nodes.add(c.node)
            keep[index] = (c, data)
    missing = [i for i in range(enc.width) if i not in keep]
    if not missing:
        return
    if len(good) < enc.min_chunks:
        report.unrecoverable.append(f"{rec.block_id:016x}")
        return
    rebuilt: dict[int, BytesLike]
    if enc.kind == "replication":
        payload = next(iter(good.values()))[1]
        rebuilt = dict.fromkeys(missing, payload)
    else:
        codec = codec_for(enc)
        rebuilt = codec.reconstruct({i: d for i, (_, d) in good.items()}, missing, rec.length)
    try:
        new = await cluster.datapath.write_chunks(enc, rec.block_id, rebuilt, avoid=seen_nodes)
    except NotEnoughNodesError:
        report.not_enough_nodes.append(f"{rec.block_id:016x}")
        return
    updated = BlockRecord(
        rec.block_id,
        rec.file_id,
        rec.length,
        rec.encoding,
        tuple(sorted([c for c, _ in keep.values()] + new, key=lambda c: c.index)),
    )
    async with cluster.meta.transaction() as m:
        current = await m.blocks.get(rec.block_id)
        if current == rec:
            await m.blocks.put(updated, old=rec)
    if current != rec:  # deleted or changed meanwhile: our chunks are not needed
        await cluster.datapath.delete_chunks(new)
        return
    await cluster.datapath.delete_chunks([c for c, _ in bad] + moved)
    report.blocks_repaired += 1
    report.chunks_rebuilt += len(new)


async def collect_garbage(cluster: StoreView, *, grace: float = DEFAULT_GC_GRACE) -> int:
    """Delete files that never got a name and chunks on live nodes that no block references,
    when older than ``grace`` seconds. Returns how many chunks were deleted."""
    cutoff = time.time() - grace
    # Nameless files older than the grace period are write_file calls that never finished.
    stale = [
        f.file_id async for f in cluster.meta.iter_files() if f.parent is None and f.mtime < cutoff
    ]
    for file_id in stale:
        async with cluster.meta.transaction() as m:
            f = await m.files.get(file_id)
            garbage = await m.drop_file(file_id) if f is not None and f.parent is None else []
        await cluster.datapath.delete_chunks(garbage)
    # By placement, not by id alone: a chunk id must be referenced on the node and disk
    # where it sits (a stale copy elsewhere, e.g. left by a retried write, is garbage).
    referenced: set[tuple[int, int, str]] = set()
    async for rec in cluster.meta.iter_blocks():
        referenced.update((c.node, c.disk, c.chunk_id) for c in rec.chunks)
    deleted = 0
    for node in cluster.nodes:
        if not node.available:
            continue
        for disk in range(node.disks):
            for info in await node.list_chunks(disk):
                if (node.node_id, disk, info.chunk_id) not in referenced and info.mtime < cutoff:
                    await node.delete_chunk(disk, info.chunk_id)
                    deleted += 1
    return deleted


async def repair(
    cluster: StoreView,
    *,
    gc_grace: float = DEFAULT_GC_GRACE,
    progress: Callable[[int], None] | None = None,
    depth: int = 4,
) -> RepairReport:
    """Rebuild what scrub would find bad, then collect garbage. Safe to run again."""
    report = RepairReport()

    async def one(rec: BlockRecord) -> None:
        await repair_block(cluster, rec, report)
        report.blocks_checked += 1
        if progress is not None:
            progress(rec.length)

    await for_each_block(cluster, one, depth=depth)
    report.garbage_chunks_deleted = await collect_garbage(cluster, grace=gc_grace)
    return report


__all__ = ["DEFAULT_GC_GRACE", "RepairReport", "collect_garbage", "repair", "repair_block"]
