"""The ``tectonic-emu bench`` command group: the group itself, ``bench schema`` and ``bench
all``. The benches' commands live by family in ``bench/cli_storage.py`` and
``bench/cli_checkpoint.py`` and are added to the group here; what they share (options, the
progress bar, printing) is ``bench/cli_common.py``, below both.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from bench.cli_checkpoint import checkpoint_cmd, ckpt, scale_cmd, sim_cmd, train_cmd
from bench.cli_common import (
    EtaColumn,
    bar_columns,
    csv_list,
    dir_option,
    emit,
    err_console,
    int_list,
    plot_option,
    run_bench,
)
from bench.cli_storage import (
    fuse,
    hedge,
    metadata_cmd,
    net,
    posix,
    qos_cmd,
    random_cmd,
    store,
)


@click.group()
def bench() -> None:
    """Throughput benchmarks, each figure beside this machine's limit.

    \b
    Example:
      tectonic-emu bench store --size 512MiB --json
    """


SCHEMA_MODULES = (
    "store",
    "hedge",
    "fuse",
    "ckpt",
    "train",
    "checkpoint",
    "metadata",
    "scale",
    "net",
    "sim",
    "posix",
    "random_reads",
    "qos",
)


@bench.command("schema")
@click.argument("name", type=click.Choice(SCHEMA_MODULES), required=False)
@click.option(
    "--write",
    "write_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write every bench's schema as DIR/bench-<name>.schema.json instead.",
)
def schema_cmd(name: str | None, write_dir: Path | None) -> None:
    """The JSON Schema of a bench's --json output (committed in docs/schemas/).

    \b
    Example:
      tectonic-emu bench schema checkpoint
      tectonic-emu bench schema --write docs/schemas
    """
    import importlib

    if write_dir is None:
        if name is None:
            raise click.UsageError("name a bench, or pass --write DIR")
        click.echo(json.dumps(importlib.import_module(f"bench.{name}").SCHEMA, indent=2))
        return
    write_dir.mkdir(parents=True, exist_ok=True)
    for n in (name,) if name else SCHEMA_MODULES:
        doc = json.dumps(importlib.import_module(f"bench.{n}").SCHEMA, indent=2) + "\n"
        (write_dir / f"bench-{n}.schema.json").write_text(doc)
        click.echo(f"wrote {write_dir / f'bench-{n}.schema.json'}")


@bench.command("all")
@click.option(
    "--report",
    "report",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("docs/benchmarks.md"),
    show_default=True,
    help="The Markdown report to write.",
)
@click.option(
    "--assets",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the JSON and plots go [default: bench/ beside the report].",
)
@click.option("--only", default=None, help="Comma-separated benches [default: all].")
@click.option("--quick", is_flag=True, help="Tiny sizes: checks that everything runs.")
@click.option(
    "--peers",
    default=None,
    help="Peers for bench checkpoint (and JuiceFS for bench random) [default: every installed "
    "one; none with --quick].",
)
@dir_option("Where the benches put their clusters and files.")
def all_cmd(
    report: Path,
    assets: Path | None,
    only: str | None,
    quick: bool,
    peers: str | None,
    directory: Path,
) -> None:
    """Run every bench afresh and regenerate the report, its JSON and its plots.

    \b
    Example:
      tectonic-emu bench all --report docs/benchmarks.md
      tectonic-emu bench all --quick --only store,checkpoint --report /tmp/r.md
    """
    import datetime
    import sys

    from bench.report import NAMES, run_all, write_report

    names = csv_list(only) if only else list(NAMES)
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise click.BadParameter(f"unknown benches {unknown}; choose from {list(NAMES)}")
    assets = assets or report.parent / "bench"
    started = datetime.datetime.now(datetime.UTC)
    sections = run_bench(
        "all",
        run_all,
        directory=directory,
        assets=assets,
        only=names,
        quick=quick,
        peers=None if peers is None else csv_list(peers),
    )
    command = (
        "tectonic-emu bench " + " ".join(sys.argv[sys.argv.index("all") :])
        if ("all" in sys.argv)
        else "tectonic-emu bench all"
    )
    write_report(report, sections, assets=assets, command=command, started=started, quick=quick)
    click.echo(f"wrote {report} and {len(sections)} benches' JSON and plots in {assets}")


for command in (
    store,
    hedge,
    net,
    fuse,
    random_cmd,
    posix,
    ckpt,
    checkpoint_cmd,
    train_cmd,
    metadata_cmd,
    scale_cmd,
    sim_cmd,
    qos_cmd,
):
    bench.add_command(command)

__all__ = [
    "EtaColumn",
    "bar_columns",
    "bench",
    "csv_list",
    "dir_option",
    "emit",
    "err_console",
    "int_list",
    "plot_option",
    "run_bench",
]
