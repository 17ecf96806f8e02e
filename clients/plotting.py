"""PNG plots for ``--plot DIR``: two shapes cover every bench and projection.

- ``bars``: one group of bars per path (checkpoint writes and reads through each path), with an
  optional dashed line for the machine's limit measured in the same run;
- ``lines``: a figure against a count (ranks), log-scaled on x, one line per series.

matplotlib runs headless (the Agg backend); it is imported here only, so that benches that
are not plotted never pay for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bars(
    path: Path,
    *,
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ylabel: str,
    limit: float | None = None,
    limit_label: str = "limit",
) -> Path:
    """Grouped bars: ``series[name][i]`` is the bar of ``name`` for ``labels[i]``. Returns
    ``path`` (written as PNG)."""
    plt = _pyplot()
    n = max(len(series), 1)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4.2))
    for k, (name, values) in enumerate(series.items()):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(labels))]
        ax.bar(xs, values, width, label=name)
    if limit is not None:
        ax.axhline(limit, linestyle="--", color="black", linewidth=1, label=limit_label)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, ax, path, title, ylabel)


def lines(
    path: Path,
    *,
    title: str,
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    logy: bool = False,
) -> Path:
    """One line (with markers) per series over ``x``. Returns ``path`` (written as PNG)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, values in series.items():
        ax.plot(list(x), list(values), marker="o", label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    return _save(plt, fig, ax, path, title, ylabel)


def _save(plt: Any, fig: Any, ax: Any, path: Path, title: str, ylabel: str) -> Path:
    """Title, y label and legend, then the PNG at ``path``; the figure is closed."""
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["bars", "lines"]
