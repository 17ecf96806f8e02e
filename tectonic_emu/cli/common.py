"""What every command shares: the --cluster and --json options, running a coroutine, the
transfer bar, JSON output and the consoles."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from tectonic_emu.cluster import Cluster
from tectonic_emu.config import QOS_MODES

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

err_console = Console(stderr=True)
out_console = Console()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def cluster_option(fn: F) -> F:
    return cluster_option_with("Cluster directory (default: $TECTONIC_EMU_CLUSTER).")(fn)


def cluster_option_with(help: str, *, required: bool = True) -> Callable[[F], F]:
    """The --cluster option with its own help; ``required=False`` where another option
    (a projection's --preset) can stand in for it."""
    return click.option(
        "--cluster",
        "cluster_dir",
        envvar="TECTONIC_EMU_CLUSTER",
        required=required,
        type=click.Path(file_okay=False, path_type=Path),
        help=help,
    )


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def progress_bar(total: int | None, *, items: bool = False) -> Progress:
    """A transfer bar on stderr, shown only when stderr is a terminal: percentage, bytes,
    rate and ETA once a task has a total; a pulsing bar until then. ``items``: counts
    things (done/total) rather than bytes."""
    counts: tuple[ProgressColumn, ...] = (
        (MofNCompleteColumn(),)
        if items
        else (DownloadColumn(binary_units=True), TransferSpeedColumn())
    )
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        TaskProgressColumn(),
        *counts,
        TimeRemainingColumn(),
        console=err_console,
        disable=not err_console.is_terminal,
        transient=True,
    )


async def with_cluster(path: Path, fn: Callable[[Cluster], Awaitable[T]]) -> T:
    async with Cluster.open(path) as cluster:
        return await fn(cluster)


qos_mode_option = click.option(
    "--qos",
    type=click.Choice(QOS_MODES),
    default=None,
    help="How nodes share each disk between traffic groups (docs/qos.md) "
    "[default: the cluster's, `cluster create --qos`].",
)

buffers_option = click.option(
    "--buffers",
    default=8,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="Chunk buffers each node process keeps in memory.",
)


__all__ = [
    "buffers_option",
    "cluster_option",
    "err_console",
    "json_option",
    "out_console",
    "print_json",
    "progress_bar",
    "run",
    "with_cluster",
]
