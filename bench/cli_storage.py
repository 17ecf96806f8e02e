"""The storage benches' commands: ``bench store``, ``hedge``, ``net``, ``fuse`` and ``metadata``
(the client's goodput, hedging, the emulated network, the mount, the metadata rates). Each
imports its bench only when run.
"""

from __future__ import annotations

from pathlib import Path

import click

from bench.cli_common import csv_list, dir_option, emit, int_list, plot_option, run_bench
from tectonic_emu.coding import KNOWN_ENCODINGS, Encoding
from tectonic_emu.config import DEFAULT_BLOCK_SIZE, parse_size


@click.command("store")
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


@click.command("hedge")
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


@click.command("net")
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


@click.command("fuse")
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


@click.command("posix")
@click.option(
    "--source",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="pjdfstest's source (copied before it is built) [default: "
    "../shared/third_party/pjdfstest beside the checkout].",
)
@click.option("--only", default=None, help="Comma-separated system calls [default: all].")
@click.option(
    "--mounts",
    type=click.Choice(["both", "cached", "direct"]),
    default="both",
    show_default=True,
    help="The page-cache mount, the --direct-io one, or both.",
)
@dir_option("Where the build, the clusters and the mount points go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (each script's results).")
def posix(
    source: Path | None, only: str | None, mounts: str, directory: Path, as_json: bool
) -> None:
    """pjdfstest, the POSIX suite JuiceFS runs in its CI, inside a fresh mount (as root):
    the tests ok of those planned, per system call (issue 21). About 5 minutes a mount.

    \b
    Example:
      tectonic-emu bench posix --only chmod,link --mounts cached
      tectonic-emu bench posix --json > posix.json
    """
    from bench import posix as mod

    modes = {"both": (False, True), "cached": (False,), "direct": (True,)}[mounts]
    result = run_bench(
        "posix",
        mod.run_posix_bench,
        directory=directory,
        source=source or mod.DEFAULT_SOURCE,
        only=csv_list(only) if only else None,
        modes=modes,
    )
    emit(result, as_json, None, mod)


@click.command("metadata")
@click.option(
    "--ranks", default="1,4,16,64,256,1024", show_default=True, help="Comma-separated rank counts."
)
@click.option(
    "--backends",
    default=None,
    help="Comma-separated, from sqlite, sqlite-nosync, memory, postgresql, mount, juicefs, "
    "fuse-floor and fuse-raw-floor (need FUSE; the raw floor, root) [default: "
    "sqlite,sqlite-nosync,memory, and postgresql where it is installed].",
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
      tectonic-emu bench metadata --ranks 1,16 --backends mount,juicefs,fuse-raw-floor
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


@click.command("random")
@click.option("--size", default="256MiB", show_default=True, help="Bytes of the file read.")
@click.option("--requests", default=1000, show_default=True, help="Reads per path, size, round.")
@click.option(
    "--sizes", default="4KiB,128KiB", show_default=True, help="Comma-separated request sizes."
)
@click.option("--rounds", default=3, show_default=True, help="Measured rounds after a warm-up.")
@click.option("--encoding", default="rs-6-3", show_default=True, help="Encoding of the file.")
@click.option("--mount/--no-mount", default=True, show_default=True, help="Read through FUSE.")
@click.option(
    "--juicefs/--no-juicefs",
    default=None,
    help="Read through JuiceFS [default: where juicefs is installed].",
)
@click.option(
    "--quick", is_flag=True, help="Tiny sizes (16 MiB, 20 reads, 1 round): checks it runs."
)
@dir_option("Where the cluster, the mount points and the local file go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def random_cmd(
    size: str,
    requests: int,
    sizes: str,
    rounds: int,
    encoding: str,
    mount: bool,
    juicefs: bool | None,
    quick: bool,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """Small random reads, a data loader's pattern: ops/s and read amplification through
    the native client, the mount, local pread (O_DIRECT, cold, page cache) and JuiceFS.

    \b
    Example:
      tectonic-emu bench random --size 256MiB --rounds 3
      tectonic-emu bench random --quick --no-juicefs --json
    """
    from bench import random_reads as mod

    request_sizes = tuple(parse_size(s) for s in csv_list(sizes))
    if quick:
        size, requests, rounds = "16MiB", 20, 1
    result = run_bench(
        "random",
        mod.run_random_bench,
        directory=directory,
        size=parse_size(size),
        requests=requests,
        request_sizes=request_sizes,
        rounds=rounds,
        encoding=Encoding.parse(encoding).name,
        mount=mount,
        juicefs=juicefs,
    )
    emit(result, as_json, plot_dir, mod)


__all__ = ["fuse", "hedge", "metadata_cmd", "net", "posix", "random_cmd", "store"]


@click.command("qos")
@click.option(
    "--disk-model",
    type=click.Choice(["hdd", "flash", "none"]),
    default="hdd",
    show_default=True,
    help="The nodes' disks as this modelled device, in real time (none: the disk as it is).",
)
@click.option("--depth", default=2, show_default=True, help="Requests in service per disk.")
@click.option("--accelerators", default=2, show_default=True, help="Gold emulated h100s.")
@click.option("--checkpoint", "checkpoint_size", default="1GiB", show_default=True)
@click.option("--ranks", default=32, show_default=True, help="Ranks saving the checkpoint.")
@click.option("--records", default=300, show_default=True, help="Dataset records (4.6 MB).")
@click.option("--rounds", default=3, show_default=True, help="Rounds of every case.")
@dir_option("Where the cluster goes.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def qos_cmd(
    disk_model: str,
    depth: int,
    accelerators: int,
    checkpoint_size: str,
    ranks: int,
    records: int,
    rounds: int,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """A bronze checkpoint burst beside a gold data loader on a served cluster: alone,
    together with no scheduler, first come first served, and fair-queued (docs/qos.md).

    \b
    Example:
      tectonic-emu bench qos --disk-model hdd --rounds 3 --json
    """
    from bench import qos as mod

    result = run_bench(
        "qos",
        mod.run_qos_bench,
        directory=directory,
        disk_model=disk_model,
        depth=depth,
        accelerators=accelerators,
        checkpoint_bytes=parse_size(checkpoint_size),
        ranks=ranks,
        records=records,
        rounds=rounds,
    )
    emit(result, as_json, plot_dir, mod)
