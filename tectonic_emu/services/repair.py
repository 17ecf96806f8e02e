"""Repair: give every block full redundancy again, then collect garbage.

For each block it reads every chunk (as scrub does). Chunks that are missing (a degraded
write left the block with fewer than its width), corrupt, on a node that is down, or sharing
a node with another chunk of the block are rebuilt from the good ones (re-replicated, or
re-encoded from any D chunks for Reed-Solomon) onto live nodes the block does not use yet.
The rebuilt chunks are written under a claim (``ChunkIntent``) so that garbage collection
leaves them alone; the new placement is committed, removing the claim, only if the block
record did not change in the meantime (the file may have been deleted) and the claim still
holds. The old bad chunks are deleted afterwards.

Garbage collection (``services/garbage.py``) then deletes the chunks nothing references.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tectonic_emu import buggify
from tectonic_emu.coding import Encoding, codec_for
from tectonic_emu.coding.synthetic import Payload
from tectonic_emu.errors import FencedWriterError, NotEnoughNodesError
from tectonic_emu.intents import ChunkIntent, repair_owner
from tectonic_emu.metadata.records import BlockRecord, ChunkPlacement
from tectonic_emu.placement import spread_is_short
from tectonic_emu.services.garbage import (
    DEFAULT_GC_GRACE,
    GarbageReport,
    check_grace,
    collect_garbage,
    garbage_pass,
)
from tectonic_emu.services.scrub import check_block, for_each_block
from tectonic_emu.store import StoreView


@dataclass(slots=True)
class RepairReport:
    blocks_checked: int = 0
    blocks_repaired: int = 0
    chunks_rebuilt: int = 0
    unrecoverable: list[str] = field(default_factory=list)  # block ids with < D good chunks
    not_enough_nodes: list[str] = field(default_factory=list)  # could not be placed now
    fenced: list[str] = field(default_factory=list)  # our claim expired: left for next time
    garbage_chunks_deleted: int = 0
    foreign_chunks_kept: int = 0  # ids not of the block format (e.g. metadata backups)
    writers_fenced: int = 0  # claims of paused or dead writers that garbage collection took

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
    avoid = seen_nodes
    if not missing:  # complete: spread it over failure domains, if that can be better
        crowded, onto = _spread_moves(cluster, keep)
        if not crowded:
            return
        for c in crowded:
            del keep[c.index]
        moved += crowded
        missing = sorted(c.index for c in crowded)
        # Only the chosen nodes in the emptier domains may take the moved chunks.
        avoid = {n.node_id for n in cluster.nodes} - set(onto)
    if len(good) < enc.min_chunks:
        if await _still(cluster, rec):  # not deleted or rewritten while it was read
            report.unrecoverable.append(f"{rec.block_id:016x}")
        return
    # A chunk that is only moved is good: it is copied, and is a source for the lost ones.
    rebuilt: dict[int, Payload] = {i: good[i][1] for i in missing if i in good}
    lost = [i for i in missing if i not in good]
    if lost:  # (replicated: a copy of a good chunk)
        sources = {i: d for i, (_, d) in good.items()}
        rebuilt.update(codec_for(enc).reconstruct(sources, lost, rec.length))
    async with ChunkIntent(cluster.meta, rec.block_id, rec.file_id, repair_owner()) as claim:
        try:
            new = await cluster.datapath.write_chunks(enc, rec.block_id, rebuilt, avoid=avoid)
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
        swapped = False
        try:
            async with cluster.meta.transaction() as m:
                current = await m.blocks.get(rec.block_id)
                if current == rec:
                    await claim.settle(m, f"block {rec.block_id:016x}")
                    await m.blocks.put(updated, old=rec)
                    swapped = True
        except FencedWriterError:  # paused past the lease: the next pass repairs it
            report.fenced.append(f"{rec.block_id:016x}")
    if not swapped:  # deleted, changed or fenced meanwhile: our chunks are not needed
        await cluster.datapath.delete_chunks(new)
        return
    doomed = [c for c, _ in bad] + moved
    if buggify.planted("repair-deletes-good"):  # a bug on purpose (docs/dst.md)
        doomed += [c for c, _ in keep.values()]
    await cluster.datapath.delete_chunks(doomed)
    report.blocks_repaired += 1
    report.chunks_rebuilt += len(new)


async def _still(cluster: StoreView, rec: BlockRecord) -> bool:
    """Whether ``rec`` is still the block's record. Repair walks the blocks while clients
    work: a file deleted meanwhile has its chunks deleted behind its records, which must
    not be reported lost (found by simulation testing, docs/dst.md)."""
    async with cluster.meta.view() as m:
        return await m.blocks.get(rec.block_id) == rec


def _spread_moves(
    cluster: StoreView, keep: dict[int, tuple[ChunkPlacement, Any]]
) -> tuple[list[ChunkPlacement], list[int]]:
    """Chunks to move out of crowded failure domains and the live nodes (in the emptiest
    domains, unused by the block) to move them to, while a move helps (``spread_is_short``).
    Nothing without failure domains."""
    domains = cluster.datapath.domains
    if domains is None:
        return [], []
    live = cluster.datapath.live_nodes()
    chunks = [c for c, _ in keep.values()]
    nodes = [c.node for c in chunks]
    movable: dict[str, list[ChunkPlacement]] = {}  # the block's own chunks, by domain
    for c in sorted(chunks, key=lambda c: c.index):
        movable.setdefault(domains[c.node], []).append(c)
    crowded: list[ChunkPlacement] = []
    onto: list[int] = []
    while spread_is_short(nodes, domains, live):
        count = Counter(domains[n] for n in nodes)
        top = max(count, key=lambda d: count[d])
        if not movable.get(top):
            break  # only chunks moved there already: leave it
        used = set(nodes)
        node = min((n for n in live if n not in used), key=lambda n: (count.get(domains[n], 0), n))
        c = movable[top].pop()
        crowded.append(c)
        onto.append(node)
        nodes.remove(c.node)
        nodes.append(node)
    return crowded, onto


async def repair(
    cluster: StoreView,
    *,
    gc_grace: float = DEFAULT_GC_GRACE,
    progress: Callable[[int], None] | None = None,
    depth: int = 4,
    i_know: int | None = None,
) -> RepairReport:
    """Rebuild what scrub would find bad, then collect garbage (``garbage_pass``, with
    ``gc_grace`` and ``i_know``). Safe to run again. Raises InvalidArgumentError (a negative
    ``gc_grace``, before anything is done) and MetadataMismatchError (after the repairs:
    the metadata looks empty or foreign, so no garbage was deleted)."""
    report = RepairReport()

    async def one(rec: BlockRecord) -> None:
        await repair_block(cluster, rec, report)
        report.blocks_checked += 1
        if progress is not None:
            progress(rec.length)

    check_grace(gc_grace)  # before any work: a bad grace is the caller's mistake
    await for_each_block(cluster, one, depth=depth)
    absorb_garbage(report, await garbage_pass(cluster, grace=gc_grace, i_know=i_know))
    return report


def absorb_garbage(report: RepairReport, gc: GarbageReport) -> None:
    """Add a garbage pass's counts to a repair report."""
    report.garbage_chunks_deleted += gc.deleted
    report.foreign_chunks_kept += gc.foreign_kept
    report.writers_fenced += gc.writers_fenced


__all__ = [
    "DEFAULT_GC_GRACE",
    "RepairReport",
    "absorb_garbage",
    "collect_garbage",
    "repair",
    "repair_block",
]
