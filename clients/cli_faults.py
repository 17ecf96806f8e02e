"""``tectonic-emu simulate faults``: seeded fault schedules over a whole model cluster
(``clients/dst``), each failing seed printed with the command that replays it."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from clients.dst import WORKLOADS, Summary, run_seeds
from tectonic_emu.cli.common import json_option, print_json, progress_bar


@click.command("faults")
@click.option(
    "--seeds",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Seeds to run, one after another.",
)
@click.option(
    "--seed",
    "first",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="The first seed (--seeds 1 --seed S replays seed S).",
)
@click.option(
    "--workload",
    type=click.Choice(WORKLOADS),
    default="files",
    show_default=True,
    help="What the clients do while the faults fall (docs/dst.md).",
)
@json_option
def simulate_faults(seeds: int, first: int, workload: str, as_json: bool) -> None:
    """Deterministic simulation testing: the whole cluster in one process, the real
    clients, data path and repair on model servers in virtual time, under a seeded
    schedule of faults (killed, slow and partitioned servers, full disks, corrupt and
    lost chunks, metadata outages and stalls, crashed and fenced writers). Checks that
    every acknowledged byte reads back, during the faults and after, that a crash keeps
    what was acknowledged durable, that repair brings every block back to full
    redundancy, that the reverse index matches the blocks, that a committed checkpoint
    loads back exactly and a failed one changes nothing, that every rank streams exactly
    its samples, and that no error is swallowed and no task leaked. Exits 3 if any seed
    fails, printing the command that replays it exactly (docs/dst.md).

    \b
    Example:
      tectonic-emu simulate faults --seeds 1000
      tectonic-emu simulate faults --seeds 1 --seed 42 --json
    """
    with progress_bar(None, items=True) as bar:
        task = bar.add_task(f"{workload}: seeds", total=seeds)
        summary = run_seeds(first, seeds, workload, progress=lambda: bar.advance(task))
    if as_json:
        print_json(summary.to_dict())
    else:
        _report(summary)
    if summary.failed:
        sys.exit(3)  # found problems, as scrub and repair (docs/errors.md)


def _report(summary: Summary) -> None:
    violations = sum(len(r.violations) for r in summary.failed)
    click.echo(
        f"{summary.seeds} seeds from {summary.first}: {len(summary.failed)} failed, "
        f"{violations} violations"
    )
    for title, counts in (("faults injected", summary.faults), ("operations", summary.ops)):
        table = Table(box=None)
        table.add_column(title)
        table.add_column("", justify="right")
        for kind, n in sorted(counts.items()):
            table.add_row(kind, f"{n:,}")
        Console(width=80).print(table)
    for r in summary.failed:
        click.echo(f"\nseed {r.seed} ({r.encoding}): {len(r.violations)} violations")
        for v in r.violations[:5]:
            click.echo(f"  {v}")
        click.echo(f"  replay: {r.replay}")


__all__ = ["simulate_faults"]
