"""``scrub`` and ``repair``: the services, run once from the command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tectonic_emu.cli.common import (
    cluster_option,
    json_option,
    print_json,
    progress_bar,
    run,
    with_cluster,
)
from tectonic_emu.cluster import Cluster
from tectonic_emu.config import parse_duration
from tectonic_emu.resources import human_bytes
from tectonic_emu.services import repair, scrub


@click.command("scrub")
@cluster_option
@json_option
def scrub_cmd(cluster_dir: Path, as_json: bool) -> None:
    """Read and verify every chunk; list corrupt, missing and unreachable ones.

    Exits 0 when everything is clean, 3 when problems were found.

    \b
    Example:
      tectonic-emu scrub --cluster /tmp/c1 --json
    """

    async def go(c: Cluster) -> Any:
        total = await _block_bytes(c, stored=True)  # scrub counts the chunk bytes it checked
        with progress_bar(total) as bar:
            task = bar.add_task("scrub", total=total)
            return await scrub(c, progress=lambda n: bar.advance(task, n))

    report = run(with_cluster(cluster_dir, go))
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(
            f"checked {report.blocks} blocks, {report.chunks} chunks, "
            f"{human_bytes(report.bytes_checked)}: "
            f"{len(report.corrupt)} corrupt, {len(report.missing)} missing, "
            f"{len(report.unavailable)} on nodes that are down"
        )
        for kind, items in (("corrupt", report.corrupt), ("missing", report.missing)):
            for p in items:
                click.echo(f"  {kind}: block {p.block_id} chunk {p.index} node {p.node}: {p.path}")
    if not report.clean:
        sys.exit(3)


@click.command("repair")
@cluster_option
@click.option(
    "--gc-grace",
    default="600s",
    show_default=True,
    help="Garbage collection's margin: a paused or dead writer's claim on its chunks is taken "
    "this long after its lease ran out, and an unclaimed, unreferenced chunk only once this "
    "old (0 is safe: live writers keep their claims). Not negative.",
)
@click.option(
    "--i-know",
    "i_know",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Delete the N garbage chunks even though the metadata references under 1% of the "
    "chunks on disk (it looks empty or foreign). N must be the count the refusal named.",
)
@json_option
def repair_cmd(cluster_dir: Path, gc_grace: str, i_know: int | None, as_json: bool) -> None:
    """Rebuild missing or corrupt chunks until every block has full redundancy, then delete
    the chunks that nothing references or claims (garbage collection).

    Refuses to delete anything (exit 1, one line naming the counts) when the metadata
    references under 1% of the chunks on the nodes; chunk ids not of the block format
    (metadata backups) are never deleted.

    \b
    Example:
      tectonic-emu repair --cluster /tmp/c1 --json
      tectonic-emu repair --cluster /tmp/c1 --gc-grace 0
    """
    grace = parse_duration(gc_grace)

    async def go(c: Cluster) -> Any:
        total = await _block_bytes(c, stored=False)  # repair counts each block's length
        with progress_bar(total) as bar:
            task = bar.add_task("repair", total=total)
            return await repair(
                c, gc_grace=grace, i_know=i_know, progress=lambda n: bar.advance(task, n)
            )

    report = run(with_cluster(cluster_dir, go))
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(
            f"checked {report.blocks_checked} blocks: repaired {report.blocks_repaired} "
            f"({report.chunks_rebuilt} chunks rebuilt), {len(report.unrecoverable)} unrecoverable, "
            f"{len(report.not_enough_nodes)} waiting for nodes; "
            f"{report.garbage_chunks_deleted} garbage chunks deleted, "
            f"{report.foreign_chunks_kept} foreign kept, {report.writers_fenced} writers fenced"
        )
    if report.unrecoverable or report.not_enough_nodes:
        sys.exit(3)


async def _block_bytes(c: Cluster, *, stored: bool) -> int:
    """The bar's total: one walk of the Block layer (not ``status()``, which also lists
    every chunk on every node), summing the chunks' stored bytes or the blocks' lengths."""
    total = 0
    async for rec in c.meta.iter_blocks():
        total += sum(ch.stored_len for ch in rec.chunks) if stored else rec.length
    return total


__all__ = ["repair_cmd", "scrub_cmd"]
