"""``tectonic-emu ckpt``: list, show, verify and delete checkpoints (registered through the
``tectonic_emu.commands`` entry point, as the clients sit above the core)."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from clients.checkpoint import Checkpointer
from clients.ckpt_format import Manifest, step_of_dir
from clients.ckpt_models import MODELS, get_model
from clients.projection import PRESETS, Scenario, project_checkpoint
from clients.workloads import WORKLOADS
from tectonic_emu.cli import (
    cluster_option,
    err_console,
    json_option,
    print_json,
    progress_bar,
    run,
    with_cluster,
)
from tectonic_emu.cluster import Cluster
from tectonic_emu.coding import Encoding
from tectonic_emu.errors import InvalidArgumentError, NotFoundError
from tectonic_emu.sim.metadata import MetadataModel

F = TypeVar("F", bound=Callable[..., Any])


def _reader(cluster: Cluster, root: str) -> Checkpointer:
    # Reading, verifying and deleting do not depend on the world size.
    return Checkpointer(cluster.client(), root, world_size=1)


def _summary(m: Manifest) -> dict[str, Any]:
    return {
        "step": m.step,
        "world_size": m.world_size,
        "values": len({e.name for e in m.entries}),
        "bytes": sum(e.nbytes for e in m.entries),
        "files": len(m.files()),
        "committed_at": m.committed_at,
    }


@click.group("ckpt")
def ckpt() -> None:
    """Checkpoints saved with clients.checkpoint.Checkpointer.

    \b
    Example:
      tectonic-emu ckpt ls --cluster /tmp/c1 /ckpt
    """


@ckpt.command("ls")
@cluster_option
@click.argument("root")
@json_option
def ls(cluster_dir: Path, root: str, as_json: bool) -> None:
    """Committed checkpoints under ROOT, and steps that never committed.

    \b
    Example:
      tectonic-emu ckpt ls --cluster /tmp/c1 /ckpt --json
    """

    async def body(cluster: Cluster) -> tuple[list[dict[str, Any]], list[int]]:
        reader = _reader(cluster, root)
        done = await reader.steps()
        rows = [_summary(await reader.manifest(s)) for s in done]
        try:
            names = await cluster.client().listdir(root)
        except NotFoundError:
            names = []
        stale = sorted(s for s in map(step_of_dir, names) if s is not None and s not in done)
        return rows, stale

    rows, stale = run(with_cluster(cluster_dir, body))
    if as_json:
        print_json({"committed": rows, "uncommitted": stale})
        return
    t = Table(title=f"checkpoints under {root}")
    for col in ("step", "ranks", "values", "bytes", "committed"):
        t.add_column(col, justify="right")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["committed_at"]))
        t.add_row(str(r["step"]), str(r["world_size"]), str(r["values"]), str(r["bytes"]), when)
    Console().print(t)
    if stale:
        click.echo(f"uncommitted (collected after the next commit): {stale}")


@ckpt.command("show")
@cluster_option
@click.argument("root")
@click.argument("step", type=int)
@json_option
def show(cluster_dir: Path, root: str, step: int, as_json: bool) -> None:
    """The values of one checkpoint: ranks, names, shapes, bytes.

    \b
    Example:
      tectonic-emu ckpt show --cluster /tmp/c1 /ckpt 100 --json
    """
    m = run(with_cluster(cluster_dir, lambda c: _reader(c, root).manifest(step)))
    values: dict[str, dict[str, Any]] = {}
    for e in m.entries:
        v = values.setdefault(
            e.name,
            {
                "name": e.name,
                "kind": e.kind,
                "dtype": e.dtype,
                "shape": list(e.global_shape if e.kind == "shard" else e.shape),
                "ranks": [],
                "bytes": 0,
            },
        )
        v["ranks"].append(e.rank)
        v["bytes"] += e.nbytes
    if as_json:
        print_json({**_summary(m), "entries": list(values.values())})
        return
    t = Table(title=f"{root} step {step}: {m.world_size} ranks")
    for col in ("name", "kind", "dtype", "shape", "ranks", "bytes"):
        t.add_column(col, justify="right" if col == "bytes" else "left")
    for v in values.values():
        ranks = v["ranks"]
        who = str(len(ranks)) if len(ranks) > 1 else f"rank {ranks[0]}"
        t.add_row(v["name"], v["kind"], v["dtype"], str(tuple(v["shape"])), who, str(v["bytes"]))
    Console().print(t)


@ckpt.command("verify")
@cluster_option
@click.argument("root")
@click.argument("step", type=int)
def verify(cluster_dir: Path, root: str, step: int) -> None:
    """Read every piece of a checkpoint and check it against its recorded CRC32C; exit 1
    naming the rank, value and step of the first bad piece.

    \b
    Example:
      tectonic-emu ckpt verify --cluster /tmp/c1 /ckpt 100
    """

    async def body(cluster: Cluster) -> Manifest:
        reader = _reader(cluster, root)
        m = await reader.manifest(step)
        with progress_bar(sum(e.nbytes for e in m.entries)) as bar:
            task = bar.add_task(f"step {step}", total=sum(e.nbytes for e in m.entries))
            return await reader.verify(step, progress=lambda n: bar.advance(task, n))

    m = run(with_cluster(cluster_dir, body))
    total = sum(e.nbytes for e in m.entries)
    click.echo(f"step {step}: {len(m.entries)} values of {m.world_size} ranks, {total} bytes, ok")


@ckpt.command("rm")
@cluster_option
@click.argument("root")
@click.argument("step", type=int)
def rm(cluster_dir: Path, root: str, step: int) -> None:
    """Delete a checkpoint (its manifest first; data files another checkpoint still
    references stay).

    \b
    Example:
      tectonic-emu ckpt rm --cluster /tmp/c1 /ckpt 100
    """
    run(with_cluster(cluster_dir, lambda c: _reader(c, root).delete(step)))


def workload_option(what: str) -> Callable[[F], F]:
    """``--workload``: one of the MLPerf Storage workloads of ``clients/workloads.py``."""
    return click.option(
        "--workload", type=click.Choice(sorted(WORKLOADS)), required=True, help=what
    )


@click.group("data")
def data() -> None:
    """Training datasets in the store: Parquet shards and an index (docs/dataset.md).

    \b
    Example:
      tectonic-emu data generate --cluster /tmp/c1 --workload unet3d --scale 0.05 --to /data/u
    """


@data.command("generate")
@cluster_option
@workload_option("MLPerf Storage workload whose records to imitate.")
@click.option("--scale", type=float, required=True, help="Record size and count factor, (0, 1].")
@click.option("--to", "path", required=True, help="Dataset directory in the store.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random payloads.")
@click.option("--encoding", default=None, help="Encoding of the shards (default: inherited).")
@click.option("--overwrite", is_flag=True, help="Replace a dataset already there.")
@json_option
def data_generate(
    cluster_dir: Path,
    workload: str,
    scale: float,
    path: str,
    seed: int,
    encoding: str | None,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Write a synthetic dataset shaped like MLPerf Storage's WORKLOAD, its record size and
    count scaled by SCALE (random payloads, so compression cannot cheat).

    \b
    Example:
      tectonic-emu data generate --cluster /tmp/c1 --workload unet3d --scale 0.05 --to /data/u
    """
    from clients.dataset import generate
    from clients.workloads import workload_named

    sized = workload_named(workload).scaled(scale)

    async def body(cluster: Cluster) -> Any:
        with progress_bar(sized.bytes) as bar:
            task = bar.add_task(f"{workload} x{scale:g}", total=sized.bytes)
            return await generate(
                cluster.client(),
                workload,
                scale,
                path,
                seed=seed,
                encoding=encoding,
                overwrite=overwrite,
                progress=lambda n: bar.advance(task, n),
            )

    index = run(with_cluster(cluster_dir, body))
    summary = {
        "path": path,
        "workload": workload,
        "scale": scale,
        "samples": index.rows,
        "record_bytes": sized.record_bytes,
        "shards": len(index.shards),
        "bytes": index.nbytes,
    }
    if as_json:
        print_json(summary)
    else:
        click.echo(
            f"{path}: {index.rows} samples of {sized.record_bytes} bytes in "
            f"{len(index.shards)} shards ({index.nbytes} bytes)"
        )


