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
import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from clients.checkpoint import Checkpointer
from clients.dataset import ShardStream, load_index
from clients.ranks import Job, ProcessInfo, Rank, Timeline
from clients.workloads import workload_named
from tectonic_emu import clock
from tectonic_emu.chunkstore.base import BytesLike
from tectonic_emu.client import Client
from tectonic_emu.errors import InvalidArgumentError, NotFoundError


@dataclass(frozen=True, slots=True)
class Bursts:
    """Checkpoint bursts during training: after every ``every``-th step, each rank saves
    ``state(rank)`` for that step through ``checkpointer(rank)`` (its host's), with ``save``
    (it computes again once the step is committed) or ``save_async`` (once its state is
    staged; the next burst waits for the commit)."""

    every: int
    checkpointer: Callable[[int], Checkpointer]
    state: Callable[[int], Mapping[str, Any]]
    async_save: bool = False


@dataclass(frozen=True, slots=True)
class Burst:
    """One checkpoint burst, of the checkpoint of training step ``step``: from the first
    rank's save call to the last rank's commit (seconds since the job's start), the AU of
    the ranks over it, and how long ranks were blocked in the save (p50 and max)."""

    step: int
    start_s: float
    end_s: float
    au: float
    blocked_p50_s: float
    blocked_max_s: float


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
    checkpoint_s: float = 0.0  # mean per rank: blocked in checkpoint saves
    au_between: float = 0.0  # AU outside the bursts, once every rank's first step is done
    bursts: list[Burst] = field(default_factory=list)
    au_sample_s: float = 0.0  # the width of each sample of au_timeline
    au_timeline: list[list[float]] = field(default_factory=list)  # [s since the start, AU]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _RankRun:
    steps: int = 0
    samples: int = 0
    bytes: int = 0
    compute_s: float = 0.0  # after the first step
    saves: list[float] = field(default_factory=list)  # (start, blocked until, committed)...


