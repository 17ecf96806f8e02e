"""What bench tables share: a legend under the table saying what each ratio column divides,
and, when a path ran faster than the raw disk beside it, why it could.

Tables are made to fit 80 columns (``WIDTH``) with realistic figures: a cell cut with an
ellipsis or wrapped onto a second line is a figure misread. The legend is the table's
caption, one line per statement, left-aligned; ``bench all`` puts each line in its own
paragraph under the Markdown table.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table

WIDTH = 80
LEGEND_WIDTH = 64  # a narrow table widens to this, so its legend is not a tall thin column


def with_legend(table: Table, *lines: str | None) -> Table:
    """``table`` with ``lines`` (``None`` skipped) added to its caption, left-aligned."""
    parts = [str(table.caption)] if table.caption else []
    table.caption = "\n".join(parts + [line for line in lines if line])
    table.caption_justify = "left"
    table.min_width = max(table.min_width or 0, LEGEND_WIDTH)
    return table


def as_tables(made: Table | list[Table] | None) -> list[Table]:
    """What a bench's table maker gave, as a list: it may give one table, a list, or none."""
    if made is None:
        return []
    return made if isinstance(made, list) else [made]


def beyond_raw(
    faster: Iterable[str],
    *,
    streams: str,
    warm_reads: bool = False,
    cached_writes: bool = False,
) -> str | None:
    """The legend line for the paths in ``faster`` (those whose disk traffic beat the raw
    disk's in this run), or None when there are none. ``streams`` says what this bench keeps
    in flight at once."""
    names = list(dict.fromkeys(faster))
    if not names:
        return None
    why = [
        f"the disk moved more bytes per second for parallel streams ({streams}) than for "
        "the raw path's one file, one stream, synced once"
    ]
    if warm_reads:
        why.append("reads were warm, from the page cache (run as root to drop it)")
    if cached_writes:
        why.append("--no-sync left the store's writes in the page cache")
    return f"Above the raw disk ({', '.join(names)}): " + "; ".join(why) + "."


__all__ = ["LEGEND_WIDTH", "WIDTH", "as_tables", "beyond_raw", "with_legend"]
