"""A bench's targets, in the one shape ``bench all`` lists (``report.target_lines``): a
name, the value measured in this run, the goal, whether it is a ceiling, met or not (None
where the run did not measure what the target needs), and how the value was taken."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table


def target(
    name: str, value: float | None, goal: float, *, at_most: bool = False, detail: str = ""
) -> dict[str, Any]:
    """One target: ``value`` against ``goal`` (a floor, or with ``at_most`` a ceiling)."""
    met = None if value is None else (value <= goal if at_most else value >= goal)
    return {
        "name": name,
        "value": value,
        "goal": goal,
        "at_most": at_most,
        "met": met,
        "detail": detail,
    }


def figure(x: float | None) -> str:
    """A measured value for a table: thousands grouped, small ones to 3 figures."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def targets_table(title: str, targets: Sequence[Mapping[str, Any]]) -> Table:
    """The targets as a table: target, measured, goal, met (yes, no or n/a)."""
    t = Table(title=title)
    for c in ("target", "measured", "goal", "met"):
        t.add_column(c)
    for g in targets:
        met = "n/a" if g["met"] is None else ("[green]yes[/green]" if g["met"] else "[red]no[/red]")
        goal = f"{'<=' if g['at_most'] else '>='} {g['goal']:g}"
        t.add_row(g["name"], figure(g["value"]), goal, met)
    return t


__all__ = ["figure", "target", "targets_table"]
