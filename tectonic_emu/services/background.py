"""Background services of a served cluster: repair and scrub, at a configurable pace.

``repair_loop`` runs a pass every ``interval`` seconds. A pass rebuilds every block that lacks
full redundancy: a chunk missing from a live node (a hedged write's straggler that failed, a
lost file), two chunks sharing a node (a degraded write), or a chunk on a node that has been
down for ``repair_after`` seconds or more. The blocks of a dead node are found by walking the
disk -> block reverse index of each of its disks, so the pass costs what the dead node held,
not what the cluster holds. A node down for less than ``repair_after`` is left alone: a
restart should not trigger a rebuild. Each pass ends with garbage collection.

``scrub_loop`` reads every chunk end to end, at most ``rate`` bytes per second, and repairs the
blocks where it finds a corrupt or missing chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from tectonic_emu import clock
from tectonic_emu.coding import Encoding
from tectonic_emu.errors import NodeUnavailableError
from tectonic_emu.metadata.records import BlockRecord
from tectonic_emu.placement import spread_is_short
from tectonic_emu.services.garbage import garbage_pass
from tectonic_emu.services.repair import RepairReport, absorb_garbage, repair_block
from tectonic_emu.services.scrub import check_block
from tectonic_emu.store import StoreView

log = logging.getLogger(__name__)


class WatchedStore(StoreView, Protocol):
    """A store that knows how long each node has been down (``Cluster`` does)."""

    def down_since(self, n: int) -> float:
        """When node ``n`` went down (``clock.wall()``), or 0.0 when unknown or up."""
        ...


async def blocks_needing_repair(cluster: WatchedStore, *, repair_after: float) -> list[BlockRecord]:
    """Blocks to rebuild now (see the module docstring), each once."""
    now = clock.wall()
    dead = [
        n.node_id
        for n in cluster.nodes
        if not n.available and now - cluster.down_since(n.node_id) >= repair_after
    ]
    present: dict[tuple[int, int], set[str]] = {}
    for node in cluster.nodes:
        if node.available:
            for d in range(node.disks):
                # A node dying now is not listed: its chunks count as neither here nor missing.
                with contextlib.suppress(NodeUnavailableError):
                    present[(node.node_id, d)] = {c.chunk_id for c in await node.list_chunks(d)}
    domains = cluster.datapath.domains
    live = cluster.datapath.live_nodes()
    todo: dict[int, BlockRecord] = {}
    for n in dead:  # the reverse index: only the dead node's blocks
        for d in range(cluster.config.disks_per_node):
            for block_id in await cluster.meta.blocks_on_disk(n, d):
                rec = await cluster.meta.block(block_id)
                if rec is not None:
                    todo[block_id] = rec
    async for rec in cluster.meta.iter_blocks():
        if rec.block_id in todo:
            continue
        nodes = [c.node for c in rec.chunks]
        # Fewer chunks than the width: a degraded write, acknowledged at its minimum.
        width = Encoding.parse(rec.encoding).width
        short = rec.length > 0 and len({c.index for c in rec.chunks}) < width
        crowded = spread_is_short(nodes, domains, live)  # more on one host than it must
        shared = short or crowded or len(set(nodes)) != len(nodes)
        missing = any(
            (c.node, c.disk) in present and c.chunk_id not in present[(c.node, c.disk)]
            for c in rec.chunks
        )
        # A block committed after the listing may look as if it missed chunks: repair_block
        # reads the chunks again before it rebuilds anything.
        if shared or missing:
            todo[rec.block_id] = rec
    return list(todo.values())


async def repair_pass(
    cluster: WatchedStore, *, repair_after: float, gc_grace: float
) -> RepairReport:
    report = RepairReport()
    for rec in await blocks_needing_repair(cluster, repair_after=repair_after):
        await repair_block(cluster, rec, report)
        report.blocks_checked += 1
    absorb_garbage(report, await garbage_pass(cluster, grace=gc_grace))
    return report


async def repair_loop(
    cluster: WatchedStore, *, interval: float, repair_after: float, gc_grace: float
) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            report = await repair_pass(cluster, repair_after=repair_after, gc_grace=gc_grace)
        except OSError as e:  # a node died mid-pass: the next pass goes on from there
            log.warning("repair pass stopped: %s", e)
            continue
        if (
            report.blocks_repaired
            or report.unrecoverable
            or report.not_enough_nodes
            or report.garbage_chunks_deleted
        ):
            log.info("repair: %s", report.to_dict())


async def scrub_pass(cluster: StoreView, *, rate: float) -> RepairReport:
    """Check every block at most ``rate`` bytes per second; repair those with a bad chunk on
    a live node (chunks on nodes that are down are repair_loop's business)."""
    report = RepairReport()
    t0 = clock.monotonic()
    checked = 0
    async for rec in cluster.meta.iter_blocks():
        good, bad = await check_block(cluster, rec)
        report.blocks_checked += 1
        checked += sum(c.stored_len for c, _ in good.values())
        if any(cluster.nodes[c.node].available for c, _ in bad):
            await repair_block(cluster, rec, report)
        ahead = checked / rate - (clock.monotonic() - t0)
        if ahead > 0:
            await asyncio.sleep(ahead)
    return report


async def scrub_loop(cluster: StoreView, *, interval: float, rate: float) -> None:
    while True:
        try:
            report = await scrub_pass(cluster, rate=rate)
        except OSError as e:  # as in repair_loop: one failed pass must not end scrubbing
            log.warning("scrub pass stopped: %s", e)
        else:
            if report.blocks_repaired:
                log.info("scrub repaired %d blocks", report.blocks_repaired)
        await asyncio.sleep(interval)


__all__ = ["blocks_needing_repair", "repair_loop", "repair_pass", "scrub_loop", "scrub_pass"]
