"""What this machine has room for: memory a run may still take, and free disk where it writes.

Commands that hold or write a size a user names check it here first, so ``--size 100TiB``
gets one line saying what fits instead of ``Cannot allocate memory`` half-way through.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tectonic_emu.errors import InvalidArgumentError, NoSpaceError


def memory_available() -> int:
    """Bytes of memory a new allocation can take without swapping (``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def disk_free(path: str | os.PathLike[str]) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``: binary units, one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_fits(
    what: str,
    size: int,
    *,
    memory_per_byte: float,
    disk_per_byte: float,
    where: str | os.PathLike[str],
) -> None:
    """Raise unless ``size`` bytes of ``what`` fit: ``size * memory_per_byte`` in available
    memory and ``size * disk_per_byte`` on the disk holding ``where``. The error names the
    largest size that fits (rounded down to a MiB where it is that large)."""
    limits: list[tuple[str, float, int]] = [
        ("in memory", memory_per_byte, memory_available()),
        (f"on disk at {where}", disk_per_byte, disk_free(where)),
    ]
    for place, per_byte, have in limits:
        need = size * per_byte
        if per_byte <= 0 or need <= have:
            continue
        fits = min(int(h / p) for _, p, h in limits if p > 0)
        fits = fits >> 20 << 20 if fits >= 1 << 20 else fits
        err = InvalidArgumentError if place == "in memory" else NoSpaceError
        raise err(
            f"{what} of {human_bytes(size)} does not fit: it needs {human_bytes(need)} "
            f"{place}, {human_bytes(have)} free; at most {human_bytes(fits)} fits"
        )


__all__ = ["check_fits", "disk_free", "human_bytes", "memory_available"]
