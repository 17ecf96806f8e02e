"""``tectonic-emu bench metadata``: mdtest-style metadata rates of many ranks at once.

For each metadata backend and each rank count R (1, 4, 16, 64, 256, 1024 by default), R ranks
run at once as asyncio tasks in this process against one client, as our simulated ranks do.
Each rank works in its own directory (mdtest ``-u``) on F files, phase by phase, with a barrier
between phases so that every phase is timed alone:

1. **create**: F empty files (``open_writer`` then ``close``: the file is made and sealed, the
   native counterpart of ``creat()`` + ``close()``);
2. **stat**: each file (checked to be an empty file);
3. **list**: one listing of the rank's directory (checked to hold exactly its F names). mdtest
   has no listing phase; this one follows IO500's ``find``: its rate counts the names returned
   per second, comparable with the per-file rates of the other phases;
4. **delete**: each file (afterwards each directory is checked to be empty).

A phase's rate is all ranks' operations over its wall time, from the barrier to the last rank
done (mdtest's rate: total items over the slowest rank's time). Making and removing the rank
directories is not timed. ``F = max(min_files_per_rank, files_total // R)``: the work of one
point stays near ``files_total`` files, so 1,024 ranks finish in seconds. After the runs of a
point, the backend's file records are counted (``files_left``, 0 when every delete landed).

Backends (``BACKEND_FACTORIES``):

- ``sqlite``: a real cluster (``Cluster.create`` + ``Cluster.open``), SQLite WAL with
  ``synchronous=FULL``: every metadata commit is durable when it returns (group commit);
- ``sqlite-nosync``: the same with the cluster's ``sync=False``: SQLite ``synchronous=NORMAL``,
  commits reach the page cache only (a machine crash may lose the last ones);
- ``memory``: the same cluster with its metadata in ``MemoryKV`` (``Cluster.open(kv=...)``):
  nothing durable, the cost of the client and the layers alone;
- ``postgresql``: a real cluster whose metadata is in PostgreSQL (``cluster create
  --metadata``), every commit durable (group commit: synchronous flushes shared). The server is
  the one at ``postgres_url`` (a fresh table in it), or else a throwaway server on loopback
  that the bench starts and removes (``bench/postgres.py``, PostgreSQL's defaults, fsync on).
  Measured by default where PostgreSQL is installed or a URL is given;
- ``mount`` (opt-in, needs FUSE): the ``sqlite`` cluster through a FUSE mount in a child
  process, with ``min(R, 32)`` threads doing ``os.open(O_CREAT)``+``close``, ``os.stat``,
  ``os.listdir`` and ``os.unlink``. The kernel caches attributes for 1 s, so a stat may not
  reach the mount.

JSON (``MetadataBench.to_dict()``, validated by ``SCHEMA``; rates in operations per second):

- ``schema_version`` (int): 1 for this layout;
- ``ranks`` (list of int), ``backends`` (list of str): what was measured, in order;
- ``files_total`` (int), ``min_files_per_rank`` (int): how F was chosen (above);
- ``runs`` (int): runs per point; rates are medians over them;
- ``listing`` (str): the listing policy, in words;
- ``durability`` (object): backend name -> what its commits survive, in words;
- ``points`` (list): one per backend x rank count, each with
  ``backend`` (str), ``ranks`` (int), ``files_per_rank`` (int, F),
  ``ops`` (object: phase -> operations done in one run, counted by the ranks; ``list``
  counts names returned), ``ops_s`` (object: phase -> median rate),
  ``seconds`` (object: phase -> each run's wall time, s), ``files_left`` (int);
- ``cpu_count`` (int), ``python`` (str), ``sqlite`` (str, ``sqlite3.sqlite_version``),
  ``platform`` (str): the machine.

Phases are always the four keys ``create``, ``stat``, ``list``, ``delete``.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import os
import platform
import shutil
import sqlite3
import stat as stat_mod
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.table import Table

from bench import postgres
from bench.progress import Stages, Step, no_step
from tectonic_emu import Client, Cluster
from tectonic_emu.errors import InvalidArgumentError, first_error
from tectonic_emu.metadata import MemoryKV

PHASES = ("create", "stat", "list", "delete")
LISTING = "one listing of its own directory per rank per run; list ops = names returned"
NODES = 3  # a cluster needs nodes; empty files never touch them
MOUNT_THREADS = 32
DEFAULT_FILES_TOTAL = 2048
DEFAULT_MIN_FILES = 2
SCHEMA_VERSION = 1
_T = TypeVar("_T")


class VerificationError(RuntimeError):
    """The backend did not do what the bench asked (a missing name, a leftover file)."""


# -- the operations, per backend -----------------------------------------------------------------
class MetaOps(abc.ABC):
    """The measured operations on one backend, plus the untimed setup around them.
    Paths are absolute in the cluster's namespace (``/mdtest/...``)."""

    durability: str

    @abc.abstractmethod
    def set_ranks(self, ranks: int) -> None:
        """Called before the runs of ``ranks`` ranks (the mount sizes its thread pool)."""

    @abc.abstractmethod
    async def mkdir(self, path: str) -> None: ...

    @abc.abstractmethod
    async def rmdir(self, path: str) -> None: ...

    @abc.abstractmethod
    async def create(self, path: str) -> None:
        """Make an empty file."""

    @abc.abstractmethod
    async def stat(self, path: str) -> None:
        """Stat ``path``; raise VerificationError unless it is an empty file."""

    @abc.abstractmethod
    async def listdir(self, path: str) -> list[str]: ...

    @abc.abstractmethod
    async def delete(self, path: str) -> None: ...

    @abc.abstractmethod
    async def files_left(self) -> int:
        """File records in the cluster, named or not (0 once everything is deleted)."""


