"""The ``tectonic-emu bench`` command group."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from bench.checkpoint import DEFAULT_PATHS
from bench.models import MODELS
from tectonic_emu.coding import KNOWN_ENCODINGS, Encoding
from tectonic_emu.config import DEFAULT_BLOCK_SIZE, parse_size

err_console = Console(stderr=True)
MODEL_NAMES = tuple(MODELS)
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def dir_option(what: str) -> Callable[[F], F]:
    """``--dir``: where a benchmark puts its files (``what``), the temp dir by default."""
    return click.option(
        "--dir",
        "directory",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        callback=lambda _ctx, _param, value: value or Path(tempfile.gettempdir()),
        help=f"{what.removesuffix('.')} [default: the temp dir].",
    )


class EtaColumn(TimeRemainingColumn):
    """``eta 0:01:03``: the time remaining, named (beside the time elapsed); blank while the
    total is unknown."""

    def render(self, task: Task) -> Text:
        left = super().render(task)
        return Text(f"eta {left.plain}", style=left.style) if left.plain else left


def bar_columns() -> tuple[ProgressColumn, ...]:
    """The bar's columns: stage, bar, percentage, time elapsed and time remaining. Until a
    bench gives a fraction the bar pulses and the percentage and time remaining are blank."""
    return (
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        EtaColumn(),
    )


def run_bench(name: str, bench_fn: Callable[..., Coroutine[Any, Any, T]], **kwargs: Any) -> T:
    """Run ``bench_fn(**kwargs, step=...)`` under a progress bar on stderr. ``step(text)``
    names the stage; ``step(text, fraction)`` also moves the bar (it pulses until then).
    No bar when stderr is not a terminal: rich would leave an empty line there."""
    with Progress(
        *bar_columns(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as progress:
        task = progress.add_task(f"bench {name}", total=None)

        def step(text: str, fraction: float | None = None) -> None:
            if fraction is None:
                progress.update(task, description=f"bench {name}: {text}")
            else:
                progress.update(
                    task, description=f"bench {name}: {text}", total=1.0, completed=fraction
                )

        return asyncio.run(bench_fn(**kwargs, step=step))


def plot_option(f: F) -> F:
    """``--plot DIR``: also write the bench's PNG plots there."""
    return click.option(
        "--plot",
        "plot_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Also write PNG plots (matplotlib) into this directory.",
    )(f)


def emit(result: Any, as_json: bool, plot_dir: Path | None, module: Any) -> None:
    """Print ``result`` as JSON or as the module's tables, and write its plots if asked."""
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        for make in ("table", "served_table", "targets_table"):
            table = getattr(module, make, lambda _: None)(result)
            if table is not None:
                Console().print(table)
    if plot_dir is not None:
        for png in module.plot(result, plot_dir):
            err_console.print(f"wrote {png}")


def csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in csv_list(text))
    except ValueError:
        raise click.BadParameter("comma-separated integers", param_hint=option) from None


@click.group()
def bench() -> None:
    """Throughput benchmarks, each figure beside this machine's limit.

    \b
    Example:
      tectonic-emu bench store --size 512MiB --json
    """


