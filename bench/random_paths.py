"""The read paths of ``bench random`` and the counters that say what each one read.

Every path reads one file at a list of offsets, one request of ``len(buf)`` bytes at a time,
into one reused page-aligned buffer, and gives a ``Sample``: the seconds the requests took
and the growth of ``rchar`` and ``read_bytes`` in ``/proc/<pid>/io`` of the processes that
read the data's files while they ran (``IoCounters``). File-level paths (local files, the
mount, JuiceFS) use ``os.preadv`` on a descriptor opened ``O_RDONLY`` (``pread`` into the
buffer: no allocation per request); the native client reads through a ``FileReader`` opened
once (``Client.reader``), as a data loader holds its shards open.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tectonic_emu.errors import TectonicError


class ReadBackError(TectonicError):
    """A path returned fewer bytes than asked, or bytes other than the file's."""


@dataclass(frozen=True, slots=True)
class IoCounters:
    """``rchar`` (bytes that ``read``-family calls returned, from any file, pipe or cache) and
    ``read_bytes`` (bytes the block layer fetched from a disk for it), summed over processes."""

    rchar: int
    read_bytes: int

    def __sub__(self, other: IoCounters) -> IoCounters:
        return IoCounters(self.rchar - other.rchar, self.read_bytes - other.read_bytes)


@dataclass(frozen=True, slots=True)
class Sample:
    """One path's requests of one round: wall seconds, and bytes read by the counted
    processes meanwhile (None where their counters were unreadable)."""

    requests: int
    request: int
    seconds: float
    read: IoCounters | None

    @property
    def ops_s(self) -> float:
        return self.requests / self.seconds

    def amplification(self) -> tuple[float | None, float | None]:
        """(``rchar`` / bytes asked, ``read_bytes`` / bytes asked)."""
        if self.read is None:
            return None, None
        asked = self.requests * self.request
        return self.read.rchar / asked, self.read.read_bytes / asked


Pids = Callable[[], Sequence[int]]


def io_counters(pids: Sequence[int]) -> IoCounters | None:
    """The processes' ``rchar`` and ``read_bytes`` summed; None if there are none or one is
    unreadable (gone, or another user's without root)."""
    if not pids:
        return None
    rchar = read_bytes = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/io").read_text()
        except OSError:
            return None
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        rchar += int(fields["rchar"])
        read_bytes += int(fields["read_bytes"])
    return IoCounters(rchar, read_bytes)


def with_descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (a daemon's helpers read files too)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent[int(entry.name)] = int(stat[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [child for child, ppid in parent.items() if ppid == p]
    return out


def processes_of(program: str, tag: str) -> list[int]:
    """Processes named ``program`` (``/proc/<pid>/comm``) whose command line holds ``tag``.
    (JuiceFS rewrites its command line into one string, so ``argv[0]`` alone would not do.)"""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if comm == program and tag in cmdline:
            out.append(int(entry.name))
    return out


def this_process() -> list[int]:
    return [os.getpid()]


def _pread_all(fd: int, buf: memoryview, offsets: Sequence[int]) -> float:
    """Seconds to ``preadv`` ``len(buf)`` bytes at each offset in turn."""
    want = len(buf)
    t0 = time.perf_counter()
    for off in offsets:
        if os.preadv(fd, [buf], off) != want:
            raise ReadBackError(f"short read at {off}")
    return time.perf_counter() - t0


def read_file(
    path: Path, offsets: Sequence[int], buf: memoryview, pids: Pids, *, direct: bool = False
) -> Sample:
    """``len(buf)``-byte preads of the file at ``path`` at ``offsets``, counting what the
    processes ``pids()`` read meanwhile. ``direct``: opened with ``O_DIRECT`` (``buf`` and the
    offsets must be aligned to the file system's block). The open is not timed."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        who = pids()
        before = io_counters(who)
        seconds = _pread_all(fd, buf, offsets)
        after = io_counters(who)
    finally:
        os.close(fd)
    read = None if before is None or after is None else after - before
    return Sample(len(offsets), len(buf), seconds, read)


def warm(path: Path) -> None:
    """Read the whole file once, so that its pages are in the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)


async def read_native(
    client: Any, path: str, offsets: Sequence[int], buf: memoryview, pids: Pids
) -> Sample:
    """``reader.read_into(offset, buf)`` at each offset, in turn, of a ``FileReader`` opened
    once (its block map looked up once, as the mount's descriptor has it); the open is
    timed too."""
    want = len(buf)
    who = pids()
    before = io_counters(who)
    t0 = time.perf_counter()
    reader = await client.reader(path)
    for off in offsets:
        if await reader.read_into(off, buf) != want:
            raise ReadBackError(f"native client: short read at {off}")
    seconds = time.perf_counter() - t0
    after = io_counters(who)
    read = None if before is None or after is None else after - before
    return Sample(len(offsets), want, seconds, read)


def check_last(name: str, buf: memoryview, data: memoryview, offsets: Sequence[int]) -> None:
    """Raise ReadBackError unless ``buf`` holds the file's bytes at the last offset read."""
    off = offsets[-1]
    if buf != data[off : off + len(buf)]:
        raise ReadBackError(f"{name}: the bytes read at {off} are not the file's")


__all__ = [
    "IoCounters",
    "Pids",
    "ReadBackError",
    "Sample",
    "check_last",
    "io_counters",
    "processes_of",
    "read_file",
    "read_native",
    "this_process",
    "warm",
    "with_descendants",
]
