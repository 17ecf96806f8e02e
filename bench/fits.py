"""Whether a bench's ``--size`` fits this machine, checked before the bench allocates a byte.

Every bench that holds or writes ``size`` bytes says what a run of that size needs (``Needs``:
the memory it keeps resident at its peak, its mounts' and node processes' included, and the
bytes it has on disk at once), worked out from its own code (each module's ``needs``).
``check_fits`` compares them with the memory available and the space free under ``--dir``,
and refuses a size that does not fit with one line naming the largest that does, instead of
``Cannot allocate memory`` (or a full disk) half-way through a run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tectonic_emu.client import Client
from tectonic_emu.coding import Encoding
from tectonic_emu.config import DEFAULT_BLOCK_SIZE
from tectonic_emu.errors import InvalidArgumentError, NoSpaceError
from tectonic_emu.resources import disk_free

PAGE = 4096  # a chunk file's header page, and the file system's rounding of its payload
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
    this process to fewer (``tectonic_emu.resources.memory_available`` without the cgroup)."""
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


def approx(n: float) -> str:
    """``1610612736`` -> ``'1.5 GiB'``: binary units, at most one decimal."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f}".removesuffix(".0") + f" {unit}"
    return f"{n:.0f} B"


def round_down(n: int) -> int:
    """``n`` rounded down to a tenth of its unit (7.46 GiB -> 7.4 GiB), so that the size
    ``approx`` shows as fitting does fit."""
    shift = next((s for s in (50, 40, 30, 20, 10) if n >= 1 << s), 0)
    step = max(1, (1 << shift) // 10)
    return n // step * step


# -- what the store does with N bytes ---------------------------------------------------------
def block_bytes(encoding: str, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Bytes of one block of a file (every chunk is ``block_size``; RS blocks hold D)."""
    enc = Encoding.parse(encoding)
    return block_size * (enc.data if enc.kind == "rs" else 1)


def stored_bytes(
    nbytes: int, encoding: str, block_size: int = DEFAULT_BLOCK_SIZE, *, files: int = 1
) -> int:
    """Disk taken by ``nbytes`` written in ``files`` files of ``encoding``: the bytes times the
    storage overhead, plus per chunk a header page and the last page's rounding."""
    enc = Encoding.parse(encoding)
    blocks = max(files, math.ceil(nbytes / block_bytes(encoding, block_size)))
    return math.ceil(nbytes * enc.overhead) + blocks * enc.width * 2 * PAGE


def in_flight(
    encoding: str, block_size: int = DEFAULT_BLOCK_SIZE, *, writers: int = 1, nbytes: int
) -> int:
    """Memory of blocks a client has in flight for ``writers`` writers at once (each
    ``Client.write_depth`` blocks encoded into chunks: the parity besides the block for RS,
    one shared copy for replication, and ``read_depth`` blocks read back), at most
    ``nbytes`` of data in all."""
    enc = Encoding.parse(encoding)
    block = block_bytes(encoding, block_size)
    chunks = enc.overhead if enc.kind == "rs" else 1.0
    written = min(nbytes, writers * Client.write_depth * block)
    read = min(nbytes, writers * Client.read_depth * block)
    return math.ceil(written * chunks) + read


# -- the check --------------------------------------------------------------------------------
def check_fits(
    size: int,
    needs: Callable[[int], Needs],
    directory: Path,
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
            f"--size must be at least {approx(minimum)}{why}, not {approx(size)}"
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
    fits = f"at most {approx(round_down(lo))} fits" if lo >= minimum else "nothing fits"
    error = InvalidArgumentError if need.memory > have.memory else NoSpaceError
    raise error(
        f"--size {approx(size)} does not fit: this run needs ~{approx(need.memory)} in memory "
        f"({approx(have.memory)} available) and ~{approx(need.disk)} on disk in {directory} "
        f"({approx(have.disk)} free); {fits}"
    )


__all__ = [
    "Needs",
    "approx",
    "block_bytes",
    "check_fits",
    "disk_free",
    "in_flight",
    "memory_available",
    "round_down",
    "stored_bytes",
]
