"""Garbage collection, fenced against commits: delete only what nothing can still commit.

A pass runs in this order, and the order is what makes it safe (see ``intents.py``):

1. Nameless files (``write_file`` or a new version in progress, or a replaced file kept for
   its readers) are dropped once no writer can publish them: unsealed ones when their writer
   holds no live claim and has committed nothing for the lease plus ``grace``; sealed ones
   (kept after replacement) ``grace`` seconds after they lost their name.
2. Every live disk's chunks are listed.
3. Then the claims (``IntentRecord``) are read, and only then the Block layer. A chunk on disk
   was announced before it was written, and a commit adds its block and removes its claim in
   one transaction, so each chunk listed in step 2 is seen in step 3 as claimed or referenced
   unless nothing can commit it any more.
4. A claim is live while it has not expired (plus ``grace``) and, for a writer's, while the
   writer still holds the file's token. Expired claims are fenced: removed in one transaction
   (with the writer's token taken, so it cannot go on), only if unchanged since step 3; a
   claim renewed or committed meanwhile is left, and so are its chunks.
5. Chunks that are neither referenced (by placement: node, disk and id) nor claimed, and at
   least ``grace`` seconds old, are deleted. Age only ever delays a deletion; it never
   decides one.

Ids not of the block format (``<16 hex>.<index>.<8 hex>``, ``blockwrite.new_chunk_id``), such
as metadata backups (``mb-...``), are never garbage collection's: they are counted and kept.

When the metadata looks empty or foreign (under 1% of the block-format chunks on disk are
referenced, and there is something to delete), nothing is deleted: ``MetadataMismatchError``
names the counts, and ``i_know`` (the exact number of chunks that would be deleted) overrides.
"""

from __future__ import annotations

import math
import re
import secrets
from dataclasses import asdict, dataclass, replace
from typing import Any

from tectonic_emu import clock
from tectonic_emu.chunkstore.base import ChunkInfo
from tectonic_emu.errors import InvalidArgumentError, MetadataMismatchError, NodeUnavailableError
from tectonic_emu.intents import WRITE_LEASE
from tectonic_emu.metadata.records import IntentRecord
from tectonic_emu.store import StoreView

# Extra seconds after a claim's lease (and before an unclaimed chunk is taken): a margin for
# clocks that disagree and for writers slower than their lease.
DEFAULT_GC_GRACE = 600.0

# Under this share of block-format chunks referenced, the metadata does not describe the
# nodes (a lost or foreign database) and deleting the rest would delete the data.
MIN_REFERENCED_SHARE = 0.01

_BLOCK_CHUNK = re.compile(r"([0-9a-f]{16})\.\d+\.[0-9a-f]{8}")


def chunk_block_id(chunk_id: str) -> int | None:
    """The block id a block-format chunk id starts with; None for any other (foreign) id."""
    m = _BLOCK_CHUNK.fullmatch(chunk_id)
    return None if m is None else int(m.group(1), 16)


def check_grace(grace: float) -> float:
    """``grace`` if it is a usable number of seconds; else InvalidArgumentError."""
    if isinstance(grace, bool) or not isinstance(grace, int | float):
        raise InvalidArgumentError(f"gc grace must be a number of seconds, not {grace!r}")
    if math.isnan(grace) or grace < 0:
        raise InvalidArgumentError(f"gc grace must be 0 seconds or more, not {grace}")
    return float(grace)


@dataclass(slots=True)
class GarbageReport:
    deleted: int = 0  # chunks deleted
    nameless_files_dropped: int = 0
    writers_fenced: int = 0  # expired claims taken (and their writers' tokens)
    in_flight_kept: int = 0  # unreferenced chunks under a live claim
    foreign_kept: int = 0  # chunk ids not of the block format
    referenced: int = 0  # block-format chunks on disk that a block names
    block_chunks: int = 0  # block-format chunks on disk

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Listed:
    node: int
    disk: int
    info: ChunkInfo


