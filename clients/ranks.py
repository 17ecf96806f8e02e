"""Simulated ranks: many asyncio tasks per process, many processes, collectives through the store.

A *job* runs ``ranks_per_process`` simulated ranks in each of ``process_count`` processes
(launched by us, or by torchrun / mpirun / srun, which set RANK, WORLD_SIZE and LOCAL_RANK:
one of their ranks is one of our processes). Simulated rank ``r`` of process ``p`` is global
rank ``p * ranks_per_process + r``.

Collectives (``barrier``, ``all_gather``) meet in two stages: the ranks of a process gather
in memory, then the process exchanges one small file per collective with the others through
the store's metadata::

    /_jobs/<job>/c-00000042/p-00003     process 3's values for collective 42 (JSON)

so 4,096 ranks in one process cost one store file per collective, not 4,096, and processes on
other hosts meet the same way. Every rank keeps a timeline of where its time went (compute,
I/O wait, barrier wait) for reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tectonic_emu import clock
from tectonic_emu.client import Client
from tectonic_emu.errors import InvalidArgumentError, NotFoundError

T = TypeVar("T")

JOBS = "/_jobs"
_POLL_FIRST, _POLL_MAX = 0.002, 0.05
MAX_SPANS = 10_000  # per rank: older spans are dropped, totals are kept


class RanksTimeoutError(InvalidArgumentError, TimeoutError):
    """Processes did not all reach a collective in time."""


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """Which process of the job this is."""

    index: int
    count: int
    local_index: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProcessInfo:
        """From RANK, WORLD_SIZE and LOCAL_RANK (torchrun, mpirun and srun set them; a plain
        run is process 0 of 1)."""
        env = os.environ if env is None else env
        try:
            info = cls(
                int(env.get("RANK", "0")),
                int(env.get("WORLD_SIZE", "1")),
                int(env.get("LOCAL_RANK", "0")),
            )
        except ValueError as exc:
            raise InvalidArgumentError(
                f"RANK, WORLD_SIZE and LOCAL_RANK must be integers: {exc}"
            ) from exc
        if not 0 <= info.index < info.count:
            raise InvalidArgumentError(f"RANK {info.index} is not in [0, WORLD_SIZE={info.count})")
        return info


@dataclass(slots=True)
class Timeline:
    """Where one rank's time went. ``spans`` keeps (kind, start, end) in seconds since the
    job's start, at most MAX_SPANS of them."""

    compute_s: float = 0.0
    io_wait_s: float = 0.0
    barrier_wait_s: float = 0.0
    checkpoint_s: float = 0.0  # blocked saving checkpoints
    spans: list[tuple[str, float, float]] = field(default_factory=list)

    def add(self, kind: str, start: float, end: float) -> None:
        if kind == "compute":
            self.compute_s += end - start
        elif kind == "io":
            self.io_wait_s += end - start
        elif kind == "checkpoint":
            self.checkpoint_s += end - start
        else:
            self.barrier_wait_s += end - start
        if len(self.spans) >= MAX_SPANS:
            del self.spans[: MAX_SPANS // 10]
        self.spans.append((kind, start, end))


@dataclass(slots=True)
class _Round:
    values: dict[int, Any] = field(default_factory=dict)
    result: asyncio.Future[list[Any]] | None = None


class Job:
    """The ranks of this process, and the exchange with the job's other processes."""

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        ranks_per_process: int,
        process: ProcessInfo | None = None,
        timeout: float = 300.0,
    ) -> None:
        if ranks_per_process < 1:
            raise InvalidArgumentError(f"ranks_per_process must be >= 1, not {ranks_per_process}")
        self.client = client
        self.name = name
        self.process = process or ProcessInfo.from_env()
        self.ranks_per_process = ranks_per_process
        self.world_size = ranks_per_process * self.process.count
        self.timeout = timeout
        self.dir = f"{JOBS}/{name}"
        self.t0 = clock.monotonic()
        self._rounds: dict[int, _Round] = {}
        self._exchanges: set[asyncio.Task[list[Any]]] = set()

    @property
    def first_rank(self) -> int:
        return self.process.index * self.ranks_per_process

    async def _collective(self, seq: int, rank: int, value: Any) -> list[Any]:
        """Rank ``rank``'s part in collective ``seq``: every rank's value, by rank."""
        rnd = self._rounds.get(seq)
        if rnd is None:
            rnd = self._rounds[seq] = _Round()
            rnd.result = asyncio.get_running_loop().create_future()
        assert rnd.result is not None
        rnd.values[rank] = value
        if len(rnd.values) == self.ranks_per_process:  # the last local rank: exchange
            task = asyncio.ensure_future(self._exchange(seq, rnd.values))
            self._exchanges.add(task)  # a strong reference until it is done
            task.add_done_callback(self._exchanges.discard)
            result = rnd.result
            task.add_done_callback(lambda t: _settle(result, t))
            del self._rounds[seq]
        return await asyncio.shield(rnd.result)

    async def _exchange(self, seq: int, local: Mapping[int, Any]) -> list[Any]:
        mine = sorted(local.items())
        if self.process.count == 1:
            return [v for _, v in mine]
        cdir = f"{self.dir}/c-{seq:08d}"
        await self.client.mkdir(cdir, parents=True, exist_ok=True)
        mine_path = f"{cdir}/p-{self.process.index:05d}"
        await self.client.write_file(mine_path, json.dumps(mine).encode())
        delay, deadline = _POLL_FIRST, clock.monotonic() + self.timeout
        while True:
            names = [n for n in await self.client.listdir(cdir) if n.startswith("p-")]
            if len(names) == self.process.count:
                break
            if clock.monotonic() > deadline:
                have = {int(n[2:]) for n in names}
                missing = sorted(set(range(self.process.count)) - have)
                raise RanksTimeoutError(
                    f"collective {seq} of job {self.name!r}: processes {missing} did not come "
                    f"within {self.timeout:g} s"
                )
            await asyncio.sleep(delay)
            delay = min(_POLL_MAX, delay * 1.5)
        values: list[tuple[int, Any]] = []
        for n in sorted(names):
            values += [(r, v) for r, v in json.loads(await self.client.read_file(f"{cdir}/{n}"))]
        if self.process.index == 0 and seq > 0:
            # Every process has arrived here, so all have left the collective before.
            with contextlib.suppress(NotFoundError):
                await self.client.delete(f"{self.dir}/c-{seq - 1:08d}", recursive=True)
        return [v for _, v in sorted(values, key=lambda rv: rv[0])]

    async def cleanup(self) -> None:
        """Remove the job's directory (process 0, once all processes are done)."""
        with contextlib.suppress(NotFoundError):
            await self.client.delete(self.dir, recursive=True)

    async def run(
        self,
        fn: Callable[[Rank], Awaitable[T]],
        *,
        computation_time: float = 0.0,
        jitter: float = 0.0,
        stragglers: Mapping[int, float] | None = None,
        seed: int = 0,
        concurrency: int | None = None,
    ) -> list[RankResult[T]]:
        """Run ``fn(rank)`` for every rank of this process as asyncio tasks; their results and
        timelines, by rank. ``computation_time`` (seconds, scaled by ``1 ± jitter`` at random
        and by ``stragglers[rank]``) is what ``rank.compute()`` sleeps. ``concurrency`` caps
        the ranks doing I/O at once (``rank.io``), for bounded memory and sockets."""
        stragglers = dict(stragglers or {})
        io_gate = asyncio.Semaphore(concurrency or 1 << 30)
        ranks = [
            Rank(
                self,
                self.first_rank + i,
                i,
                computation_time * stragglers.get(self.first_rank + i, 1.0),
                jitter,
                random.Random(hash((seed, self.first_rank + i))),
                io_gate,
            )
            for i in range(self.ranks_per_process)
        ]

        async def one(r: Rank) -> RankResult[T]:
            value = await fn(r)
            return RankResult(r.rank, value, r.timeline)

        return list(await asyncio.gather(*(one(r) for r in ranks)))


