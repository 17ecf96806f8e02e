"""Modelled disks: the time a storage node's device takes for each chunk read and write.

A ``Disk`` charges every operation to one resource measured in device-seconds
(``resources.py``): an operation of ``n`` bytes needs ``max(seek + n / bandwidth, 1 /
iops)`` of it. Alone, a big write then runs at the write bandwidth; many small ones
together reach the IOPS figure and no more. Concurrent ones share a flash device (its
channels serve them together: processor sharing), while a disk's head serves one at a time
in the order they came (``one_at_a_time``: a FIFO queue), so a request behind a deep queue
waits for all of it. On top of that:

- ``latency``: seconds each operation waits that overlap with other operations, such as a
  flash page read or program; ``write_latency``, where given, is the writes' (a file
  system's journal commit behind each synced chunk file, on this machine);
- ``seek``: seconds of the device's own time, such as a disk head's seek and rotation;
- ``queue_depth``: at most this many operations in the device at once; the others wait
  for a slot, as in the block layer's queue.

The presets name their sources. Where a figure was assumed rather than published, the
preset says so.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from tectonic_emu.qos.fairqueue import Costs
from tectonic_emu.sim.resources import QueueResource, Resource, SharedResource


@dataclass(frozen=True, slots=True)
class DiskModel:
    """One device's figures. Bandwidths in bytes/s, times in seconds."""

    name: str
    read_bw: float
    write_bw: float
    read_iops: float
    write_iops: float
    latency: float  # per operation, overlapping with others
    seek: float  # per operation, of the device's own time
    queue_depth: int
    source: str
    write_latency: float | None = None  # None: ``latency``
    # Serves one operation at a time, in arrival order (a disk's head), rather than sharing
    # itself between those in flight (flash's channels).
    one_at_a_time: bool = False

    def __post_init__(self) -> None:
        for field in ("read_bw", "write_bw", "read_iops", "write_iops"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{self.name}: {field} must be positive, not {value}")
        for field in ("latency", "seek", "write_latency"):
            value = getattr(self, field)
            if value is None:
                continue
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{self.name}: {field} must be 0 or more, not {value}")
        if self.queue_depth < 1:
            raise ValueError(f"{self.name}: queue depth must be at least 1")

    def costs(self) -> Costs:
        """What a fair queue charges for this device's operations (``qos/fairqueue.py``):
        its seek and one operation's share of its IOPS, plus bytes over bandwidth."""
        return Costs(
            read_bw=self.read_bw,
            write_bw=self.write_bw,
            read_op_s=self.seek + 1.0 / self.read_iops,
            write_op_s=self.seek + 1.0 / self.write_iops,
        )

    def service(self, nbytes: int, *, write: bool) -> float:
        """Device-seconds one operation of ``nbytes`` takes."""
        bw, iops = (self.write_bw, self.write_iops) if write else (self.read_bw, self.read_iops)
        return max(self.seek + nbytes / bw, 1.0 / iops)


FLASH = DiskModel(
    name="flash",
    read_bw=6.5e9,
    write_bw=3.5e9,
    read_iops=900_000,
    write_iops=200_000,
    latency=80e-6,
    seek=0.0,
    queue_depth=128,
    source=(
        "Samsung PM9A3 U.2 NVMe (PCIe 4.0), Samsung's announcement as reported by heise.de "
        "and computerbase.de, 2020-05: 6.5 GB/s sequential read, 3.5 GB/s write, 900K random "
        "read and 200K random write IOPS. Assumed, not published there: 80 us latency per "
        "operation and a queue depth of 128."
    ),
)

HDD = DiskModel(
    name="hdd",
    read_bw=262e6,
    write_bw=262e6,
    read_iops=152,
    write_iops=192,
    latency=0.0,
    seek=4.16e-3,
    queue_depth=32,
    source=(
        "One actuator of a Seagate Exos 2X14 (Seagate's specification as reported by Tom's "
        "Hardware, 2021-05): half of its 524 MB/s, 304/384 random read/write IOPS, 4.16 ms "
        "average latency taken as each operation's seek. Assumed: an NCQ depth of 32, served "
        "in arrival order (NCQ's reordering for the head's position left out)."
    ),
    one_at_a_time=True,
)

PRESETS = {m.name: m for m in (FLASH, HDD)}


class Disk:
    """One modelled device (module docstring). ``time``: the device-seconds it serves."""

    def __init__(self, model: DiskModel, *, time: Resource | None = None, name: str = "") -> None:
        self.model = model
        if time is None:
            name = name or model.name
            time = (
                QueueResource(1.0, name=name)
                if model.one_at_a_time
                else SharedResource(1.0, name=name)
            )
        self.time = time
        self._slots = asyncio.Semaphore(model.queue_depth)
        self._writing: set[asyncio.Future[None]] = set()  # writes the device holds now
        self.ops = 0
        self.bytes_read = 0
        self.bytes_written = 0

    async def read(self, nbytes: int) -> None:
        await self._io(nbytes, write=False)
        self.bytes_read += nbytes

    async def write(self, nbytes: int) -> None:
        await self._io(nbytes, write=True)
        self.bytes_written += nbytes

    async def flush(self, nbytes: int) -> None:
        """Write ``nbytes`` and make them durable as an fsync does: first every write the
        device holds now ends, since a cache flush waits for the writes before it (a
        journal commit behind them, on this machine); then the bytes. On this machine a
        SQLite WAL fsync took 13-18 ms beside 3-4 chunk writes of 8 MiB in flight, about
        what is left of them, where a 4 KiB write alone takes under 1 ms (2026-12-06)."""
        if self._writing:
            await asyncio.wait(list(self._writing))
        await self.write(nbytes)

    def written_so_far(self) -> float:
        """Bytes written until now, writes in progress as far as they got (as far as the
        device-time resource tells: a ``QueueResource`` counts each as it ends)."""
        return self.time.worth_so_far()

    async def _io(self, nbytes: int, *, write: bool) -> None:
        latency = self.model.latency
        if write and self.model.write_latency is not None:
            latency = self.model.write_latency
        async with self._slots:
            done: asyncio.Future[None] | None = None
            if write:
                done = asyncio.get_running_loop().create_future()
                self._writing.add(done)
            try:
                if latency:
                    await asyncio.sleep(latency)
                service = self.model.service(nbytes, write=write)
                await self.time.begin(service, worth=nbytes if write else 0.0)
            finally:
                if done is not None:
                    self._writing.discard(done)
                    done.set_result(None)
        self.ops += 1


__all__ = ["FLASH", "HDD", "PRESETS", "Disk", "DiskModel"]
