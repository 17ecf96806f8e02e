"""``tectonic-emu ckpt``: list, show, verify and delete checkpoints (registered through the
``tectonic_emu.commands`` entry point, as the clients sit above the core)."""

from __future__ import annotations

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
from clients.cli_faults import simulate_faults
from clients.cli_project_train import PROJECTION_ONLY, projection_options, run_projection
from clients.cli_projection import simulate_checkpoint, simulate_sweep
from clients.workloads import WORKLOADS
from tectonic_emu.cli import (
    cluster_option,
    cluster_option_with,
    err_console,
    json_option,
    print_json,
    progress_bar,
    run,
    with_cluster,
)
from tectonic_emu.cluster import Cluster
from tectonic_emu.errors import NotFoundError

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
@cluster_option_with(
    "Cluster directory to run on (default: $TECTONIC_EMU_CLUSTER); or give --preset.",
    required=False,
)
@projection_options
@workload_option("MLPerf Storage workload (batch size and compute time per batch).")
@click.option(
    "--data",
    "path",
    default=None,
    help="Dataset directory (default: /datasets/WORKLOAD-xSCALE, generated if missing).",
)
@click.option(
    "--scale",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="Scale of the records of the dataset generated when --data is not given "
    "(default: 0.05; projected: 1, records at full size).",
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
    cluster_dir: Path | None,
    workload: str,
    path: str | None,
    scale: float | None,
    accelerators: int,
    accelerator: str,
    epochs: int,
    seed: int,
    prefetch: int,
    processes: int,
    job: str | None,
    as_json: bool,
    **projection: Any,
) -> None:
    """Run MLPerf Storage's training emulation on a dataset and report accelerator
    utilization (AU: compute time over wall time, first step left out), samples/s, MB/s,
    and whether AU meets the workload's threshold (90%, cosmoflow 70%).

    With --preset instead of --cluster, project the run onto a modelled cluster in virtual
    time, with checkpoint bursts (--checkpoint MODEL --every N): AU over time and each
    burst's dip (docs/simulate.md).

    \b
    Example:
      tectonic-emu simulate train --cluster /tmp/c1 --workload unet3d -n 4 --json
      tectonic-emu simulate train --cluster /tmp/c1 --workload unet3d --data /data/u -n 4
      tectonic-emu simulate train --preset small-flash --workload resnet50 -n 64 \\
          --steps 30 --checkpoint llama3-8b --every 10
      tectonic-emu simulate train --preset small-flash --workload unet3d -n 64 --steps 30 \\
          --checkpoint llama3-8b --every 10 --async --qos fair --checkpoint-rate 1GB
    """
    from clients.ranks import Job, ProcessInfo, launch
    from clients.simulate import TrainReport, train

    ctx = click.get_current_context()
    given = {
        k for k in ctx.params if ctx.get_parameter_source(k) != click.core.ParameterSource.DEFAULT
    }
    if projection["preset"] is not None:
        real_only = given & {"cluster_dir", "path", "epochs", "processes", "job"}
        if real_only:
            raise click.BadParameter(f"--preset projects; it takes no {_flags(real_only)}")
        run_projection(
            {**projection, "workload": workload, "accelerators": accelerators, "scale": scale,
             "accelerator": accelerator, "seed": seed, "prefetch": prefetch},
            as_json,
        )  # fmt: skip
        return
    if cluster_dir is None:
        raise click.BadParameter("give --cluster DIR (a real run) or --preset NAME (projected)")
    if given & set(PROJECTION_ONLY):
        raise click.BadParameter(f"{_flags(given & set(PROJECTION_ONLY))} need --preset")
    scale = 0.05 if scale is None else scale
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


def _flags(names: set[str]) -> str:
    """Options by their parameter names, as the user types them."""
    flags = {"cluster_dir": "cluster", "path": "data", "async_save": "async", "plot_dir": "plot"}
    return ", ".join(f"--{flags.get(n, n).replace('_', '-')}" for n in sorted(names))


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


for command in (simulate_checkpoint, simulate_sweep, simulate_faults):
    simulate.add_command(command)

__all__ = ["ckpt", "data", "simulate"]