async def garbage_pass(
    cluster: StoreView,
    *,
    grace: float = DEFAULT_GC_GRACE,
    i_know: int | None = None,
    lease: float = WRITE_LEASE,
) -> GarbageReport:
    """One pass (see the module docstring). ``lease``: how long a nameless file's writer may
    go without a commit or a claim before it counts as gone (the writers' ``write_lease``).

    Raises InvalidArgumentError (a negative or non-number ``grace``), MetadataMismatchError
    (the metadata looks empty or foreign, or ``i_know`` is not the count; nothing deleted),
    and OSError from the metadata store. Nodes down or dying are skipped: their chunks wait
    for the next pass.
    """
    grace = check_grace(grace)
    if i_know is not None and (
        isinstance(i_know, bool) or not isinstance(i_know, int) or i_know < 0
    ):
        raise InvalidArgumentError(f"i_know must be a count of chunks (0 or more), not {i_know!r}")
    report = GarbageReport()
    await _drop_nameless(cluster, grace, lease, report)

    listed: list[_Listed] = []  # step 2, before any metadata is read
    for node in cluster.nodes:
        if not node.available:
            continue
        for disk in range(node.disks):
            try:
                infos = await node.list_chunks(disk)
            except NodeUnavailableError:
                continue
            listed.extend(_Listed(node.node_id, disk, i) for i in infos)

    claims: dict[int, list[IntentRecord]] = {}  # step 3: claims, then blocks
    async for intent in cluster.meta.iter_intents():
        claims.setdefault(intent.block_id, []).append(intent)
    tokens = {f.file_id: f.token async for f in cluster.meta.iter_files()}
    referenced: set[tuple[int, int, str]] = set()
    async for rec in cluster.meta.iter_blocks():
        referenced.update((c.node, c.disk, c.chunk_id) for c in rec.chunks)
    now = clock.wall()

    live: set[int] = set()  # block ids with a live claim
    expired: list[IntentRecord] = []
    for block_id, intents in claims.items():
        for intent in intents:
            holds = intent.by_repair or tokens.get(intent.file_id) == intent.owner
            if holds and intent.expires + grace > now:
                live.add(block_id)
            else:
                expired.append(intent)

    candidates: list[_Listed] = []
    for item in listed:
        bid = chunk_block_id(item.info.chunk_id)
        if bid is None:
            report.foreign_kept += 1
            continue
        report.block_chunks += 1
        if (item.node, item.disk, item.info.chunk_id) in referenced:
            report.referenced += 1
        elif bid in live:
            report.in_flight_kept += 1
        elif item.info.mtime <= now - grace:
            candidates.append(item)

    if candidates:
        _check_metadata_describes_nodes(report, len(candidates), i_know)
    fenced = {i.block_id for i in expired if await _fence(cluster, i)}
    report.writers_fenced = len(fenced)
    for item in candidates:
        bid = chunk_block_id(item.info.chunk_id)
        if bid in claims and bid not in fenced:
            # A claim that expired but was renewed or committed before we could fence it:
            # its chunks may be referenced now.
            report.in_flight_kept += 1
            continue
        try:
            await cluster.nodes[item.node].delete_chunk(item.disk, item.info.chunk_id)
        except NodeUnavailableError:
            continue
        report.deleted += 1
    return report


def _check_metadata_describes_nodes(report: GarbageReport, count: int, i_know: int | None) -> None:
    looks_foreign = report.referenced < MIN_REFERENCED_SHARE * report.block_chunks
    if i_know is not None and i_know != count:
        raise MetadataMismatchError(
            f"refusing to delete: {count} chunks are garbage, not the {i_know} given to "
            f"--i-know ({report.referenced} of {report.block_chunks} chunks on disk referenced)"
        )
    if looks_foreign and i_know is None:
        raise MetadataMismatchError(
            f"refusing to delete {count} chunks: only {report.referenced} of "
            f"{report.block_chunks} chunks on disk are referenced by the metadata, which looks "
            f"empty or foreign (restore it; or if this is right, pass --i-know {count})"
        )


async def _fence(cluster: StoreView, seen: IntentRecord) -> bool:
    """Remove an expired claim, and take its writer's token, if the claim is as ``seen``."""
    async with cluster.meta.transaction() as m:
        if await m.intents.get(seen.block_id, seen.owner) != seen:
            return False  # renewed or committed meanwhile
        await m.intents.delete(seen.block_id, seen.owner)
        f = await m.files.get(seen.file_id)
        if f is not None and not seen.by_repair and f.token == seen.owner:
            # A token nobody holds: the writer's next append or commit fails, and a new
            # writer may take the file over as after a crash.
            await m.files.put(replace(f, token=secrets.token_hex(8)))
    return True


async def _drop_nameless(
    cluster: StoreView, grace: float, lease: float, report: GarbageReport
) -> None:
    now = clock.wall()
    writing: set[int] = set()  # files with a claim live by its date (checked again below)
    async for intent in cluster.meta.iter_intents():
        if intent.expires + grace > now:
            writing.add(intent.file_id)
    stale = []
    async for f in cluster.meta.iter_files():
        if f.parent is not None or f.file_id in writing:
            continue
        idle = now - f.mtime
        if idle > (grace if f.sealed else grace + lease):
            stale.append(f)
    for seen in stale:
        async with cluster.meta.transaction() as m:
            now_rec = await m.files.get(seen.file_id)
            # Unchanged: a commit (which moves mtime) or a publish meanwhile keeps it.
            dropped = now_rec == seen
            garbage = await m.drop_file(seen.file_id) if dropped else []
        report.nameless_files_dropped += dropped
        report.deleted += await cluster.datapath.delete_chunks(garbage)


async def collect_garbage(
    cluster: StoreView, *, grace: float = DEFAULT_GC_GRACE, i_know: int | None = None
) -> int:
    """``garbage_pass``; returns how many chunks were deleted."""
    return (await garbage_pass(cluster, grace=grace, i_know=i_know)).deleted


__all__ = [
    "DEFAULT_GC_GRACE",
    "MIN_REFERENCED_SHARE",
    "GarbageReport",
    "check_grace",
    "chunk_block_id",
    "collect_garbage",
    "garbage_pass",
]
