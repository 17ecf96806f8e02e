"""MLPerf Storage's training emulation: emulated accelerators read batches and "compute" by
sleeping; accelerator utilization (AU) is the share of time they spend computing.

Each emulated accelerator is a simulated rank (``clients/ranks.py``) with a ``ShardStream`` of
the dataset (``clients/dataset.py``): per step it waits for its next batch (I/O the prefetch
did not hide) and then sleeps the workload's computation time per batch. As in MLPerf Storage,
the first step is left out: AU = compute time / wall time from the end of each rank's first
step, averaged over ranks, and the run passes when it reaches the workload's threshold (90%,
cosmoflow 70%).

The same loop reads through any *source* that answers the three calls ``ShardStream`` makes:
the native client, an fsspec filesystem (``FsspecSource``), or a local directory
(``LocalSource``), so a benchmark compares them in one run.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from clients.dataset import ShardStream, load_index
from clients.ranks import Job, ProcessInfo, Rank
from clients.workloads import workload_named
from tectonic_emu import clock
from tectonic_emu.chunkstore.base import BytesLike
from tectonic_emu.client import Client
from tectonic_emu.errors import InvalidArgumentError, NotFoundError


@dataclass(frozen=True, slots=True)
class TrainReport:
    workload: str
    accelerator: str
    accelerators: int
    epochs: int
    steps: int  # per rank, all epochs
    au: float  # mean over ranks
    au_min: float
    au_threshold: float
    passed: bool
    samples_per_s: float
    mb_per_s: float
    wall_s: float
    io_wait_s: float  # mean per rank
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _RankRun:
    steps: int = 0
    samples: int = 0
    bytes: int = 0
    compute_s: float = 0.0  # after the first step


async def train(
    client: Client,
    path: str,
    *,
    workload: str,
    accelerators: int,
    accelerator: str = "h100",
    epochs: int = 1,
    seed: int = 0,
    prefetch: int = 2,
    computation_time: float | None = None,
    job: Job | None = None,
    source: Any = None,
    source_name: str = "native",
) -> TrainReport:
    """Emulate ``accelerators`` accelerators training on the dataset at ``path`` for
    ``epochs`` epochs, reading through ``source`` (default: ``client``; see the module
    docstring). ``job`` runs the ranks (default: all of them in this process; its
    collectives go through ``client``); ``computation_time`` overrides the workload's
    seconds per batch."""
    wl = workload_named(workload)
    acc = wl.accelerator(accelerator)
    compute = acc.computation_time if computation_time is None else computation_time
    source = client if source is None else source
    if job is None:
        job = Job(
            client,
            f"train-{os.getpid()}-{time.monotonic_ns()}",
            ranks_per_process=accelerators,
            process=ProcessInfo(0, 1),
        )
    if job.world_size != accelerators:
        raise InvalidArgumentError(
            f"the job has {job.world_size} ranks, not {accelerators} accelerators"
        )
    index = await load_index(cast(Client, source), path)
    record_bytes = index.nbytes // max(1, index.rows)

    async def body(rank: Rank) -> list[list[float]]:
        """One accelerator's run; every rank's figures (gathered through the job, so each
        process of a multi-process job reports the whole job)."""
        run = _RankRun()
        start = clock.monotonic()
        first_done: float | None = None
        for epoch in range(epochs):
            stream = ShardStream(
                cast(Client, source),
                path,
                rank=rank.rank,
                world_size=accelerators,
                batch_size=acc.batch_size,
                seed=seed,
                epoch=epoch,
                prefetch=prefetch,
            )
            async with stream:
                while True:
                    try:
                        batch = await rank.io(stream.__anext__())
                    except StopAsyncIteration:
                        break
                    t = await rank.compute(compute)
                    run.steps += 1
                    run.samples += batch.num_rows
                    run.bytes += batch.num_rows * record_bytes
                    if first_done is None:
                        first_done = clock.monotonic()
                    else:
                        run.compute_s += t
            await rank.barrier()  # the epoch ends for every rank together
        end = clock.monotonic()
        au = (
            run.compute_s / (end - first_done)
            if first_done is not None and end > first_done
            else -1.0
        )
        mine = [au, run.samples, run.bytes, run.steps, rank.timeline.io_wait_s, end - start]
        everyone: list[list[float]] = await rank.all_gather(mine)
        return everyone

    results = await job.run(body)
    figures = results[0].value  # the same on every rank
    aus = [f[0] for f in figures if f[0] >= 0]
    au = sum(aus) / len(aus) if aus else 0.0
    wall = max((f[5] for f in figures), default=0.0)
    return TrainReport(
        workload=wl.name,
        accelerator=acc.name,
        accelerators=accelerators,
        epochs=epochs,
        steps=int(max((f[3] for f in figures), default=0)),
        au=round(au, 4),
        au_min=round(min(aus), 4) if aus else 0.0,
        au_threshold=wl.au_threshold,
        passed=bool(aus) and au >= wl.au_threshold,
        samples_per_s=round(sum(f[1] for f in figures) / wall, 1) if wall > 0 else 0.0,
        mb_per_s=round(sum(f[2] for f in figures) / wall / 1e6, 1) if wall > 0 else 0.0,
        wall_s=round(wall, 3),
        io_wait_s=round(sum(f[4] for f in figures) / max(1, len(figures)), 4),
        source=source_name,
    )


class LocalSource:
    """A dataset copied to a local directory, read with plain file I/O in worker threads
    (the local-disk baseline): ``/a/b`` in the store is ``root/a/b``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.config = ReadSize()

    def _local(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    async def read(self, path: str, offset: int = 0, size: int = -1) -> bytes:
        def run() -> bytes:
            try:
                with open(self._local(path), "rb") as f:
                    f.seek(offset)
                    return f.read(size)
            except FileNotFoundError:
                raise NotFoundError("no such file", path) from None

        return await asyncio.to_thread(run)

    async def read_into(self, path: str, offset: int, buf: BytesLike) -> int:
        def run() -> int:
            fd = os.open(self._local(path), os.O_RDONLY)
            try:
                return os.preadv(fd, [memoryview(buf).cast("B")], offset)
            finally:
                os.close(fd)

        return await asyncio.to_thread(run)

    async def stat(self, path: str) -> Any:
        try:
            st = await asyncio.to_thread(os.stat, self._local(path))
        except FileNotFoundError:
            raise NotFoundError("no such file", path) from None
        return _Stat(st.st_size, hash((st.st_ino, st.st_mtime_ns)))

    async def exists(self, path: str) -> bool:
        return await asyncio.to_thread(self._local(path).exists)


class FsspecSource:
    """A dataset read through an fsspec async filesystem (``clients/fsspec.py``'s or any)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self.config = ReadSize()

    async def read(self, path: str, offset: int = 0, size: int = -1) -> bytes:
        end = None if size < 0 else offset + size
        try:
            return bytes(await self.fs._cat_file(path, start=offset, end=end))
        except FileNotFoundError:
            raise NotFoundError("no such file", path) from None

    async def read_into(self, path: str, offset: int, buf: BytesLike) -> int:
        out = memoryview(buf).cast("B")
        data = await self.fs._cat_file(path, start=offset, end=offset + len(out))
        out[: len(data)] = data
        return len(data)

    async def stat(self, path: str) -> Any:
        try:
            info = await self.fs._info(path)
        except FileNotFoundError:
            raise NotFoundError("no such file", path) from None
        return _Stat(int(info["size"]), hash((info.get("id"), info.get("mtime"), info["size"])))

    async def exists(self, path: str) -> bool:
        return bool(await self.fs._exists(path))


@dataclass(frozen=True, slots=True)
class _Stat:
    size: int
    id: int  # changes when the file is replaced (ShardStream caches by it)


@dataclass(frozen=True, slots=True)
class ReadSize:
    """What ``ShardStream`` asks of a source's ``config``: the read unit it aligns to (the
    store's chunk size; for other sources, a read size that suits them)."""

    block_size: int = 8 << 20


__all__ = ["FsspecSource", "LocalSource", "TrainReport", "train"]