@dataclass
class _Figures:
    """One rank's figures at the end of a run, gathered from every rank as a dict."""

    au: float  # -1 when the rank finished no step after its first
    samples: int
    bytes: int
    steps: int
    io_wait_s: float
    wall_s: float
    checkpoint_s: float
    first_done_s: float  # when its first step was done
    saves: list[float]  # (start, blocked until, committed) per save


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
    sources: Callable[[int], Any] | None = None,
    within: Callable[[int], AbstractContextManager[Any]] | None = None,
    bursts: Bursts | None = None,
) -> TrainReport:
    """Emulate ``accelerators`` accelerators training on the dataset at ``path`` for
    ``epochs`` epochs, reading through ``source`` (default: ``client``; see the module
    docstring), or rank ``r`` through ``sources(r)`` inside ``within(r)`` (a projection's:
    its host's client and CPU). ``job`` runs the ranks (default: all of them in this
    process; its collectives go through ``client``); ``computation_time`` overrides the
    workload's seconds per batch;
    ``bursts``, checkpoints saved as the ranks train. AU over time and each burst's figures
    are of this process's ranks (all of them, unless ``job`` has several processes)."""
    wl = workload_named(workload)
    acc = wl.accelerator(accelerator)
    compute = acc.computation_time if computation_time is None else computation_time
    source = client if source is None else source
    source_of = sources or (lambda _: source)
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
    if bursts is not None and bursts.every < 1:
        raise InvalidArgumentError(f"checkpoint every {bursts.every} steps: 1 or more")
    index = await load_index(cast(Client, source_of(job.first_rank)), path)
    record_bytes = index.nbytes // max(1, index.rows)

    def now() -> float:
        return clock.monotonic() - job.t0

    async def save(rank: Rank, run: _RankRun, pending: list[Any]) -> None:
        """This rank's part of a burst (``bursts``) after its ``run.steps``-th step."""
        assert bursts is not None
        ckpt, state = bursts.checkpointer(rank.rank), bursts.state(rank.rank)
        if pending:  # the last save_async's commit, before the next save begins
            await rank.io(pending.pop().committed, "checkpoint")
        begin = now()
        if bursts.async_save:
            staged = await rank.io(ckpt.save_async(run.steps, rank.rank, state), "checkpoint")
            pending.append(staged)
            blocked = now()
            run.saves += [begin, blocked, blocked]
            at = len(run.saves) - 1

            def committed(_: object) -> None:  # the commit's time, when it comes
                run.saves[at] = now()

            staged.committed.add_done_callback(committed)
        else:
            await rank.io(ckpt.save(run.steps, rank.rank, state), "checkpoint")
            run.saves += [begin, now(), now()]

    async def body(rank: Rank) -> list[dict[str, Any]]:
        with within(rank.rank) if within is not None else contextlib.nullcontext():
            return await accelerator_run(rank)

    async def accelerator_run(rank: Rank) -> list[dict[str, Any]]:
        """One accelerator's run; every rank's figures (gathered through the job, so each
        process of a multi-process job reports the whole job)."""
        run, pending = _RankRun(), list[Any]()
        start = now()
        first_done: float | None = None
        for epoch in range(epochs):
            stream = ShardStream(
                cast(Client, source_of(rank.rank)),
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
                        first_done = now()
                    else:
                        run.compute_s += t
                    if bursts is not None and run.steps % bursts.every == 0:
                        await save(rank, run, pending)
            await rank.barrier()  # the epoch ends for every rank together
        end = now()  # training is over; a save_async may still be committing
        if pending:
            await rank.io(pending.pop().committed, "checkpoint")
        au = (
            run.compute_s / (end - first_done)
            if first_done is not None and end > first_done
            else -1.0
        )
        mine = _Figures(
            au=au,
            samples=run.samples,
            bytes=run.bytes,
            steps=run.steps,
            io_wait_s=rank.timeline.io_wait_s,
            wall_s=end - start,
            checkpoint_s=rank.timeline.checkpoint_s,
            first_done_s=first_done or 0.0,
            saves=run.saves,
        )
        everyone: list[dict[str, Any]] = await rank.all_gather(asdict(mine))
        return everyone

    results = await job.run(body)
    figures = [_Figures(**f) for f in results[0].value]  # the same on every rank
    aus = [f.au for f in figures if f.au >= 0]
    au = sum(aus) / len(aus) if aus else 0.0
    wall = max((f.wall_s for f in figures), default=0.0)
    spans = Compute([r.timeline for r in results])
    windows = _bursts(figures, spans, bursts.every if bursts else 0)
    steady = max((f.first_done_s for f in figures), default=0.0)  # every first step done
    width = max(compute, wall / AU_SAMPLES)
    return TrainReport(
        workload=wl.name,
        accelerator=acc.name,
        accelerators=accelerators,
        epochs=epochs,
        steps=max((f.steps for f in figures), default=0),
        au=round(au, 4),
        au_min=round(min(aus), 4) if aus else 0.0,
        au_threshold=wl.au_threshold,
        passed=bool(aus) and au >= wl.au_threshold,
        samples_per_s=round(sum(f.samples for f in figures) / wall, 1) if wall > 0 else 0.0,
        mb_per_s=round(sum(f.bytes for f in figures) / wall / 1e6, 1) if wall > 0 else 0.0,
        wall_s=round(wall, 3),
        io_wait_s=round(sum(f.io_wait_s for f in figures) / max(1, len(figures)), 4),
        source=source_name,
        checkpoint_s=round(sum(f.checkpoint_s for f in figures) / max(1, len(figures)), 4),
        au_between=round(
            spans.au_outside(steady, wall, [(b.start_s, b.end_s) for b in windows]), 4
        ),
        bursts=windows,
        au_sample_s=round(width, 6),
        au_timeline=[
            [round(t, 6), round(spans.au(t, min(t + width, wall)), 4)]
            for t in (k * width for k in range(math.ceil(wall / width) if width > 0 else 0))
        ],
    )


AU_SAMPLES = 100  # samples of AU over a run (each at least one batch's computation time)


class Compute:
    """When ranks computed (the ``compute`` spans of their timelines): the AU of any
    interval, from prefix sums over the spans' sorted starts and ends."""

    def __init__(self, timelines: Sequence[Timeline]) -> None:
        spans = [(a, b) for t in timelines for kind, a, b in t.spans if kind == "compute"]
        self.ranks = max(1, len(timelines))
        self.starts = np.sort(np.array([a for a, _ in spans], dtype=np.float64))
        self.ends = np.sort(np.array([b for _, b in spans], dtype=np.float64))
        self._s = np.concatenate([[0.0], np.cumsum(self.starts)])
        self._e = np.concatenate([[0.0], np.cumsum(self.ends)])

    def before(self, t: float) -> float:
        """Rank-seconds of computing before ``t``: each span contributes min(t, end) - start
        once begun, i.e. (t - start) summed over begun spans less (t - end) over ended ones."""
        k = int(np.searchsorted(self.starts, t, side="right"))
        j = int(np.searchsorted(self.ends, t, side="right"))
        return float((k * t - self._s[k]) - (j * t - self._e[j]))

    def au(self, a: float, b: float) -> float:
        """The share of [a, b) the ranks spent computing."""
        if b <= a:
            return 0.0
        return min(1.0, max(0.0, (self.before(b) - self.before(a)) / (self.ranks * (b - a))))

    def au_outside(self, a: float, b: float, windows: Sequence[tuple[float, float]]) -> float:
        """The share of [a, b), less ``windows``, the ranks spent computing."""
        busy, span = self.before(b) - self.before(a), b - a
        for lo, hi in windows:
            lo, hi = max(lo, a), min(hi, b)
            if hi > lo:
                busy, span = busy - (self.before(hi) - self.before(lo)), span - (hi - lo)
        return min(1.0, max(0.0, busy / (self.ranks * span))) if span > 0 else 0.0


def _bursts(figures: Sequence[_Figures], spans: Compute, every: int) -> list[Burst]:
    """Each burst's figures from every rank's (start, blocked until, committed) per save."""
    saves = [f.saves for f in figures]
    count = min((len(s) // 3 for s in saves), default=0)
    out = []
    for k in range(count):
        begin = min(s[3 * k] for s in saves)
        end = max(s[3 * k + 2] for s in saves)
        blocked = sorted(s[3 * k + 1] - s[3 * k] for s in saves)
        out.append(
            Burst(
                step=(k + 1) * every,
                start_s=round(begin, 6),
                end_s=round(end, 6),
                au=round(spans.au(begin, end), 4),
                blocked_p50_s=round(blocked[len(blocked) // 2], 6),
                blocked_max_s=round(blocked[-1], 6),
            )
        )
    return out


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


__all__ = ["Burst", "Bursts", "Compute", "FsspecSource", "LocalSource", "TrainReport", "train"]
