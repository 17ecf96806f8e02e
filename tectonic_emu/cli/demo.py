"""``tectonic-emu demo``: the main job, and its summary at 80 columns."""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import click
from rich.table import Table

from tectonic_emu.cli.common import (
    err_console,
    json_option,
    out_console,
    print_json,
    run,
)
from tectonic_emu.coding import KNOWN_ENCODINGS, Encoding
from tectonic_emu.config import (
    parse_size,
)
from tectonic_emu.demo import DemoReport, run_demo
from tectonic_emu.resources import Needs, check_fits, human_bytes


@click.command("demo")
@click.option(
    "--cluster",
    "cluster_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to create the demo cluster (default: a temporary directory, removed after).",
)
@click.option(
    "--size", default="48MiB", show_default=True, help="Bytes written per encoding (at least 1MiB)."
)
@json_option
def demo(cluster_dir: Path | None, size: str, as_json: bool) -> None:
    """The main job: store and read back data with every encoding, lose a node, repair.

    Exits 0 only if every byte read back was right and repair restored full redundancy.

    \b
    Example:
      tectonic-emu demo --size 64MiB
    """
    nbytes = parse_size(size)
    where = cluster_dir if cluster_dir is not None else Path(tempfile.gettempdir())
    overheads = sum(Encoding.parse(e).overhead for e in KNOWN_ENCODINGS)
    check_fits(
        nbytes,
        # The bytes written, their read-back copy and the blocks in flight; every encoding's
        # file on disk at once.
        lambda n: Needs(memory=3 * n, disk=math.ceil(n * overheads)),
        where,
        minimum=DEMO_MIN_SIZE,
        at_least="less takes too little time to give a rate",
    )
    with err_console.status("demo") as status:
        report = run(run_demo(cluster_dir, size=nbytes, step=lambda s: status.update(s)))
    if as_json:
        print_json(report.to_dict())
    else:
        _print_demo(report, nbytes)
    if not report.all_verified or report.below_redundancy_after_restart:
        sys.exit(3)


DEMO_MIN_SIZE = 1 << 20  # below a MiB a write or read takes too little time to give a rate


def _print_demo(report: DemoReport, nbytes: int) -> None:
    lost = f"node {report.stopped_node} lost"
    table = Table(title=f"tectonic-emu demo: {report.nodes} nodes, {human_bytes(nbytes)} each")
    for col in ("encoding", "overhead", "write MB/s", "read MB/s", "read back", lost):
        table.add_column(col, justify="right")
    for r in report.results:
        table.add_row(
            r.encoding,
            f"{r.overhead:.2f}x",
            f"{r.write_mb_s:.0f}",
            f"{r.read_mb_s:.0f}",
            _ok(r.verified),
            _ok(r.verified_after_node_loss),
        )
    out_console.print(table)
    held = report.stopped_node_encodings
    missing = [e for e in KNOWN_ENCODINGS if e not in held and e != "r1"]
    if missing:
        which = f"held no chunks of {', '.join(missing)} (too few blocks to reach every node)"
    else:
        which = "held chunks of every encoding but r1 (one copy survives no loss)"
    out_console.print(f"node {report.stopped_node} {which}")
    out_console.print(
        f"blocks below redundancy: {report.below_redundancy_after_loss} after the loss, "
        f"{report.below_redundancy_after_repair} after repair"
    )
    if report.below_redundancy_after_repair:
        out_console.print("  (encodings as wide as the cluster wait for the node to return)")
    out_console.print(
        f"repair rebuilt {report.repaired_blocks} blocks; "
        f"{report.below_redundancy_after_restart} below redundancy once the node was back"
    )


def _ok(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]NO[/red]"


__all__ = ["demo"]