class ClientOps(MetaOps):
    """The native async client."""

    def __init__(self, client: Client, durability: str) -> None:
        self.client = client
        self.durability = durability

    def set_ranks(self, ranks: int) -> None:
        pass  # ranks are tasks on this event loop: nothing to size

    async def mkdir(self, path: str) -> None:
        await self.client.mkdir(path)

    async def rmdir(self, path: str) -> None:
        await self.client.delete(path)

    async def create(self, path: str) -> None:
        writer = await self.client.open_writer(path)
        await writer.close()

    async def stat(self, path: str) -> None:
        st = await self.client.stat(path)
        if st.kind != "file" or st.size != 0:
            raise VerificationError(f"{path}: not an empty file ({st.kind}, {st.size} B)")

    async def listdir(self, path: str) -> list[str]:
        return await self.client.listdir(path)

    async def delete(self, path: str) -> None:
        await self.client.delete(path)

    async def files_left(self) -> int:
        return sum([1 async for _ in self.client.meta.iter_files()])


class MountOps(MetaOps):
    """POSIX calls through a FUSE mount, on a pool of ``min(ranks, 32)`` threads; the
    cluster's own client (opened beside the mount) only counts what is left."""

    durability = "the sqlite cluster through FUSE (kernel attribute cache 1 s)"

    def __init__(self, mountpoint: Path, client: Client) -> None:
        self.mountpoint = mountpoint
        self.client = client
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mdtest-mount")

    def set_ranks(self, ranks: int) -> None:
        self.pool.shutdown()
        self.pool = ThreadPoolExecutor(min(ranks, MOUNT_THREADS), thread_name_prefix="mdtest")

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _local(self, path: str) -> str:
        return str(self.mountpoint) + path

    async def mkdir(self, path: str) -> None:
        await self._call(os.mkdir, self._local(path))

    async def rmdir(self, path: str) -> None:
        await self._call(os.rmdir, self._local(path))

    async def create(self, path: str) -> None:
        await self._call(_create_empty, self._local(path))

    async def stat(self, path: str) -> None:
        st = await self._call(os.stat, self._local(path))
        if not stat_mod.S_ISREG(st.st_mode) or st.st_size != 0:
            raise VerificationError(f"{path}: not an empty file (mode {st.st_mode:o})")

    async def listdir(self, path: str) -> list[str]:
        return await self._call(os.listdir, self._local(path))

    async def delete(self, path: str) -> None:
        await self._call(os.unlink, self._local(path))

    async def files_left(self) -> int:
        return sum([1 async for _ in self.client.meta.iter_files()])


