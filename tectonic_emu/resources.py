"""What this machine has room for: memory a run may still take, and free disk where it writes.

Commands that hold or write a size a user names (``demo --size``, every sized bench) check it
here first, so ``--size 100TiB`` gets one line naming the largest size that fits instead of
``Cannot allocate memory`` (or a full disk) half-way through.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tectonic_emu.errors import InvalidArgumentError, NoSpaceError

_CGROUP_FILES = (  # (limit, usage): cgroup v2, then v1
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


@dataclass(frozen=True, slots=True)
class Needs:
    """What one run needs at its peak: resident ``memory`` and ``disk`` bytes at once."""

    memory: int
    disk: int


def memory_available() -> int:
    """Bytes a run may still make resident: ``MemAvailable``, less where a cgroup limits
    this process to fewer."""
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            have = next(int(ln.split()[1]) << 10 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        pass
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max" or ~2**63: no limit
            have = min(have, max(0, int(limit) - usage))
        break
    return have


def disk_free(path: str | os.PathLike[str]) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def human_bytes(n: float) -> str:
    """``1610612736`` -> ``'1.5 GiB'``: binary units, at most one decimal."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f}".removesuffix(".0") + f" {unit}"
    return f"{n:.0f} B"


def round_down(n: int) -> int:
    """``n`` rounded down to a tenth of its unit (7.46 GiB -> 7.4 GiB), so that the size
    ``human_bytes`` shows as fitting does fit."""
    shift = next((s for s in (50, 40, 30, 20, 10) if n >= 1 << s), 0)
    step = max(1, (1 << shift) // 10)
    return n // step * step


def check_fits(
    size: int,
    needs: Callable[[int], Needs],
    directory: str | os.PathLike[str],
    *,
    minimum: int = 1,
    at_least: str = "",
) -> None:
    """Raise unless a run of ``size`` bytes fits: ``needs(size)`` within the memory available
    and the space free in ``directory``. Raises InvalidArgumentError for a size below
    ``minimum`` (``at_least`` says why that much) or one that memory cannot hold, and
    NoSpaceError for one the disk cannot; the message names the largest size that fits."""
    if size < minimum:
        why = f" ({at_least})" if at_least else ""
        raise InvalidArgumentError(
            f"--size must be at least {human_bytes(minimum)}{why}, not {human_bytes(size)}"
        )
    have = Needs(memory_available(), disk_free(directory))
    need = needs(size)
    if need.memory <= have.memory and need.disk <= have.disk:
        return
    lo, hi = minimum - 1, size  # the largest size that fits lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        n = needs(mid)
        lo, hi = (mid, hi) if n.memory <= have.memory and n.disk <= have.disk else (lo, mid)
    fits = f"at most {human_bytes(round_down(lo))} fits" if lo >= minimum else "nothing fits"
    error = InvalidArgumentError if need.memory > have.memory else NoSpaceError
    raise error(
        f"--size {human_bytes(size)} does not fit: this run needs ~{human_bytes(need.memory)} "
        f"in memory ({human_bytes(have.memory)} available) and ~{human_bytes(need.disk)} on "
        f"disk in {directory} ({human_bytes(have.disk)} free); {fits}"
    )


__all__ = [
    "Needs",
    "check_fits",
    "disk_free",
    "human_bytes",
    "memory_available",
    "round_down",
]
