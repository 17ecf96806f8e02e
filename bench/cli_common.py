"""What every ``tectonic-emu bench`` command shares: the ``--dir`` and ``--plot`` options, the
progress bar a bench runs under (``run_bench``), printing a result (``emit``) and parsing
comma-separated lists. The commands (``bench/cli_storage.py``, ``bench/cli_checkpoint.py``)
and the group (``bench/cli.py``) import this module; it imports none of them.
"""

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

from bench.tables import as_tables

err_console = Console(stderr=True)
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
            for table in as_tables(getattr(module, make, lambda _: None)(result)):
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


__all__ = [
    "EtaColumn",
    "bar_columns",
    "csv_list",
    "dir_option",
    "emit",
    "err_console",
    "int_list",
    "plot_option",
    "run_bench",
]