def _create_empty(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


# -- backends: name -> factory of MetaOps in a fresh directory ---------------------------------
BackendFactory = Callable[[Path], AbstractAsyncContextManager[MetaOps]]


@asynccontextmanager
async def _sqlite_backend(work: Path, *, sync: bool) -> AsyncIterator[MetaOps]:
    root = work / "cluster"
    Cluster.create(root, nodes=NODES, encoding="r1", sync=sync)
    durability = (
        "SQLite WAL, synchronous=FULL: every commit durable (group commit: fsyncs shared)"
        if sync
        else "SQLite WAL, synchronous=NORMAL: commits in the page cache only"
    )
    async with Cluster.open(root) as cluster:
        yield ClientOps(cluster.client(), durability)


@asynccontextmanager
async def _memory_backend(work: Path) -> AsyncIterator[MetaOps]:
    # The same cluster with its metadata in MemoryKV: what the layers above the seam cost.
    root = work / "cluster"
    Cluster.create(root, nodes=NODES, encoding="r1", sync=False)
    async with Cluster.open(root, kv=MemoryKV()) as cluster:
        yield ClientOps(cluster.client(), "MemoryKV: nothing durable")


@asynccontextmanager
async def _mount_backend(work: Path) -> AsyncIterator[MetaOps]:
    from fuse_mount.mount import start_mount, unmount

    root, mnt = work / "cluster", work / "mnt"
    Cluster.create(root, nodes=NODES, encoding="r1")
    mnt.mkdir()
    proc = await asyncio.to_thread(start_mount, root, mnt, log=work / "mount.log")
    try:
        async with Cluster.open(root) as cluster:
            ops = MountOps(mnt, cluster.client())
            try:
                yield ops
            finally:
                ops.pool.shutdown()
    finally:
        await asyncio.to_thread(unmount, mnt)
        await asyncio.to_thread(proc.wait, 30)


@asynccontextmanager
async def _postgres_backend(work: Path, url: str | None = None) -> AsyncIterator[MetaOps]:
    server = None
    if url is None:
        found = postgres.bin_dir()
        if found is None:
            raise InvalidArgumentError(
                "no PostgreSQL server here to start (apt-get install postgresql), and no "
                "--postgres URL given"
            )
        server = await asyncio.to_thread(postgres.PostgresServer(found).start)
        url = server.url
    try:
        root = work / "cluster"
        table = f"bench_{os.getpid()}_{int(time.time() * 1000)}"
        await asyncio.to_thread(
            Cluster.create, root, nodes=NODES, encoding="r1", metadata=url, metadata_table=table
        )
        durability = (
            "PostgreSQL, synchronous_commit: every commit durable (group commit: flushes "
            f"shared){'; a throwaway server on loopback' if server else ''}"
        )
        async with Cluster.open(root) as cluster:
            yield ClientOps(cluster.client(), durability)
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)


BACKEND_FACTORIES: dict[str, BackendFactory] = {
    "sqlite": lambda work: _sqlite_backend(work, sync=True),
    "sqlite-nosync": lambda work: _sqlite_backend(work, sync=False),
    "memory": _memory_backend,
    "postgresql": _postgres_backend,
    "mount": _mount_backend,
}
BACKENDS: tuple[str, ...] = tuple(BACKEND_FACTORIES)
DEFAULT_BACKENDS = ("sqlite", "sqlite-nosync", "memory")  # mount needs FUSE: opt-in


def default_backends() -> tuple[str, ...]:
    """DEFAULT_BACKENDS, and ``postgresql`` where its server is installed."""
    return DEFAULT_BACKENDS + (("postgresql",) if postgres.bin_dir() is not None else ())


# -- results -------------------------------------------------------------------------------------
@dataclass(slots=True)
class MetadataPoint:
    backend: str
    ranks: int
    files_per_rank: int
    ops: dict[str, int]
    ops_s: dict[str, float]
    seconds: dict[str, list[float]]
    files_left: int


@dataclass(slots=True)
class MetadataBench:
    ranks: list[int]
    backends: list[str]
    files_total: int
    min_files_per_rank: int
    runs: int
    durability: dict[str, str]
    points: list[MetadataPoint]
    listing: str = LISTING
    schema_version: int = SCHEMA_VERSION
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)
    python: str = field(default_factory=platform.python_version)
    sqlite: str = sqlite3.sqlite_version
    platform: str = field(default_factory=platform.platform)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _phase_map(value: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict.fromkeys(PHASES, value),
        "required": list(PHASES),
        "additionalProperties": False,
    }


