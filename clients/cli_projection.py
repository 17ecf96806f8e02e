"""``tectonic-emu simulate checkpoint`` and ``simulate sweep``: projections in virtual time
(``clients/projection.py``, docs/simulate.md). Both take the same scenario options; a sweep
projects the scenario once for each value of one of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from clients.ckpt_models import MODELS, checkpoint_plan, get_model
from clients.projection import (
    PAPER_PEAK_GB_S,
    PAPER_PRESET,
    PAPER_SUSTAINED_GB_S,
    PRESETS,
    THIS_MACHINE,
    Projection,
    Scenario,
    project_checkpoint,
    this_machine,
)
from tectonic_emu.cli import json_option, print_json, progress_bar
from tectonic_emu.coding import Encoding
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.sim.cluster import Hardware
from tectonic_emu.sim.metadata import MetadataModel

F = TypeVar("F", bound=Callable[..., Any])


def core_gbps_option(lead: str = "The") -> Callable[[F], F]:
    """``--core-gbps``, its help starting with ``lead`` (``simulate train`` marks its
    projection-only options so)."""
    return click.option(
        "--core-gbps",
        type=click.FloatRange(0),
        default=None,
        help=f"{lead} fabric's core between racks, in aggregate (default: the preset's; "
        "meta-genai-24k's is fitted to 7 TB/s = 56000; 0: non-blocking).",
    )


_OPTIONS = (
    click.option(
        "--preset",
        type=click.Choice([*sorted(PRESETS), THIS_MACHINE]),
        default="small-flash",
        show_default=True,
        help="The cluster to project onto (docs/simulate.md lists each figure and its "
        "source); this-machine is measured first (about 20 s).",
    ),
    click.option(
        "--model",
        type=click.Choice(sorted(MODELS)),
        default="llama3-8b",
        show_default=True,
        help="Whose checkpoint: DLIO's files for the model (clients/ckpt_models.py).",
    ),
    click.option(
        "--ranks",
        type=click.IntRange(1, 1 << 20),
        default=None,
        help="Ranks saving (default: the model's MLPerf count); a multiple of its TP x PP.",
    ),
    click.option("--encoding", default="rs-6-3", show_default=True, help="r1, r3, rs-9-6..."),
    click.option(
        "--servers",
        type=click.IntRange(1, 1 << 20),
        default=None,
        help="Storage servers (default: the preset's).",
    ),
    core_gbps_option(),
    click.option(
        "--metadata-shards",
        type=click.IntRange(1, 1 << 20),
        default=None,
        help="Charge metadata to this many shards (default: metadata costs nothing).",
    ),
    click.option(
        "--metadata-qps",
        type=click.FloatRange(1, 1e9),
        default=10_000.0,
        show_default=True,
        help="Operations per second of each shard (Tectonic FAST'21: about 10,000).",
    ),
    click.option(
        "--fail-servers",
        type=click.IntRange(0),
        default=0,
        show_default=True,
        help="Servers (drawn from the seed) that go down during the save.",
    ),
    click.option(
        "--fail-at",
        type=click.FloatRange(0),
        default=0.0,
        show_default=True,
        help="Virtual seconds into the save when they go down (0: down from the start).",
    ),
    click.option(
        "--slow-servers",
        type=click.IntRange(0),
        default=0,
        show_default=True,
        help="Servers (drawn from the seed, none of those that fail) slowed by --slow-by.",
    ),
    click.option(
        "--slow-by",
        type=click.FloatRange(0),
        default=0.05,
        show_default=True,
        help="Seconds each slow server adds to every call (as `tectonic-emu node slow`).",
    ),
    click.option(
        "--steps",
        type=click.IntRange(1, 10_000),
        default=1,
        show_default=True,
        help="Checkpoints saved, one every --interval.",
    ),
    click.option(
        "--interval",
        type=click.FloatRange(0),
        default=0.0,
        show_default=True,
        help="Virtual seconds from one step's start to the next's (the compute between).",
    ),
    click.option(
        "--async", "async_save", is_flag=True, help="Ranks save_async and go on once staged."
    ),
    click.option(
        "--keep-last",
        type=click.IntRange(1),
        default=None,
        help="The Checkpointer's retention (default: keep every step).",
    ),
    click.option(
        "--save-only", is_flag=True, help="Project the saves only, not the load that follows."
    ),
    click.option(
        "--seed", default=1, show_default=True, help="The run's seed: the same seed, the same run."
    ),
    json_option,
    click.option(
        "--plot",
        "plot_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Write PNG plots into this directory.",
    ),
)


def scenario_options(f: F) -> F:
    """The options that make a ``Scenario`` (``scenario_of``), ``--json`` and ``--plot``."""
    for option in reversed(_OPTIONS):
        f = option(f)
    return f


def scenario_of(o: dict[str, Any]) -> Scenario:
    """The scenario the options ``o`` name (raises InvalidArgumentError for a bad one)."""
    ranks = get_model(o["model"]).ranks if o["ranks"] is None else o["ranks"]
    if o["preset"] == THIS_MACHINE:  # copies measured at the sizes of the values it loads
        plan = checkpoint_plan(o["model"], ranks)
        p = this_machine(value_sizes={f.size for r in plan.per_rank for f in r.files})
    else:
        p = PRESETS[o["preset"]]
    hw = p.hardware
    if o["servers"] is not None:
        hw = dataclasses.replace(hw, servers=o["servers"])
    if o["core_gbps"] is not None:
        hw = with_fabric(hw, core_gbps=core_gbps_of(o["core_gbps"]))
    if o["metadata_shards"] is not None:
        meta = MetadataModel(o["metadata_shards"], o["metadata_qps"], hw.fabric.rtt)
        hw = dataclasses.replace(hw, metadata=meta)
    Encoding.parse(o["encoding"])
    return p.scenario(
        o["model"],
        ranks,
        o["encoding"],
        hardware=hw,
        seed=o["seed"],
        fail_servers=o["fail_servers"],
        fail_at=o["fail_at"],
        slow_servers=o["slow_servers"],
        slow_by=o["slow_by"],
        load=not o["save_only"],
        steps=o["steps"],
        interval=o["interval"],
        async_save=o["async_save"],
        keep_last=o["keep_last"],
    )


def with_fabric(hw: Hardware, **changes: Any) -> Hardware:
    """``hw`` with its fabric's figures ``changes`` changed."""
    return dataclasses.replace(hw, fabric=dataclasses.replace(hw.fabric, **changes))