@dataclass(slots=True)
class RankResult(Generic[T]):
    rank: int
    value: T
    timeline: Timeline


class Rank:
    """One simulated rank: what ``fn`` gets in ``Job.run``."""

    def __init__(
        self,
        job: Job,
        rank: int,
        local_rank: int,
        computation_time: float,
        jitter: float,
        rng: random.Random,
        io_gate: asyncio.Semaphore,
    ) -> None:
        self.job = job
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = job.world_size
        self.computation_time = computation_time
        self.jitter = jitter
        self.timeline = Timeline()
        self._rng = rng
        self._io_gate = io_gate
        self._seq = 0

    def _now(self) -> float:
        return clock.monotonic() - self.job.t0

    async def compute(self, seconds: float | None = None) -> float:
        """Emulate computing: sleep ``seconds`` (default: the job's computation time, with
        jitter and this rank's straggler factor); returns the time slept."""
        base = self.computation_time if seconds is None else seconds
        t = max(0.0, base * (1 + self._rng.uniform(-self.jitter, self.jitter)))
        start = self._now()
        await asyncio.sleep(t)
        self.timeline.add("compute", start, self._now())
        return t

    async def io(self, aw: Awaitable[T], kind: str = "io") -> T:
        """Await ``aw`` as I/O: the wait goes into the timeline as ``kind`` (``io``, or
        ``checkpoint`` for a save)."""
        start = self._now()
        async with self._io_gate:
            result = await aw
        self.timeline.add(kind, start, self._now())
        return result

    async def barrier(self) -> None:
        """Wait for every rank of the job."""
        await self.all_gather(None)

    async def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (JSON-able, small), in rank order."""
        start = self._now()
        seq, self._seq = self._seq, self._seq + 1
        result = await self.job._collective(seq, self.rank, value)
        self.timeline.add("barrier", start, self._now())
        return result


def _settle(fut: asyncio.Future[list[Any]], task: asyncio.Task[list[Any]]) -> None:
    if fut.done():
        return
    if task.cancelled():
        fut.cancel()
    elif task.exception() is not None:
        fut.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        fut.set_result(task.result())


def launch(args: Sequence[str], processes: int, *, timeout: float | None = None) -> str:
    """Run ``tectonic-emu ARGS`` as ``processes`` processes, with RANK, WORLD_SIZE and
    LOCAL_RANK set as torchrun would; wait for all; return process 0's standard output.
    Raises InvalidArgumentError with a failed process's last words."""
    env = dict(os.environ)
    procs = []
    for i in range(processes):
        env.update(RANK=str(i), WORLD_SIZE=str(processes), LOCAL_RANK=str(i))
        cmd = [sys.executable, "-m", "tectonic_emu", *args]
        procs.append(
            subprocess.Popen(cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        if p.returncode != 0:
            words = err.decode(errors="replace").strip().splitlines()[-3:]
            raise InvalidArgumentError(f"process {i} of {processes} failed: {' / '.join(words)}")
    return outs[0][0].decode()


def summarize(results: Sequence[RankResult[Any]], wall_s: float) -> dict[str, float]:
    """Totals over ranks: mean compute, I/O wait and barrier wait, and accelerator
    utilization (compute over wall time)."""
    n = max(1, len(results))
    compute = sum(r.timeline.compute_s for r in results) / n
    return {
        "ranks": len(results),
        "wall_s": wall_s,
        "compute_s": compute,
        "io_wait_s": sum(r.timeline.io_wait_s for r in results) / n,
        "barrier_wait_s": sum(r.timeline.barrier_wait_s for r in results) / n,
        "au": compute / wall_s if wall_s > 0 else 0.0,
    }


__all__ = [
    "JOBS",
    "Job",
    "ProcessInfo",
    "Rank",
    "RankResult",
    "RanksTimeoutError",
    "Timeline",
    "launch",
    "summarize",
]