@click.group("simulate")
def simulate() -> None:
    """Emulated training: accelerators that read batches and compute by sleeping.

    \b
    Example:
      tectonic-emu simulate train --cluster /tmp/c1 --workload unet3d --data /data/u -n 4
    """


@simulate.command("train")
@cluster_option
@workload_option("MLPerf Storage workload (batch size and compute time per batch).")
@click.option(
    "--data",
    "path",
    default=None,
    help="Dataset directory (default: /datasets/WORKLOAD-xSCALE, generated if missing).",
)
@click.option(
    "--scale",
    default=0.05,
    show_default=True,
    help="Scale of the dataset generated when --data is not given.",
)
@click.option(
    "-n",
    "--accelerators",
    default=1,
    show_default=True,
    type=click.IntRange(1, 65536),
    help="Emulated accelerators (1..65536).",
)
@click.option("--accelerator", default="h100", show_default=True, help="h100 or a100.")
@click.option(
    "--epochs", default=3, show_default=True, type=click.IntRange(1), help="Epochs to run."
)
@click.option("--seed", default=0, show_default=True, help="Shuffle seed.")
@click.option(
    "--prefetch",
    default=2,
    show_default=True,
    type=click.IntRange(0, 1024),
    help="Batches each rank reads ahead.",
)
@click.option(
    "--processes",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Processes to spread the accelerators over, launched here (under torchrun or srun, "
    "RANK and WORLD_SIZE say instead).",
)
@click.option("--job", default=None, help="Job name the processes share (default: a new one).")
@json_option
def simulate_train(
    cluster_dir: Path,
    workload: str,
    path: str | None,
    scale: float,
    accelerators: int,
    accelerator: str,
    epochs: int,
    seed: int,
    prefetch: int,
    processes: int,
    job: str | None,
    as_json: bool,
) -> None:
    """Run MLPerf Storage's training emulation on a dataset and report accelerator
    utilization (AU: compute time over wall time, first step left out), samples/s, MB/s,
    and whether AU meets the workload's threshold (90%, cosmoflow 70%).

    \b
    Example:
      tectonic-emu simulate train --cluster /tmp/c1 --workload unet3d -n 4 --json
      tectonic-emu simulate train --cluster /tmp/c1 --workload unet3d --data /data/u -n 4
    """
    from clients.ranks import Job, ProcessInfo, launch
    from clients.simulate import TrainReport, train

    process = ProcessInfo.from_env()
    if path is None:
        path = f"/datasets/{workload}-x{scale:g}"
        if process.index == 0:
            run(with_cluster(cluster_dir, lambda c: _ensure_dataset(c, workload, scale, path)))
    if processes > 1 and process.count == 1:  # launch the processes, report theirs
        args = ["simulate", "train", "--cluster", str(cluster_dir), "--workload", workload]
        args += ["--data", path, "-n", str(accelerators), "--accelerator", accelerator]
        args += ["--epochs", str(epochs), "--seed", str(seed), "--prefetch", str(prefetch)]
        name = job or f"train-{secrets.token_hex(4)}"
        with err_console.status(f"{processes} processes of {accelerators} accelerators"):
            out = launch([*args, "--job", name, "--json"], processes)
        report = TrainReport(**json.loads(out))
    else:
        if accelerators % process.count:
            raise click.BadParameter(
                f"{accelerators} accelerators do not split over {process.count} processes"
            )
        name = job or os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID")
        if process.count > 1 and not name:
            raise click.BadParameter("several processes need a shared --job name")

        async def body(cluster: Cluster) -> Any:
            client = cluster.client()
            group = Job(
                client,
                name or f"train-{secrets.token_hex(4)}",
                ranks_per_process=accelerators // process.count,
                process=process,
            )
            with err_console.status(f"{group.ranks_per_process} emulated accelerators training"):
                return await train(
                    client,
                    path,
                    workload=workload,
                    accelerators=accelerators,
                    accelerator=accelerator,
                    epochs=epochs,
                    seed=seed,
                    prefetch=prefetch,
                    job=group,
                )

        report = run(with_cluster(cluster_dir, body))
        if process.index != 0:
            return  # process 0 reports the job
    if as_json:
        print_json(report.to_dict())
        return
    verdict = "meets" if report.passed else "misses"
    click.echo(
        f"{report.accelerators} x {report.accelerator} on {report.workload}: AU "
        f"{report.au:.1%} (min {report.au_min:.1%}), {verdict} {report.au_threshold:.0%}; "
        f"{report.samples_per_s:.1f} samples/s, {report.mb_per_s:.1f} MB/s"
    )


async def _ensure_dataset(cluster: Cluster, workload: str, scale: float, path: str) -> None:
    """Generate the default dataset of a workload and scale unless it is complete."""
    from clients.dataset import DatasetIncompleteError, generate, load_index
    from clients.workloads import workload_named

    client = cluster.client()
    try:
        await load_index(client, path)
        return
    except DatasetIncompleteError:
        overwrite = True
    except NotFoundError:
        overwrite = False
    sized = workload_named(workload).scaled(scale)
    with progress_bar(sized.bytes) as bar:
        task = bar.add_task(f"generating {path}", total=sized.bytes)
        await client.mkdir("/datasets", exist_ok=True)
        await generate(
            client,
            workload,
            scale,
            path,
            overwrite=overwrite,
            progress=lambda n: bar.advance(task, n),
        )


__all__ = ["ckpt", "data", "simulate"]


@simulate.command("checkpoint")
@click.option(
    "--preset",
    type=click.Choice(sorted(PRESETS)),
    default="small-flash",
    show_default=True,
    help="The cluster to project onto (docs/simulate.md lists each figure and its source).",
)
@click.option(
    "--model",
    type=click.Choice(sorted(MODELS)),
    default="llama3-8b",
    show_default=True,
    help="Whose checkpoint: DLIO's files for the model (clients/ckpt_models.py).",
)
@click.option(
    "--ranks",
    type=click.IntRange(1, 1 << 20),
    default=None,
    help="Ranks saving (default: the model's MLPerf count); a multiple of its TP x PP.",
)
@click.option("--encoding", default="rs-6-3", show_default=True, help="r1, r3, rs-6-3, rs-9-6...")
@click.option(
    "--servers",
    type=click.IntRange(1, 1 << 20),
    default=None,
    help="Storage servers (default: the preset's).",
)
@click.option(
    "--metadata-shards",
    type=click.IntRange(1, 1 << 20),
    default=None,
    help="Charge metadata to this many shards (default: metadata costs nothing).",
)
@click.option(
    "--metadata-qps",
    type=click.FloatRange(1, 1e9),
    default=10_000.0,
    show_default=True,
    help="Operations per second of each shard (Tectonic FAST'21: about 10,000).",
)
@click.option(
    "--fail-servers",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Servers (drawn from the seed) that go down during the save.",
)
@click.option(
    "--fail-at",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Virtual seconds into the save when they go down (0: down from the start).",
)
@click.option(
    "--steps",
    type=click.IntRange(1, 10_000),
    default=1,
    show_default=True,
    help="Checkpoints saved, one every --interval.",
)
@click.option(
    "--interval",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Virtual seconds from one step's start to the next's (the compute between).",
)
@click.option("--async", "async_save", is_flag=True, help="Ranks save_async and go on once staged.")
@click.option(
    "--keep-last",
    type=click.IntRange(1),
    default=None,
    help="The Checkpointer's retention (default: keep every step).",
)
@click.option(
    "--save-only", is_flag=True, help="Project the saves only, not the load that follows."
)
@click.option(
    "--seed", default=1, show_default=True, help="The run's seed: the same seed, the same run."
)
@json_option
def simulate_checkpoint(
    preset: str,
    model: str,
    ranks: int | None,
    encoding: str,
    servers: int | None,
    metadata_shards: int | None,
    metadata_qps: float,
    fail_servers: int,
    fail_at: float,
    steps: int,
    interval: float,
    async_save: bool,
    keep_last: int | None,
    save_only: bool,
    seed: int,
    as_json: bool,
) -> None:
    """Project one checkpoint save of MODEL onto a modelled cluster, then every rank's
    load of it, in virtual time: the real Checkpointer, client, placement and commit
    protocol on model servers, disks, network and client CPUs, with synthetic payloads.
    Reports each phase's duration (the slowest rank), each rank's p50/p99, throughput beside
    the hardware's lower bound, and the save's utilisation of each class of resource.

    \b
    Example:
      tectonic-emu simulate checkpoint --model llama3-70b --ranks 64 --encoding rs-6-3
      tectonic-emu simulate checkpoint --model llama3-8b --servers 36 --json
      tectonic-emu simulate checkpoint --ranks 4096 --metadata-shards 64
      tectonic-emu simulate checkpoint --ranks 64 --fail-servers 2 --fail-at 0.5
      tectonic-emu simulate checkpoint --ranks 64 --steps 3 --interval 2 --async
    """
    p = PRESETS[preset]
    hardware = p.hardware if servers is None else dataclasses.replace(p.hardware, servers=servers)
    if metadata_shards is not None:
        meta = MetadataModel(shards=metadata_shards, qps=metadata_qps, rtt=hardware.fabric.rtt)
        hardware = dataclasses.replace(hardware, metadata=meta)
    try:
        Encoding.parse(encoding)
        count = get_model(model).ranks if ranks is None else ranks
        scenario = Scenario(
            model, count, encoding, hardware, ranks_per_host=p.ranks_per_host,
            block_size=p.block_size, seed=seed, fail_servers=fail_servers, fail_at=fail_at,
            load=not save_only, steps=steps, interval=interval, async_save=async_save,
            keep_last=keep_last,
        )  # fmt: skip
        with progress_bar(None) as bar:
            task = bar.add_task(f"projecting {model} on {count} ranks", total=None)
            result = project_checkpoint(
                scenario, lambda done, total: bar.update(task, completed=done, total=total)
            )
    except InvalidArgumentError as exc:
        raise click.BadParameter(str(exc)) from None
    if as_json:
        print_json(result.to_json())
        return
    gb = 1e9
    click.echo(
        f"{model} on {result.ranks} ranks ({result.hosts} hosts), {result.servers} servers, "
        f"{encoding}: {result.bytes / gb:,.0f} GB ({result.stored_bytes / gb:,.0f} GB stored)"
    )
    if result.failed_servers:
        when = f"at {fail_at:g} s" if fail_at else "from the start"
        click.echo(f"servers down {when}: {', '.join(map(str, result.failed_servers))}")
    click.echo(
        f"save {result.duration_s:.2f} s (ranks p50 {result.rank_p50_s:.2f}, p99 "
        f"{result.rank_p99_s:.2f}, max {result.rank_max_s:.2f}): {result.throughput_gb_s:,.1f} GB/s"
    )
    click.echo(
        f"durable on the disks: peak {result.peak_gb_s:,.1f} GB/s, sustained "
        f"{result.sustained_gb_s:,.1f} GB/s"
    )
    click.echo(
        f"lower bound {result.lower_bound_s:.2f} s ({result.bound_by}); busiest: {result.busiest}"
    )
    if (ld := result.load) is not None:
        click.echo(
            f"load {ld.duration_s:.2f} s (ranks p50 {ld.rank_p50_s:.2f}, p99 {ld.rank_p99_s:.2f})"
            f": {ld.throughput_gb_s:,.1f} GB/s\n"
            f"load's lower bound {ld.lower_bound_s:.2f} s ({ld.bound_by})"
        )
    if len(result.steps) > 1:
        per = Table(box=None)
        for col in ("step", "due s", "duration s", "p50 s", "p99 s", "blocked s"):
            per.add_column(col, justify="right")
        for s in result.steps:
            per.add_row(
                str(s.step), f"{s.due_s:.2f}", f"{s.duration_s:.2f}", f"{s.rank_p50_s:.2f}",
                f"{s.rank_p99_s:.2f}", f"{s.blocked_max_s:.2f}",
            )  # fmt: skip
        Console().print(per)
    table = Table(box=None)
    for col in ("resources", "members", "mean use", "max use"):
        table.add_column(col, justify="left" if col == "resources" else "right")
    for u in result.use:
        table.add_row(u.name, str(u.members), f"{u.mean:.0%}", f"{u.max:.0%}")
    Console().print(table)
    click.echo(f"({result.wall_s:.1f} s of wall time; preset {preset}: see docs/simulate.md)")