_POINT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "backend": {"type": "string"},
        "ranks": {"type": "integer", "minimum": 1},
        "files_per_rank": {"type": "integer", "minimum": 1},
        "ops": _phase_map({"type": "integer", "minimum": 0}),
        "ops_s": _phase_map({"type": "number", "minimum": 0}),
        "seconds": _phase_map(
            {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1}
        ),
        "files_left": {"type": "integer", "minimum": 0},
    },
    "required": ["backend", "ranks", "files_per_rank", "ops", "ops_s", "seconds", "files_left"],
    "additionalProperties": False,
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "tectonic-emu/bench-metadata/1",
    "title": "tectonic-emu bench metadata --json",
    "type": "object",
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "ranks": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
        "backends": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "files_total": {"type": "integer", "minimum": 1},
        "min_files_per_rank": {"type": "integer", "minimum": 1},
        "runs": {"type": "integer", "minimum": 1},
        "listing": {"type": "string"},
        "durability": {"type": "object", "additionalProperties": {"type": "string"}},
        "points": {"type": "array", "items": _POINT_SCHEMA},
        "cpu_count": {"type": "integer", "minimum": 0},
        "python": {"type": "string"},
        "sqlite": {"type": "string"},
        "platform": {"type": "string"},
    },
    "additionalProperties": False,
}
SCHEMA["required"] = list(SCHEMA["properties"])  # every key, always


# -- the run -------------------------------------------------------------------------------------
def files_per_rank(files_total: int, ranks: int, min_files: int = DEFAULT_MIN_FILES) -> int:
    """F: ``files_total`` split over the ranks, at least ``min_files`` each."""
    return max(min_files, files_total // ranks)


async def _phase(work: list[Coroutine[Any, Any, int]]) -> tuple[int, float]:
    """Start every rank's part at once; (operations done, seconds until the last is done)."""
    t0 = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(w) for w in work]
    except BaseExceptionGroup as eg:
        raise first_error(eg) from None
    return sum(t.result() for t in tasks), time.perf_counter() - t0


async def _create(ops: MetaOps, d: str, names: list[str]) -> int:
    for name in names:
        await ops.create(f"{d}/{name}")
    return len(names)


async def _stat(ops: MetaOps, d: str, names: list[str]) -> int:
    for name in names:
        await ops.stat(f"{d}/{name}")
    return len(names)


async def _list(ops: MetaOps, d: str, names: list[str]) -> int:
    got = await ops.listdir(d)
    if sorted(got) != names:
        raise VerificationError(f"{d}: listed {len(got)} names, expected {len(names)}")
    return len(got)


async def _delete(ops: MetaOps, d: str, names: list[str]) -> int:
    for name in names:
        await ops.delete(f"{d}/{name}")
    return len(names)


async def _remove_dir(ops: MetaOps, d: str, _names: list[str]) -> int:
    left = await ops.listdir(d)
    if left:
        raise VerificationError(f"{d}: {len(left)} names left after delete")
    await ops.rmdir(d)
    return 0


async def _mkdir(ops: MetaOps, d: str, _names: list[str]) -> int:
    await ops.mkdir(d)
    return 0


_RankFn = Callable[[MetaOps, str, list[str]], Coroutine[Any, Any, int]]
_PHASE_FNS: dict[str, _RankFn] = {
    "create": _create,
    "stat": _stat,
    "list": _list,
    "delete": _delete,
}


async def _one_run(
    ops: MetaOps, base: str, ranks: int, files: int, step: Callable[[str], None], label: str
) -> dict[str, tuple[int, float]]:
    """One mdtest run in directory ``base``: {phase: (operations, seconds)}. Calls
    ``step(f"{label}: {phase}")`` as each phase starts."""
    dirs = [f"{base}/rank{r:04d}" for r in range(ranks)]
    names = [sorted(f"file.mdtest.{r}.{i}" for i in range(files)) for r in range(ranks)]

    def every_rank(fn: _RankFn) -> list[Coroutine[Any, Any, int]]:
        return [fn(ops, d, n) for d, n in zip(dirs, names, strict=True)]

    await ops.mkdir(base)
    await _phase(every_rank(_mkdir))  # mdtest's tree creation: not timed
    out = {}
    for phase, fn in _PHASE_FNS.items():
        step(f"{label}: {phase}")
        out[phase] = await _phase(every_rank(fn))
        if out[phase][0] != ranks * files:
            raise VerificationError(f"{phase}: {out[phase][0]} operations, not {ranks * files}")
    await _phase(every_rank(_remove_dir))  # checks each directory is empty; not timed
    await ops.rmdir(base)
    return out


