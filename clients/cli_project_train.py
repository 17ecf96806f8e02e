"""``tectonic-emu simulate train --preset NAME``: the training emulation projected in virtual
time (``clients/projection_train.py``, docs/simulate.md). ``clients/cli.py``'s
``simulate train`` takes these options beside its own and hands a run with ``--preset``
here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from clients.ckpt_models import MODELS
from clients.cli_projection import core_gbps_of, core_gbps_option, with_fabric
from clients.projection import PRESETS, THIS_MACHINE, this_machine
from clients.projection_train import TrainProjection, project_train, train_scenario
from tectonic_emu.cli import print_json, progress_bar
from tectonic_emu.config import parse_size
from tectonic_emu.errors import InvalidArgumentError

F = TypeVar("F", bound=Callable[..., Any])

#: The options of a projection only (``simulate train`` refuses them without --preset).
PROJECTION_ONLY = (
    "servers",
    "steps",
    "checkpoint",
    "every",
    "async_save",
    "checkpoint_scale",
    "encoding",
    "plot_dir",
    "qos",
    "checkpoint_rate",
    "core_gbps",
)

_OPTIONS = (
    click.option(
        "--preset",
        type=click.Choice([*sorted(PRESETS), THIS_MACHINE]),
        default=None,
        help="Project onto this modelled cluster in virtual time instead of running on "
        "--cluster (docs/simulate.md lists each figure and its source).",
    ),
    click.option(
        "--servers",
        type=click.IntRange(1, 1 << 20),
        default=None,
        help="Projection: storage servers (default: the preset's).",
    ),
    click.option(
        "--steps",
        type=click.IntRange(1, 100_000),
        default=20,
        show_default=True,
        help="Projection: steps each accelerator trains (the dataset holds one epoch of them).",
    ),
    click.option(
        "--checkpoint",
        type=click.Choice(sorted(MODELS)),
        default=None,
        help="Projection: save this model's checkpoint (DLIO's files) every --every steps.",
    ),
    click.option(
        "--every",
        type=click.IntRange(1),
        default=10,
        show_default=True,
        help="Projection: steps between checkpoint bursts.",
    ),
    click.option(
        "--async", "async_save", is_flag=True, help="Projection: save_async, go on once staged."
    ),
    click.option(
        "--checkpoint-scale",
        type=click.FloatRange(0, 1, min_open=True),
        default=1.0,
        show_default=True,
        help="Projection: every checkpoint file's size times this.",
    ),
    click.option(
        "--encoding",
        default="rs-6-3",
        show_default=True,
        help="Projection: the dataset's and checkpoints' encoding (r3, rs-9-6...).",
    ),
    click.option(
        "--qos",
        type=click.Choice(["fair", "fifo", "off"]),
        default=None,
        help="Projection: the data loaders are a gold traffic group, the checkpoints a "
        "bronze one, and each server's disks are fair-queued between them (fair), served "
        "first come first served through the same slots (fifo), or not scheduled (off) "
        "[default: off, as before issue 23].",
    ),
    core_gbps_option("Projection: the"),
    click.option(
        "--checkpoint-rate",
        default="0",
        show_default=True,
        metavar="BYTES",
        help="Projection: pace each host's checkpoint writes to this many bytes per second "
        "(the bronze group's client-side rate, docs/qos.md; 0: not paced), e.g. 1GB.",
    ),
    click.option(
        "--plot",
        "plot_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Projection: write PNG plots (AU and the disks over time) into this directory.",
    ),
)


def projection_options(f: F) -> F:
    for option in reversed(_OPTIONS):
        f = option(f)
    return f


def run_projection(o: dict[str, Any], as_json: bool) -> None:
    """Project the training run the options ``o`` name, and report it."""
    preset = this_machine() if o["preset"] == THIS_MACHINE else PRESETS[o["preset"]]
    hw = preset.hardware
    if o["servers"] is not None:
        hw = dataclasses.replace(hw, servers=o["servers"])
    if o["qos"] is not None:
        hw = dataclasses.replace(hw, qos=o["qos"])
    if o["core_gbps"] is not None:
        hw = with_fabric(hw, core_gbps=core_gbps_of(o["core_gbps"]))
    try:
        sc = train_scenario(
            preset,
            o["workload"],
            o["accelerators"],
            hardware=hw,
            accelerator=o["accelerator"],
            steps=o["steps"],
            scale=1.0 if o["scale"] is None else o["scale"],
            encoding=o["encoding"],
            prefetch=o["prefetch"],
            checkpoint=o["checkpoint"],
            every=o["every"],
            async_save=o["async_save"],
            checkpoint_scale=o["checkpoint_scale"],
            seed=o["seed"],
            checkpoint_rate=float(parse_size(o["checkpoint_rate"])),
        )
        what = f"projecting {sc.accelerators} x {sc.workload}"
        with progress_bar(None) as bar:
            task = bar.add_task(what, total=None)
            result = project_train(
                sc, lambda done, total: bar.update(task, completed=done, total=total)
            )
    except InvalidArgumentError as exc:
        raise click.BadParameter(str(exc)) from None
    if o["plot_dir"] is not None:
        for png in plot_train(result, o["plot_dir"]):
            click.echo(f"wrote {png}", err=True)
    if as_json:
        print_json(result.to_json())
        return
    report(result, o["preset"])


def report(p: TrainProjection, preset: str) -> None:
    r, gb = p.report, 1e9
    ckpt = (
        f"\n{p.checkpoint} checkpoints of {p.checkpoint_bytes / gb:,.1f} GB, every "
        f"{p.checkpoint_every} steps, at most {p.checkpoint_host_bytes / gb:,.2f} GB from one host"
        if p.checkpoint
        else ""
    )
    qos = f"; disks {'fair-queued' if p.qos == 'fair' else p.qos}" if p.qos != "off" else ""
    click.echo(
        f"{p.workload} on {p.accelerators} x {r.accelerator} ({p.hosts} hosts), {p.servers} "
        f"servers, {p.encoding}: {p.dataset_bytes / gb:,.1f} GB of data{ckpt}{qos}"
    )
    verdict = "meets" if r.passed else "misses"
    click.echo(
        f"AU {r.au:.1%} (min {r.au_min:.1%}), {verdict} {r.au_threshold:.0%}; between "
        f"bursts {r.au_between:.1%}\n{r.samples_per_s:,.1f} samples/s, {r.mb_per_s:,.1f} MB/s "
        f"over {r.wall_s:,.2f} virtual s"
    )
    if r.bursts:
        table = Table(box=None)
        for col in ("after step", "start s", "end s", "AU", "blocked p50 s", "max s"):
            table.add_column(col, justify="right")
        for b in r.bursts:
            table.add_row(
                str(b.step), f"{b.start_s:.2f}", f"{b.end_s:.2f}", f"{b.au:.1%}",
                f"{b.blocked_p50_s:.2f}", f"{b.blocked_max_s:.2f}",
            )  # fmt: skip
        Console().print(table)
    click.echo(f"({p.wall_s:.1f} s of wall time; preset {preset}: see docs/simulate.md)")


def plot_train(p: TrainProjection, directory: Path) -> list[Path]:
    """AU over time, and the disks' read and write rates over time."""
    from clients.plotting import lines

    title = f"{p.accelerators} x {p.workload}"
    if p.checkpoint:
        title += f", {p.checkpoint} / {p.checkpoint_every} steps"
    return [
        lines(
            directory / "au.png",
            title=f"{title}: AU",
            x=[t for t, _ in p.report.au_timeline],
            series={"AU": [a for _, a in p.report.au_timeline]},
            xlabel="virtual seconds",
            ylabel="AU",
            logx=False,
        ),
        lines(
            directory / "disks.png",
            title=f"{title}: the disks",
            x=[t for t, *_ in p.disks],
            series={
                "read GB/s": [r for _, r, _ in p.disks],
                "written GB/s": [w for *_, w in p.disks],
            },
            xlabel="virtual seconds",
            ylabel="GB/s",
            logx=False,
        ),
    ]


__all__ = ["PROJECTION_ONLY", "plot_train", "projection_options", "report", "run_projection"]