def core_gbps_of(gbps: float) -> float | None:
    """``--core-gbps``'s value as the fabric's: 0 is a non-blocking core."""
    return gbps or None


def _project(sc: Scenario, what: str) -> Projection:
    with progress_bar(None) as bar:
        task = bar.add_task(what, total=None)
        return project_checkpoint(
            sc, lambda done, total: bar.update(task, completed=done, total=total)
        )


@click.command("checkpoint")
@scenario_options
def simulate_checkpoint(as_json: bool, plot_dir: Path | None, **options: Any) -> None:
    """Project checkpoint saves of MODEL onto a modelled cluster, then every rank's load,
    in virtual time: the real Checkpointer, client, placement and commit protocol on model
    servers, disks, network and client CPUs, with synthetic payloads. Reports each phase's
    duration (the slowest rank), each rank's p50/p99, throughput beside the hardware's lower
    bound, and the utilisation of each class of resource.

    \b
    Example:
      tectonic-emu simulate checkpoint --model llama3-70b --ranks 64 --encoding rs-6-3
      tectonic-emu simulate checkpoint --model llama3-8b --servers 36 --json
      tectonic-emu simulate checkpoint --ranks 4096 --metadata-shards 64
      tectonic-emu simulate checkpoint --ranks 64 --fail-servers 2 --fail-at 0.5
      tectonic-emu simulate checkpoint --ranks 64 --slow-servers 1 --slow-by 0.05
      tectonic-emu simulate checkpoint --ranks 64 --steps 3 --interval 2 --async
    """
    try:
        sc = scenario_of(options)
        result = _project(sc, f"projecting {sc.model} on {sc.ranks} ranks")
    except InvalidArgumentError as exc:
        raise click.BadParameter(str(exc)) from None
    if plot_dir is not None:
        for png in plot_projection(result, plot_dir):
            click.echo(f"wrote {png}", err=True)
    if as_json:
        print_json(result.to_json())
        return
    _report(result, options)


