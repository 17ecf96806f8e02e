"""The checkpoint and training benches' commands: ``bench ckpt``, ``checkpoint``, ``scale``,
``train`` and ``sim`` (a synchronized save of many ranks, MLPerf Storage's checkpointing
through every path, the cost of ranks, the accelerators kept busy, projections beside real
runs). Each imports its bench only when run.
"""

from __future__ import annotations

from pathlib import Path

import click

from bench.checkpoint import DEFAULT_PATHS
from bench.cli_common import csv_list, dir_option, emit, int_list, plot_option, run_bench
from clients.ckpt_models import MODELS
from tectonic_emu.coding import Encoding
from tectonic_emu.config import parse_size

MODEL_NAMES = tuple(MODELS)


@click.command("ckpt")
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


@click.command("checkpoint")
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


@click.command("train")
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


@click.command("scale")
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


__all__ = ["checkpoint_cmd", "ckpt", "scale_cmd", "train_cmd"]


@click.command("sim")
@click.option("--scale", default=0.01, show_default=True, help="llama3-8b's DLIO files times this.")
@click.option("--encodings", default="r1,r3,rs-6-3", show_default=True, help="Comma-separated.")
@click.option("--ranks", default="16,1024", show_default=True, help="Rank counts, comma-separated.")
@click.option("--runs", default=3, show_default=True, help="Rounds of real runs, interleaved.")
@click.option(
    "--no-fail", is_flag=True, help="Leave out the saves with a node stopped and a node slowed."
)
@click.option(
    "--paper-ranks",
    type=click.IntRange(0),
    default=None,
    help="Ranks of the meta-genai-24k burst beside the Llama 3 paper: the paper's 24,576 "
    "GPUs unless given (about 6 minutes); 0 leaves it out.",
)
@click.option(
    "--paper-scale",
    type=click.FloatRange(0, 1, min_open=True),
    default=1.0,
    show_default=True,
    help="llama3-405b's files times this, for that burst.",
)
@click.option(
    "--trace",
    is_flag=True,
    help="Then one more real round of each scenario and its projection, timed stage by "
    "stage (blocks, chunk writes and reads, commits, arenas): where the two differ.",
)
@click.option(
    "--keep-page-reporting",
    is_flag=True,
    help="Leave the VM's free page reporting on: freed memory goes back to the host and "
    "comes back slowly, so loads swing 2-4x (held off by default, as root, after half of "
    "the free memory is touched once).",
)
@dir_option("Where the real runs' clusters go.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@plot_option
def sim_cmd(
    scale: float,
    encodings: str,
    ranks: str,
    runs: int,
    no_fail: bool,
    paper_ranks: int | None,
    paper_scale: float,
    trace: bool,
    keep_page_reporting: bool,
    directory: Path,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """Projections beside real runs on this machine: measures the this-machine preset
    (device, node calls, metadata, CPU), then runs each checkpoint save and load for real
    on an embedded cluster, each round in a new process, measuring the device before and
    after each and fresh memory before each load, and projects it in virtual time on
    those figures, and reports the ratio. Then meta-genai-24k projects a Llama 3
    checkpoint burst beside the paper's 7 and 2 TB/s. As root it holds the VM's free page
    reporting off meanwhile (put back after), having first touched half of the available
    memory once.

    \b
    Example:
      tectonic-emu bench sim --scale 0.01 --runs 3
      tectonic-emu bench sim --encodings rs-6-3 --ranks 16 --runs 1 --paper-ranks 0 --json
      tectonic-emu bench sim --encodings r1 --ranks 1024 --runs 1 --no-fail \\
          --paper-ranks 0 --trace
    """
    from bench import sim as mod

    result = run_bench(
        "sim",
        mod.run_sim_bench,
        directory=directory,
        scale=scale,
        runs=runs,
        encodings=[Encoding.parse(e).name for e in csv_list(encodings)],
        ranks=int_list(ranks, "--ranks"),
        fail=not no_fail,
        paper_ranks=mod.PAPER_RANKS if paper_ranks is None else paper_ranks,
        paper_scale=paper_scale,
        hold_pages=not keep_page_reporting,
        trace=trace,
    )
    emit(result, as_json, plot_dir, mod)