async def run_metadata_bench(
    *,
    directory: Path,
    ranks: Sequence[int] = (1, 4, 16, 64, 256, 1024),
    backends: Sequence[str] | None = None,
    files_total: int = DEFAULT_FILES_TOTAL,
    min_files_per_rank: int = DEFAULT_MIN_FILES,
    runs: int = 1,
    postgres_url: str | None = None,
    step: Step = no_step,
) -> MetadataBench:
    """Measure every backend at every rank count (see the module docstring). ``postgres_url``:
    the server for ``postgresql`` (default: a throwaway one the bench starts). ``backends``
    defaults to ``default_backends()``.

    Raises InvalidArgumentError (an unknown backend, a count below 1), VerificationError
    (a backend lost or kept a name), and the backend's own errors. The work directory under
    ``directory`` is removed in every case; a mount is unmounted.
    """
    backends = default_backends() if backends is None else backends
    unknown = [b for b in backends if b not in BACKEND_FACTORIES]
    if unknown:
        raise InvalidArgumentError(f"unknown backend(s) {', '.join(unknown)}; known: {BACKENDS}")
    if not ranks or min(ranks) < 1 or files_total < 1 or min_files_per_rank < 1 or runs < 1:
        raise InvalidArgumentError("ranks, files_total, min_files_per_rank and runs must be >= 1")
    work = Path(tempfile.mkdtemp(prefix="tectonic-metadata-bench-", dir=directory))
    points: list[MetadataPoint] = []
    durability: dict[str, str] = {}
    try:
        # This run's server for the postgresql backend (default: one the bench starts).
        factories = {
            **BACKEND_FACTORIES,
            "postgresql": functools.partial(_postgres_backend, url=postgres_url),
        }
        stage = Stages(step, len(backends) * len(ranks) * runs * len(PHASES))
        for backend in backends:
            (work / backend).mkdir()
            step(f"{backend}: starting")
            async with factories[backend](work / backend) as ops:
                durability[backend] = ops.durability
                await ops.mkdir("/mdtest")
                for r in ranks:
                    f = files_per_rank(files_total, r, min_files_per_rank)
                    ops.set_ranks(r)
                    done: list[dict[str, tuple[int, float]]] = []
                    for k in range(runs):
                        label = f"{backend}: {r} ranks x {f} files, run {k + 1}/{runs}"
                        base = f"/mdtest/{r}ranks.{k}"
                        done.append(await _one_run(ops, base, r, f, stage, label))
                    points.append(_point(backend, r, f, done, await ops.files_left()))
                await ops.rmdir("/mdtest")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return MetadataBench(
        list(ranks),
        list(backends),
        files_total,
        min_files_per_rank,
        runs,
        durability,
        points,
    )


def _point(
    backend: str, ranks: int, files: int, done: list[dict[str, tuple[int, float]]], left: int
) -> MetadataPoint:
    return MetadataPoint(
        backend,
        ranks,
        files,
        ops={p: done[-1][p][0] for p in PHASES},
        ops_s={
            p: round(statistics.median(n / s for n, s in (d[p] for d in done)), 1) for p in PHASES
        },
        seconds={p: [round(d[p][1], 6) for d in done] for p in PHASES},
        files_left=left,
    )


# -- output --------------------------------------------------------------------------------------
def table(result: MetadataBench) -> Table:
    """One row per backend x rank count: the median rate of each phase."""
    t = Table(
        title=f"bench metadata: about {result.files_total} files per point, "
        f"{result.runs} run(s) (median), ops/s (list: names/s)",
        caption="; ".join(f"{b}: {d}" for b, d in result.durability.items()),
    )
    for col in ("backend", "ranks", "files/rank", *PHASES):
        t.add_column(col, justify="right")
    for p in result.points:
        t.add_row(
            p.backend,
            str(p.ranks),
            str(p.files_per_rank),
            *(f"{p.ops_s[ph]:,.0f}" for ph in PHASES),
        )
    return t


def plot(result: MetadataBench, directory: Path) -> list[Path]:
    """One PNG per phase in ``directory``: rate against ranks, one line per backend."""
    from bench.plotting import lines

    out = []
    for phase in PHASES:
        rate = {(p.backend, p.ranks): p.ops_s[phase] for p in result.points}
        series = {b: [rate[b, r] for r in result.ranks] for b in result.backends}
        out.append(
            lines(
                directory / f"metadata-{phase}.png",
                title=f"bench metadata: {phase}",
                x=result.ranks,
                series=series,
                xlabel="ranks",
                ylabel="names listed/s" if phase == "list" else f"{phase} ops/s",
                logy=True,  # backends differ by 10-100x
            )
        )
    return out


__all__ = [
    "BACKENDS",
    "BACKEND_FACTORIES",
    "DEFAULT_BACKENDS",
    "SCHEMA",
    "MetadataBench",
    "MetadataPoint",
    "VerificationError",
    "files_per_rank",
    "plot",
    "run_metadata_bench",
    "table",
]