@bench.command("store")
@click.option("--size", default="512MiB", show_default=True, help="Bytes written per encoding.")
@click.option(
    "--encodings",
    default="r1,r3,rs-6-3,rs-10-4",
    show_default=True,
    help=f"Comma-separated, from {', '.join(KNOWN_ENCODINGS)} or any rs-D-P.",
)
@click.option("--block-size", default=f"{DEFAULT_BLOCK_SIZE >> 20}MiB", show_default=True)
@click.option("--runs", default=3, show_default=True, help="Measured runs after one warm-up.")
@dir_option("Where the cluster and the raw file go (same disk for both).")
@click.option("--no-sync", is_flag=True, help="Page-cache mode for the store (raw still fsyncs).")
@click.option(
    "--served",
    is_flag=True,
    help="Also measure the served path (node processes over TCP) in the same rounds.",
)
@click.option(
    "--write-ack",
    type=click.Choice(["all", "quorum"]),
    default=None,
    help="Force one ack policy on both paths [default: all embedded, quorum served].",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def store(
    size: str,
    encodings: str,
    block_size: str,
    runs: int,
    directory: Path,
    no_sync: bool,
    served: bool,
    write_ack: str | None,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """Store goodput per encoding beside raw pwrite+fdatasync to the same disk.

    \b
    Example:
      tectonic-emu bench store --size 512MiB --encodings r3,rs-6-3 --json
      tectonic-emu bench store --size 512MiB --encodings r3,rs-6-3 --served
    """
    from bench import store as mod

    encs = [Encoding.parse(e.strip()).name for e in encodings.split(",") if e.strip()]
    result = run_bench(
        "store",
        mod.run_store_bench,
        size=parse_size(size),
        encodings=encs,
        directory=directory,
        block_size=parse_size(block_size),
        runs=runs,
        sync=not no_sync,
        served=served,
        write_ack=write_ack,
    )
    emit(result, as_json, plot_dir, mod)


@bench.command("hedge")
@click.option("--size", default="256MiB", show_default=True, help="Bytes per file.")
@click.option("--encodings", default="r3,rs-6-3", show_default=True, help="Comma-separated.")
@click.option("--delay", default="200ms", show_default=True, help="Reply delay of node 0.")
@click.option("--block-size", default=f"{DEFAULT_BLOCK_SIZE >> 20}MiB", show_default=True)
@click.option("--runs", default=2, show_default=True, help="Measured runs after one warm-up.")
@dir_option("Where the clusters go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def hedge(
    size: str,
    encodings: str,
    delay: str,
    block_size: str,
    runs: int,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """One slow node, with and without hedged writes and reads (served clusters).

    \b
    Example:
      tectonic-emu bench hedge --size 256MiB --delay 200ms --json
    """
    from bench import hedge as mod
    from tectonic_emu.cli import parse_duration

    encs = [Encoding.parse(e.strip()).name for e in encodings.split(",") if e.strip()]
    result = run_bench(
        "hedge",
        mod.run_hedge_bench,
        size=parse_size(size),
        encodings=encs,
        delay=parse_duration(delay),
        directory=directory,
        block_size=parse_size(block_size),
        runs=runs,
    )
    emit(result, as_json, plot_dir, mod)


@bench.command("net")
@click.option("--nic-gbps", default=1.0, show_default=True, help="The link's NIC rate, Gb/s.")
@click.option("--rtt-ms", default=20.0, show_default=True, help="The link's added round trip.")
@click.option("--loss", default=0.0, show_default=True, help="Probability a segment is lost.")
@click.option("--chunk", default="1MiB", show_default=True, help="Bytes per chunk sent.")
@click.option(
    "--depth",
    default=0,
    show_default=True,
    help="Chunks in flight (0: twice the bandwidth-delay product, at least 8).",
)
@click.option("--seconds", default=3.0, show_default=True, help="Seconds per figure and run.")
@click.option("--runs", default=3, show_default=True, help="Runs (figures: the median).")
@dir_option("Where the clusters go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def net(
    nic_gbps: float,
    rtt_ms: float,
    loss: float,
    chunk: str,
    depth: int,
    seconds: float,
    runs: int,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """The emulated network (cluster create --nic-gbps/--rtt-ms/--loss): a paced link's
    round trip, write and read rates beside its settings, each within 10% or not.

    \b
    Example:
      tectonic-emu bench net --nic-gbps 2 --rtt-ms 5 --json
    """
    from bench import net as mod

    result = run_bench(
        "net",
        mod.run_net_bench,
        directory=directory,
        nic_gbps=nic_gbps,
        rtt_ms=rtt_ms,
        loss=loss,
        chunk=parse_size(chunk),
        depth=depth,
        seconds=seconds,
        runs=runs,
    )
    emit(result, as_json, plot_dir, mod)


@bench.command("fuse")
@click.option("--size", default="1GiB", show_default=True, help="Bytes per file.")
@click.option("--encoding", default="rs-6-3", show_default=True, help="Encoding of the files.")
@click.option("--runs", default=3, show_default=True, help="Measured runs after one warm-up.")
@dir_option("Where the cluster, the mount point and the local file go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def fuse(
    size: str, encoding: str, runs: int, directory: Path, as_json: bool, plot_dir: Path | None
) -> None:
    """The FUSE mount (default and --direct-io) beside the native client and the local
    disk (1 MiB I/O).

    \b
    Example:
      tectonic-emu bench fuse --size 1GiB --json
    """
    from bench import fuse as mod

    enc = Encoding.parse(encoding).name
    result = run_bench(
        "fuse",
        mod.run_fuse_bench,
        size=parse_size(size),
        encoding=enc,
        directory=directory,
        runs=runs,
    )
    emit(result, as_json, plot_dir, mod)


@bench.command("ckpt")
@click.option("--size", default="1GiB", show_default=True, help="Bytes of the checkpoint.")
@click.option("--ranks", default=1024, show_default=True, help="In-process ranks.")
@click.option("--encoding", default="rs-6-3", show_default=True, help="Encoding of the files.")
@click.option("--runs", default=3, show_default=True, help="Measured runs after one warm-up.")
@dir_option("Where the cluster and the raw-disk file go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def ckpt(
    size: str,
    ranks: int,
    encoding: str,
    runs: int,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """A synchronized checkpoint of many ranks (save and save_async) beside one writer
    writing the same bytes as one file, and the raw disk.

    \b
    Example:
      tectonic-emu bench ckpt --size 1GiB --ranks 1024 --json
    """
    from bench import ckpt as mod

    enc = Encoding.parse(encoding).name
    result = run_bench(
        "ckpt",
        mod.run_ckpt_bench,
        size=parse_size(size),
        ranks=ranks,
        encoding=enc,
        directory=directory,
        runs=runs,
    )
    emit(result, as_json, plot_dir, mod)


@bench.command("checkpoint")
@click.option(
    "--model",
    type=click.Choice(sorted(MODEL_NAMES)),
    default="llama3-8b",
    show_default=True,
    help="MLPerf Storage v2.0 checkpointing model.",
)
@click.option("--ranks", type=int, default=None, help="Ranks [default: 8, 64, 512, 1024 by model].")
@click.option(
    "--scale",
    type=float,
    default=0.005,
    show_default=True,
    help="Fraction of the full checkpoint written (llama3-8b: 105 GiB x S).",
)
@click.option("--encodings", default="r1,r3,rs-6-3", show_default=True, help="Native and FUSE.")
@click.option(
    "--paths",
    default=",".join(DEFAULT_PATHS),
    show_default=True,
    help="Comma-separated paths to measure.",
)
@click.option(
    "--peers",
    default="",
    help="Peers to set up on loopback and measure: juicefs, seaweedfs, seaweedfs-r3, "
    "glusterfs, glusterfs-r3 (each when installed).",
)
@click.option("--writes", default=2, show_default=True, help="Checkpoints written per path.")
@click.option("--reads", type=int, default=None, help="Checkpoints read [default: --writes].")
@click.option("--pause", default=0.5, show_default=True, help="Seconds between writes.")
@click.option("--runs", default=1, show_default=True, help="Repeated runs (figures: the mean).")
@click.option(
    "--read-shift",
    default=1,
    show_default=True,
    help="Rank r reads rank (r + K)'s files (0: its own).",
)
@click.option("--workers", default=8, show_default=True, help="Threads for blocking paths.")
@click.option(
    "--hosts",
    default=0,
    show_default=True,
    help="Also measure our client against a cluster across N hosts made as network namespaces "
    "(paths hosts/<encoding>; needs root and PostgreSQL) (0: not).",
)
@click.option(
    "--hosts-nic-gbps", default=0.0, show_default=True, help="Those hosts' emulated NICs, Gb/s."
)
@click.option(
    "--hosts-rtt-ms", default=0.0, show_default=True, help="Those hosts' emulated round trip."
)
@dir_option("Where the cluster, mounts, local files and peers go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema: docs/schemas/).")
@plot_option
def checkpoint_cmd(
    model: str,
    ranks: int | None,
    scale: float,
    encodings: str,
    paths: str,
    peers: str,
    writes: int,
    reads: int | None,
    pause: float,
    runs: int,
    read_shift: int,
    workers: int,
    hosts: int,
    hosts_nic_gbps: float,
    hosts_rtt_ms: float,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """MLPerf Storage v2.0 checkpointing, through every path in one run: the raw disk, our
    client per encoding, the FUSE mount, torch.save and DCP locally, DCP through our plugin
    and at the mount, the peers named in --peers, and with --hosts our client against a
    cluster across namespaced hosts.

    \b
    Example:
      tectonic-emu bench checkpoint --model llama3-8b --scale 0.01 --peers juicefs,glusterfs-r3
      tectonic-emu bench checkpoint --paths native --hosts 3 --hosts-nic-gbps 10 --hosts-rtt-ms 1
    """
    from bench import checkpoint as mod

    result = run_bench(
        "checkpoint",
        mod.run_checkpoint_bench,
        model=model,
        ranks=ranks,
        scale=scale,
        encodings=csv_list(encodings),
        paths=csv_list(paths),
        peers=csv_list(peers),
        writes=writes,
        reads=reads,
        pause=pause,
        runs=runs,
        read_shift=read_shift,
        workers=workers,
        hosts=hosts,
        hosts_nic_gbps=hosts_nic_gbps,
        hosts_rtt_ms=hosts_rtt_ms,
        directory=directory,
    )
    emit(result, as_json, plot_dir, mod)


@bench.command("train")
@click.option("--record-scale", default=1 / 32, show_default=True, help="unet3d record factor.")
@click.option("--samples", default=400, show_default=True, help="Records in the dataset.")
@click.option("--epochs", default=2, show_default=True, help="Epochs per trial.")
@click.option(
    "--sources",
    default="native,fsspec,local",
    show_default=True,
    help="Where the accelerators read from (comma-separated).",
)
@dir_option("Where the cluster and the local copy go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def train_cmd(
    record_scale: float,
    samples: int,
    epochs: int,
    sources: str,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """The largest number of emulated h100 accelerators that keep AU >= 90% on a scaled
    unet3d dataset, through the native client, fsspec and local disk, in one run.

    \b
    Example:
      tectonic-emu bench train --json
    """
    from bench import train as mod

    result = run_bench(
        "train",
        mod.run_train_bench,
        directory=directory,
        record_scale=record_scale,
        samples=samples,
        epochs=epochs,
        sources=tuple(s.strip() for s in sources.split(",") if s.strip()),
    )
    emit(result, as_json, plot_dir, mod)


@bench.command("metadata")
@click.option(
    "--ranks", default="1,4,16,64,256,1024", show_default=True, help="Comma-separated rank counts."
)
@click.option(
    "--backends",
    default=None,
    help="Comma-separated, from sqlite, sqlite-nosync, memory, postgresql, mount (needs "
    "FUSE) [default: sqlite,sqlite-nosync,memory, and postgresql where it is installed].",
)
@click.option(
    "--postgres",
    "postgres_url",
    default=None,
    metavar="URL",
    help="The PostgreSQL server for the postgresql backend (a fresh table in it) [default: a "
    "throwaway server on loopback, started and removed by the bench].",
)
@click.option(
    "--files-total",
    default=2048,
    show_default=True,
    help="Files per rank count, split over the ranks (at least 2 per rank).",
)
@click.option("--runs", default=1, show_default=True, help="Runs per point (median).")
@dir_option("Where the clusters (and the mount point) go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def metadata_cmd(
    ranks: str,
    backends: str | None,
    postgres_url: str | None,
    files_total: int,
    runs: int,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """mdtest-style metadata rates (create, stat, list, delete) of 1 to 1,024 ranks at once,
    per metadata backend.

    \b
    Example:
      tectonic-emu bench metadata --ranks 1,16,256,1024 --json
      tectonic-emu bench metadata --backends sqlite,postgresql --postgres postgresql://db1/bench
    """
    from bench import metadata as mod

    names = tuple(csv_list(backends)) if backends else mod.default_backends()
    unknown = [b for b in names if b not in mod.BACKENDS]
    if unknown:
        raise click.BadParameter(
            f"unknown {', '.join(unknown)}; choose from {', '.join(mod.BACKENDS)}",
            param_hint="--backends",
        )
    result = run_bench(
        "metadata",
        mod.run_metadata_bench,
        directory=directory,
        ranks=int_list(ranks, "--ranks"),
        backends=names,
        files_total=files_total,
        runs=runs,
        postgres_url=postgres_url,
    )
    emit(result, as_json, plot_dir, mod)


@bench.command("scale")
@click.option("--size", default="256MiB", show_default=True, help="Checkpoint bytes (every N).")
@click.option(
    "--ranks", default="1,16,256,1024,4096", show_default=True, help="Comma-separated rank counts."
)
@click.option("--encoding", default="rs-6-3", show_default=True, help="Encoding of the files.")
@click.option("--runs", default=3, show_default=True, help="Measured runs after one warm-up.")
@click.option(
    "--load-in-flight",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks loading at once [default: all].",
)
@dir_option("Where the cluster and the raw-disk file go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def scale_cmd(
    size: str,
    ranks: str,
    encoding: str,
    runs: int,
    load_in_flight: int | None,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """The same checkpoint saved and loaded by 1 to 4,096 ranks, against the time at 16.

    \b
    Example:
      tectonic-emu bench scale --size 256MiB --ranks 1,16,256,1024,4096 --json --plot plots/
    """
    from bench import scale as mod

    result = run_bench(
        "scale",
        mod.run_scale_bench,
        size=parse_size(size),
        ranks=int_list(ranks, "--ranks"),
        encoding=Encoding.parse(encoding).name,
        directory=directory,
        runs=runs,
        load_in_flight=load_in_flight,
    )
    emit(result, as_json, plot_dir, mod)


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
    help="Peers for bench checkpoint [default: every installed one; none with --quick].",
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