def _report(result: Projection, options: dict[str, Any]) -> None:
    gb = 1e9
    click.echo(
        f"{result.model} on {result.ranks} ranks ({result.hosts} hosts), {result.servers} "
        f"servers, {result.encoding}: {result.bytes / gb:,.0f} GB "
        f"({result.stored_bytes / gb:,.0f} GB stored)"
    )
    if result.failed_servers:
        at = options["fail_at"]
        when = f"at {at:g} s" if at else "from the start"
        click.echo(f"servers down {when}: {', '.join(map(str, result.failed_servers))}")
    if result.slow_servers:
        slow = ", ".join(map(str, result.slow_servers))
        click.echo(f"servers slowed by {options['slow_by'] * 1e3:g} ms a call: {slow}")
    click.echo(
        f"save {result.duration_s:.2f} s (ranks p50 {result.rank_p50_s:.2f}, p99 "
        f"{result.rank_p99_s:.2f}, max {result.rank_max_s:.2f}): {result.throughput_gb_s:,.1f} GB/s"
    )
    click.echo(
        f"into the servers: peak {result.peak_gb_s:,.1f} GB/s, sustained "
        f"{result.sustained_gb_s:,.1f} GB/s"
    )
    if options["preset"] == PAPER_PRESET:
        click.echo(
            f"Llama 3 paper: peak {result.peak_gb_s / PAPER_PEAK_GB_S:.2f} x its 7 TB/s, "
            f"sustained {result.sustained_gb_s / PAPER_SUSTAINED_GB_S:.2f} x its 2 (fitted core)"
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
    click.echo(
        f"({result.wall_s:.1f} s of wall time; preset {options['preset']}: see docs/simulate.md)"
    )


def plot_projection(result: Projection, directory: Path) -> list[Path]:
    """A projection's plots: the rate into the servers over time, the CDF of the ranks'
    durations (the longest step), and each class of resource's utilisation."""
    from clients.plotting import bars, lines

    title = f"{result.model}, {result.ranks} ranks, {result.encoding}"
    durations = sorted(result.rank_s)
    done = [(k + 1) / len(durations) for k in range(len(durations))]
    return [
        lines(
            directory / "timeline.png",
            title=f"{title}: stored bytes into the servers",
            x=[t for t, _ in result.timeline],
            series={"GB/s": [rate for _, rate in result.timeline]},
            xlabel="virtual seconds",
            ylabel="GB/s",
            logx=False,
        ),
        lines(
            directory / "ranks.png",
            title=f"{title}: ranks' save durations",
            x=durations,
            series={"share of ranks done": done},
            xlabel="seconds from the step's start",
            ylabel="share of ranks",
            logx=False,
        ),
        bars(
            directory / "utilisation.png",
            title=f"{title}: utilisation during the save",
            labels=[u.name for u in result.use],
            series={"mean": [u.mean for u in result.use], "most used": [u.max for u in result.use]},
            ylabel="share of capacity",
        ),
    ]


#: What ``simulate sweep --vary`` can vary, and how each value changes the scenario.
VARY: dict[str, Callable[[Scenario, str], Scenario]] = {
    "servers": lambda sc, v: dataclasses.replace(
        sc, hardware=dataclasses.replace(sc.hardware, servers=int(v))
    ),
    "ranks": lambda sc, v: dataclasses.replace(sc, ranks=int(v)),
    "encoding": lambda sc, v: dataclasses.replace(sc, encoding=Encoding.parse(v).name),
    "nic-gbps": lambda sc, v: dataclasses.replace(
        sc, hardware=with_fabric(sc.hardware, nic_gbps=float(v))
    ),
    "core-gbps": lambda sc, v: dataclasses.replace(
        sc, hardware=with_fabric(sc.hardware, core_gbps=core_gbps_of(float(v)))
    ),
    "disks": lambda sc, v: dataclasses.replace(
        sc, hardware=dataclasses.replace(sc.hardware, disks=int(v))
    ),
}


def _varied(vary: str) -> tuple[str, list[str]]:
    key, sep, values = vary.partition("=")
    if not sep or key not in VARY or not values.strip(","):
        raise click.BadParameter(
            f"KEY=V1,V2,... with KEY one of {', '.join(VARY)}, not {vary!r}", param_hint="--vary"
        )
    return key, [v.strip() for v in values.split(",") if v.strip()]


@click.command("sweep")
@click.option(
    "--vary",
    required=True,
    help=f"KEY=V1,V2,...: project once per value; KEY is one of {', '.join(VARY)}.",
)
@scenario_options
def simulate_sweep(vary: str, as_json: bool, plot_dir: Path | None, **options: Any) -> None:
    """Project the same checkpoint once per value of one figure (servers, ranks, encoding,
    NIC speed or disks per server), and tabulate save and load against it.

    \b
    Example:
      tectonic-emu simulate sweep --vary servers=18,36,72 --ranks 256
      tectonic-emu simulate sweep --vary encoding=r3,rs-6-3,rs-9-6 --ranks 64 --json
    """
    key, values = _varied(vary)
    results: list[Projection] = []
    try:
        base = scenario_of(options)
        for v in values:
            sc = VARY[key](base, v)
            results.append(_project(sc, f"projecting {key}={v}"))
    except (InvalidArgumentError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from None
    if plot_dir is not None:
        from clients.plotting import lines

        numeric = key != "encoding"
        x = [float(v) for v in values] if numeric else list(range(len(values)))
        series = {"save s": [r.duration_s for r in results]}
        if all(r.load is not None for r in results):
            series["load s"] = [r.load.duration_s for r in results if r.load is not None]
        png = lines(
            plot_dir / f"sweep-{key}.png",
            title=f"{base.model} on {base.ranks} ranks: {key}",
            x=x,
            series=series,
            xlabel=key if numeric else f"{key}: " + ", ".join(values),
            ylabel="seconds (virtual)",
            logx=numeric,
        )
        click.echo(f"wrote {png}", err=True)
    if as_json:
        print_json({"vary": key, "values": values, "projections": [r.to_json() for r in results]})
        return
    table = Table(box=None)
    for col in (key, "save s", "load s", "GB/s", "sustained", "bound s", "bound by"):
        table.add_column(col, justify="left" if col in (key, "bound by") else "right")
    for v, r in zip(values, results, strict=True):
        table.add_row(
            v, f"{r.duration_s:.2f}", "-" if r.load is None else f"{r.load.duration_s:.2f}",
            f"{r.throughput_gb_s:,.1f}", f"{r.sustained_gb_s:,.1f}", f"{r.lower_bound_s:.2f}",
            r.bound_by,
        )  # fmt: skip
    Console().print(table)


__all__ = [
    "VARY",
    "core_gbps_of",
    "core_gbps_option",
    "plot_projection",
    "scenario_of",
    "with_fabric",
    "scenario_options",
    "simulate_checkpoint",
    "simulate_sweep",
]
