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

Backends (``bench/metadata_backends.py``, where each is described): ``sqlite``,
``sqlite-nosync``, ``memory``, ``postgresql`` (by default where PostgreSQL is installed or a
URL is given), ``mount`` and ``juicefs`` (opt-in, need FUSE: our mount and JuiceFS with
SQLite metadata, the same POSIX calls through each).

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

import asyncio
import functools
import os
import platform
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.metadata_backends import (
    BACKEND_FACTORIES,
    BACKENDS,
    DEFAULT_BACKENDS,
    ClientOps,
    MetaOps,
    MountOps,
    VerificationError,
    default_backends,
    postgres_backend,
)
from bench.progress import Stages, Step, no_step
from bench.targets import target
from bench.targets import targets_table as shared_targets_table
from tectonic_emu.errors import InvalidArgumentError, first_error

PHASES = ("create", "stat", "list", "delete")
LISTING = "one listing of its own directory per rank per run; list ops = names returned"
DEFAULT_FILES_TOTAL = 2048
DEFAULT_MIN_FILES = 2
SCHEMA_VERSION = 1


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
            "postgresql": functools.partial(postgres_backend, url=postgres_url),
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


def targets(result: MetadataBench) -> list[dict[str, Any]]:
    """Issue 22's goals for metadata rates, from this run (``met`` None where the run did not
    measure the backend or rank count a goal needs): SQLite stats and creates through the
    client, and the mount against JuiceFS at one rank and at the most ranks both ran."""
    rate = {(p.backend, p.ranks): p.ops_s for p in result.points}

    def ops(backend: str, ranks: int, phase: str) -> float | None:
        got = rate.get((backend, ranks))
        return None if got is None else got[phase]

    out = [
        target("client stats/s, sqlite, 1 rank", ops("sqlite", 1, "stat"), 25_000),
        target("durable creates/s, sqlite, 1 rank", ops("sqlite", 1, "create"), 2_500),
        target("creates/s, sqlite, 1,024 ranks", ops("sqlite", 1024, "create"), 10_000),
    ]
    both = sorted(r for r in result.ranks if ("mount", r) in rate and ("juicefs", r) in rate)
    for ranks in sorted({both[0], both[-1]}) if both else [1]:
        for phase in ("create", "stat"):
            mount, juicefs = ops("mount", ranks, phase), ops("juicefs", ranks, phase)
            value = None if mount is None or not juicefs else round(mount / juicefs, 3)
            out.append(
                target(
                    f"mount / JuiceFS {phase}s, {ranks} rank{'s' if ranks > 1 else ''}",
                    value,
                    2.0,
                    detail="the same phase, ranks and files, in this run",
                )
            )
    return out


def targets_table(result: MetadataBench) -> Table:
    return shared_targets_table("bench metadata: targets (issue 22)", targets(result))


def plot(result: MetadataBench, directory: Path) -> list[Path]:
    """One PNG per phase in ``directory``: rate against ranks, one line per backend."""
    from clients.plotting import lines

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
    "ClientOps",
    "MetadataBench",
    "MetadataPoint",
    "MetaOps",
    "MountOps",
    "VerificationError",
    "files_per_rank",
    "plot",
    "run_metadata_bench",
    "table",
    "targets",
    "targets_table",
]
