"""``tectonic-emu bench scale``: the same checkpoint saved and loaded by more and more ranks.

One global float32 array of ``size`` random bytes (rows of 256 columns, 1 KiB a row) is split
evenly by rows over N in-process ranks, each rank's state one ``Shard``; for every N in
``ranks`` (default 1, 16, 256, 1,024, 4,096), on one cluster, per round:

- **save**: every rank calls ``Checkpointer.save`` at once (a fresh step); timed until the
  last returns (the step is committed) and ``datapath.drain()`` has made every chunk durable.
  Retention (``keep_last=1``) runs after the timing (``wait_cleanup``);
- **load**: the page cache is dropped (when root), then every rank calls
  ``Checkpointer.load(rank, step)`` at once (its own shard back); timed until the last
  returns. The bytes are compared with those saved after the timing (``ReadBackError``);
- **save_many** and **load_many**: the same, each with one call for all the ranks
  (``Checkpointer.save_many(step, states)``, ``Checkpointer.load_many(ranks, step)``), as a
  process hosting many ranks saves and loads them (no coroutine per rank).

Each round also times the raw disk writing the same bytes (``bench.store.raw_write``:
pwrite + fdatasync), the machine's limit. One warm-up round, then ``runs`` measured rounds;
figures are medians. The issue's target: at 4,096 ranks, save and load each take at most
1.5x their time at 16 ranks (reported for a call per rank and one call alike).

JSON (``ScaleBench.to_dict()``, schema in ``SCHEMA``); seconds are wall-clock, MB is 10**6
bytes:

- ``size``: bytes of the checkpoint (``--size`` rounded down to whole 1 KiB rows);
- ``ranks``: the rank counts measured, ascending;
- ``encoding``, ``nodes``: the cluster's encoding and node count;
- ``runs``: measured rounds (after one warm-up);
- ``cold_reads``: true when every load ran after the page cache was dropped (root only);
- ``load_in_flight``: ranks loading at once, ``null`` for all of them (the default);
- ``cpu_count``: ``os.cpu_count()``;
- ``raw_write_s``, ``raw_write_mb_s``, ``raw_write_runs_s``: the raw disk writing ``size``
  bytes: median seconds, MB/s at that median, seconds per measured round;
- ``points``: one object per rank count, ascending:
  ``ranks``; ``rows_per_rank`` (the most rows a rank holds); ``save_s``, ``load_s`` (median
  seconds); ``save_mb_s``, ``load_mb_s`` (``size`` over those medians); ``save_vs_16``,
  ``load_vs_16`` (median seconds over the median at 16 ranks, ``null`` without 16 in
  ``ranks``); ``save_runs_s``, ``load_runs_s`` (seconds per measured round); and the same
  four for ``save_many`` and ``load_many``;
- ``target``: ``ranks`` (4096), ``baseline_ranks`` (16), ``max_ratio`` (1.5);
- ``target_met``: ``save``, ``load``, ``save_many`` and ``load_many``: whether ``*_vs_16`` at
  4,096 ranks is at most ``max_ratio``, ``null`` unless both 16 and 4,096 are in ``ranks``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from bench.fits import in_flight, stored_bytes
from bench.progress import Stages, Step, no_step
from bench.store import aligned_buffer, drop_caches, mb_s, raw_write
from bench.tables import beyond_raw, with_legend
from clients.checkpoint import Checkpointer, Shard
from tectonic_emu import Cluster
from tectonic_emu.coding import Encoding
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.resources import Needs, check_fits

COLUMNS = 256  # float32 columns of the global array: a row is 1 KiB
ROW_BYTES = COLUMNS * 4
BASELINE, TARGET_RANKS, MAX_RATIO = 16, 4096, 1.5
DEFAULT_RANKS = (1, 16, 256, 1024, 4096)
PHASES = ("save", "load", "save_many", "load_many")  # timed per rank count and round

State = dict[str, Shard]


class ReadBackError(RuntimeError):
    """A rank's loaded state differs from what it saved."""


@dataclass(slots=True)
class ScalePoint:
    """The figures of one rank count (see the module docstring)."""

    ranks: int
    rows_per_rank: int
    save_s: float
    save_mb_s: float
    save_vs_16: float | None
    load_s: float
    load_mb_s: float
    load_vs_16: float | None
    save_many_s: float
    save_many_mb_s: float
    save_many_vs_16: float | None
    load_many_s: float
    load_many_mb_s: float
    load_many_vs_16: float | None
    save_runs_s: list[float] = field(default_factory=list)
    load_runs_s: list[float] = field(default_factory=list)
    save_many_runs_s: list[float] = field(default_factory=list)
    load_many_runs_s: list[float] = field(default_factory=list)


@dataclass(slots=True)
class ScaleBench:
    size: int
    ranks: list[int]
    encoding: str
    nodes: int
    runs: int
    cold_reads: bool
    load_in_flight: int | None
    raw_write_s: float
    raw_write_mb_s: float
    raw_write_runs_s: list[float]
    points: list[ScalePoint]
    target: dict[str, float] = field(
        default_factory=lambda: {
            "ranks": TARGET_RANKS,
            "baseline_ranks": BASELINE,
            "max_ratio": MAX_RATIO,
        }
    )
    target_met: dict[str, bool | None] = field(default_factory=dict)
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(minimum: float = 0) -> dict[str, Any]:
    return {"type": "number", "minimum": minimum}


def _ratio() -> dict[str, Any]:
    return {"type": ["number", "null"], "minimum": 0}


def _seconds_list() -> dict[str, Any]:
    return {"type": "array", "items": _number(), "minItems": 1}


_POINT: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": [
        "ranks",
        "rows_per_rank",
        "save_s",
        "save_mb_s",
        "save_vs_16",
        "load_s",
        "load_mb_s",
        "load_vs_16",
        "save_many_s",
        "save_many_mb_s",
        "save_many_vs_16",
        "load_many_s",
        "load_many_mb_s",
        "load_many_vs_16",
        "save_runs_s",
        "load_runs_s",
        "save_many_runs_s",
        "load_many_runs_s",
    ],
    "properties": {
        "ranks": {"type": "integer", "minimum": 1},
        "rows_per_rank": {"type": "integer", "minimum": 1},
        "save_s": _number(),
        "save_mb_s": _number(),
        "save_vs_16": _ratio(),
        "load_s": _number(),
        "load_mb_s": _number(),
        "load_vs_16": _ratio(),
        "save_many_s": _number(),
        "save_many_mb_s": _number(),
        "save_many_vs_16": _ratio(),
        "load_many_s": _number(),
        "load_many_mb_s": _number(),
        "load_many_vs_16": _ratio(),
        "save_runs_s": _seconds_list(),
        "load_runs_s": _seconds_list(),
        "save_many_runs_s": _seconds_list(),
        "load_many_runs_s": _seconds_list(),
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "tectonic-emu/bench-scale/1",
    "title": "tectonic-emu bench scale --json",
    "type": "object",
    "additionalProperties": False,
    "required": [
        "size",
        "ranks",
        "encoding",
        "nodes",
        "runs",
        "cold_reads",
        "load_in_flight",
        "raw_write_s",
        "raw_write_mb_s",
        "raw_write_runs_s",
        "points",
        "target",
        "target_met",
        "cpu_count",
    ],
    "properties": {
        "size": {"type": "integer", "minimum": ROW_BYTES},
        "ranks": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
        "encoding": {"type": "string"},
        "nodes": {"type": "integer", "minimum": 1},
        "runs": {"type": "integer", "minimum": 1},
        "cold_reads": {"type": "boolean"},
        "load_in_flight": {"type": ["integer", "null"], "minimum": 1},
        "raw_write_s": _number(),
        "raw_write_mb_s": _number(),
        "raw_write_runs_s": _seconds_list(),
        "points": {"type": "array", "items": _POINT, "minItems": 1},
        "target": {
            "type": "object",
            "additionalProperties": False,
            "required": ["ranks", "baseline_ranks", "max_ratio"],
            "properties": {
                "ranks": {"type": "integer"},
                "baseline_ranks": {"type": "integer"},
                "max_ratio": {"type": "number"},
            },
        },
        "target_met": {
            "type": "object",
            "additionalProperties": False,
            "required": ["save", "load", "save_many", "load_many"],
            "properties": {
                "save": {"type": ["boolean", "null"]},
                "load": {"type": ["boolean", "null"]},
                "save_many": {"type": ["boolean", "null"]},
                "load_many": {"type": ["boolean", "null"]},
            },
        },
        "cpu_count": {"type": "integer", "minimum": 0},
    },
}


def split_states(g: np.ndarray[Any, Any], ranks: int) -> list[State]:
    """``ranks`` states, each ``{"w": Shard}`` of consecutive rows of ``g`` (views, no copy),
    split as evenly as ``numpy.array_split``."""
    base, extra = divmod(g.shape[0], ranks)
    states, lo = [], 0
    for r in range(ranks):
        hi = lo + base + (1 if r < extra else 0)
        states.append({"w": Shard(g[lo:hi], g.shape, (lo, 0))})
        lo = hi
    return states


def verify(saved: Sequence[Mapping[str, Any]], loaded: Sequence[Mapping[str, Any]]) -> None:
    """Check that every rank loaded exactly the shard it saved (place and bytes); raises
    ReadBackError naming the first rank that did not."""
    if len(saved) != len(loaded):
        raise ReadBackError(f"{len(saved)} ranks saved, {len(loaded)} loaded")
    for rank, (want, got) in enumerate(zip(saved, loaded, strict=True)):
        a, b = want["w"], got.get("w")
        if not isinstance(b, Shard):
            raise ReadBackError(f"rank {rank}: loaded no shard 'w'")
        if tuple(b.offset) != tuple(a.offset):
            raise ReadBackError(f"rank {rank}: loaded the shard at {b.offset}, not {a.offset}")
        # Compare bits, not floats: random bytes hold NaNs, and NaN != NaN.
        if a.array.shape != b.array.shape or not np.array_equal(
            a.array.view(np.uint32), np.ascontiguousarray(b.array).view(np.uint32)
        ):
            raise ReadBackError(f"rank {rank}: the loaded bytes differ from those saved")


def _check_args(size: int, ranks: Sequence[int], runs: int, load_in_flight: int | None) -> None:
    if not ranks or any(not isinstance(n, int) or n < 1 for n in ranks):
        raise InvalidArgumentError(f"ranks must be positive integers, not {list(ranks)!r}")
    if runs < 1:
        raise InvalidArgumentError(f"runs must be at least 1, not {runs}")
    if load_in_flight is not None and load_in_flight < 1:
        raise InvalidArgumentError(f"load_in_flight must be at least 1, not {load_in_flight}")
    if size // ROW_BYTES < max(ranks):
        raise InvalidArgumentError(
            f"size {size} gives {size // ROW_BYTES} rows of {ROW_BYTES} B: fewer than "
            f"{max(ranks)} ranks"
        )


def needs(size: int, ranks: Sequence[int], encoding: str) -> Needs:
    """What a run of ``size`` bytes holds at its peak (``bench.fits``). Memory: the random
    bytes (shards are views of them), and either the loaded copy of every shard or every
    rank's blocks in flight at once (at most the bytes times the overhead). Disk: with
    ``keep_last=1`` the last step stays while the next (or the raw file) is written."""
    step = stored_bytes(size, encoding, files=max(ranks))
    return Needs(
        2 * size + in_flight(encoding, writers=max(ranks), nbytes=size),
        step + max(size, step),
    )


async def _load_all(
    ckpt: Checkpointer, step: int, ranks: int, in_flight: int | None
) -> list[dict[str, Any]]:
    """Every rank's ``load`` at once (at most ``in_flight`` at a time, when given)."""
    if in_flight is None:
        return await asyncio.gather(*(ckpt.load(r, step) for r in range(ranks)))
    sem = asyncio.Semaphore(in_flight)

    async def one(rank: int) -> dict[str, Any]:
        async with sem:
            return await ckpt.load(rank, step)

    return await asyncio.gather(*(one(r) for r in range(ranks)))


def _ratio_to(values: Mapping[int, float], n: int) -> float | None:
    return round(values[n] / values[BASELINE], 3) if BASELINE in values else None


async def run_scale_bench(
    *,
    size: int,
    directory: Path,
    ranks: Sequence[int] = DEFAULT_RANKS,
    encoding: str = "rs-6-3",
    runs: int = 3,
    load_in_flight: int | None = None,
    step: Step = no_step,
) -> ScaleBench:
    """Measure save and load of ``size`` bytes by each rank count (module docstring).
    ``load_in_flight`` bounds how many ranks load at once (default: all of them).

    Raises InvalidArgumentError (bad arguments, fewer rows than ranks, more memory than is
    available), NoSpaceError (more disk than is free: both before anything is allocated),
    ReadBackError, and the store's and the Checkpointer's errors. Its temporary directory
    under ``directory`` is removed in every case."""
    _check_args(size, ranks, runs, load_in_flight)
    check_fits(size, lambda n: needs(n, ranks, encoding), directory, minimum=ROW_BYTES)
    counts = sorted(set(ranks))
    nodes = max(9, Encoding.parse(encoding).width)
    work = Path(tempfile.mkdtemp(prefix="tectonic-scale-bench-", dir=directory))
    try:
        rows = size // ROW_BYTES
        data = aligned_buffer(rows * ROW_BYTES)
        data[:] = os.urandom(len(data))
        g = np.frombuffer(data, dtype=np.float32).reshape(rows, COLUMNS)
        states = {n: split_states(g, n) for n in counts}
        root = work / "cluster"
        Cluster.create(root, nodes=nodes, encoding=encoding)
        raw_s: list[float] = []
        seconds: dict[str, dict[int, list[float]]] = {
            what: {n: [] for n in counts} for what in PHASES
        }
        cold = True
        stage = Stages(step, (runs + 1) * (1 + len(counts) * len(PHASES)))
        async with Cluster.open(root) as cluster:
            client = cluster.client()
            # One root for every N: keep_last=1 leaves one checkpoint on disk at a time.
            ckpts = {n: Checkpointer(client, "/ckpt", world_size=n, keep_last=1) for n in counts}
            at = 0
            try:
                for rnd in range(runs + 1):
                    label = "warm-up" if rnd == 0 else f"run {rnd}/{runs}"
                    stage(f"{label}: raw disk")
                    raw = await asyncio.to_thread(raw_write, work / "raw.bin", data)
                    (work / "raw.bin").unlink()
                    if rnd:
                        raw_s.append(raw)
                    for n in counts:
                        ckpt, took = ckpts[n], {}
                        for many in (False, True):  # a call per rank, then one call
                            at += 1
                            what = "save_many" if many else "save"
                            stage(f"{label}: {n} ranks {what}")
                            t0 = time.perf_counter()
                            if many:
                                await ckpt.save_many(at, dict(enumerate(states[n])))
                            else:
                                await asyncio.gather(
                                    *(ckpt.save(at, r, s) for r, s in enumerate(states[n]))
                                )
                            await cluster.datapath.drain()
                            took[what] = time.perf_counter() - t0
                            await ckpt.wait_cleanup()  # retention: in no timing
                            what = "load_many" if many else "load"
                            stage(f"{label}: {n} ranks {what}")
                            cold = await asyncio.to_thread(drop_caches) and cold
                            t0 = time.perf_counter()
                            if many:
                                loaded = await ckpt.load_many(range(n), at)
                            else:
                                loaded = await _load_all(ckpt, at, n, load_in_flight)
                            took[what] = time.perf_counter() - t0
                            verify(states[n], loaded)
                            del loaded
                        if rnd:
                            for what, secs in took.items():
                                seconds[what][n].append(round(secs, 4))
            finally:
                for ckpt in ckpts.values():
                    await ckpt.close()
        return _result(
            len(data), counts, encoding, nodes, runs, cold, load_in_flight, raw_s, seconds
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _result(
    size: int,
    counts: list[int],
    encoding: str,
    nodes: int,
    runs: int,
    cold: bool,
    load_in_flight: int | None,
    raw_s: list[float],
    seconds: dict[str, dict[int, list[float]]],
) -> ScaleBench:
    """``seconds``: per measured phase (save, load, load_many), per rank count, per round."""
    med = {what: {n: statistics.median(v) for n, v in s.items()} for what, s in seconds.items()}
    points = []
    for n in counts:
        figures: dict[str, Any] = {}
        for what in PHASES:
            figures[f"{what}_s"] = round(med[what][n], 4)
            figures[f"{what}_mb_s"] = mb_s(size, med[what][n])
            figures[f"{what}_vs_16"] = _ratio_to(med[what], n)
            figures[f"{what}_runs_s"] = seconds[what][n]
        points.append(ScalePoint(ranks=n, rows_per_rank=-(-(size // ROW_BYTES) // n), **figures))
    met: dict[str, bool | None] = dict.fromkeys(PHASES)
    at_target = next((p for p in points if p.ranks == TARGET_RANKS), None)
    if at_target is not None and at_target.save_vs_16 is not None:
        for what in met:
            ratio = getattr(at_target, f"{what}_vs_16")
            met[what] = ratio is not None and ratio <= MAX_RATIO
    raw_med = statistics.median(raw_s)
    return ScaleBench(
        size=size,
        ranks=counts,
        encoding=Encoding.parse(encoding).name,
        nodes=nodes,
        runs=runs,
        cold_reads=cold,
        load_in_flight=load_in_flight,
        raw_write_s=round(raw_med, 4),
        raw_write_mb_s=mb_s(size, raw_med),
        raw_write_runs_s=[round(s, 4) for s in raw_s],
        points=points,
        target_met=met,
    )


def _fmt_ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


CALLS = {"a call per rank": ("save", "load"), "one call": ("save_many", "load_many")}


def table(result: ScaleBench) -> Table:
    """Two rows per rank count (a call per rank, then one call for all): save and load
    seconds, MB/s and ratio to 16 ranks."""
    reads = "cold" if result.cold_reads else "warm (page cache; run as root for cold)"
    t = Table(
        title=f"bench scale: {result.size / 2**20:.0f} MiB of {result.encoding} over N ranks, "
        f"{result.runs} runs (median), loads {reads}",
        caption=f"raw disk write of the same bytes: {result.raw_write_s:.2f} s "
        f"({result.raw_write_mb_s:.0f} MB/s); target at {TARGET_RANKS} ranks: <= {MAX_RATIO}x "
        f"the time at {BASELINE}: "
        + ", ".join(f"{what} {_met(result.target_met.get(what))}" for what in PHASES),
    )
    t.add_column("ranks", justify="right")
    t.add_column("calls", no_wrap=True)
    for what in ("save", "load"):
        for col in (f"{what} s", "MB/s", "vs 16"):
            t.add_column(col, justify="right")
    for p in result.points:
        for i, (calls, phases) in enumerate(CALLS.items()):
            t.add_row(
                str(p.ranks) if i == 0 else "",
                calls,
                *(
                    cell
                    for what in phases
                    for cell in (
                        f"{getattr(p, f'{what}_s'):.3f}",
                        f"{getattr(p, f'{what}_mb_s'):.0f}",
                        _fmt_ratio(getattr(p, f"{what}_vs_16")),
                    )
                ),
                end_section=i == len(CALLS) - 1,
            )
    faster = [str(p.ranks) for p in result.points if p.save_mb_s > result.raw_write_mb_s]
    return with_legend(
        t,
        f"vs 16 = this time / the time at {BASELINE} ranks, same call (above 1: slower). A "
        "call per rank: every rank calls save (load) at once; one call: save_many "
        "(load_many) for all of them.",
        beyond_raw(
            [f"saves by {', '.join(faster)} ranks"] if faster else [],
            streams="blocks in flight, every rank's at once, each chunk a file on another "
            "node's disk",
        ),
    )


def _met(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "NOT met")


def targets(result: ScaleBench) -> list[dict[str, Any]]:
    """The issue's goal for ``bench all --report``: at most ``max_ratio`` x the time at 16."""
    at = next((p for p in result.points if p.ranks == TARGET_RANKS), None)
    goal = result.target["max_ratio"]
    return [
        {
            "name": f"{what} at {TARGET_RANKS} ranks vs 16 ranks (time)",
            "value": None if at is None else getattr(at, f"{what}_vs_16"),
            "goal": goal,
            "at_most": True,
            "met": result.target_met.get(what),
            "detail": "the same bytes, more ranks: the cost of ranks, "
            + ("one call for all of them" if what.endswith("_many") else "a call per rank"),
        }
        for what in PHASES
    ]


def plot(result: ScaleBench, directory: Path) -> list[Path]:
    """``scale-save.png`` and ``scale-load.png`` (``load`` and ``load_many``) in ``directory``:
    seconds against ranks, with the raw disk writing the same bytes as a flat line. Two
    figures, not one: when loads grow a hundredfold, a shared linear axis flattens the save
    curve. Returns the paths written."""
    from clients.plotting import lines

    xs = [p.ranks for p in result.points]
    raw = [result.raw_write_s] * len(xs)
    title = f"bench scale: {result.size / 2**20:.0f} MiB of {result.encoding}"
    median = f"{result.runs}-run median"
    figures = {
        "save": {
            f"save, a call per rank ({median})": [p.save_s for p in result.points],
            f"save_many, one call ({median})": [p.save_many_s for p in result.points],
        },
        "load": {
            f"load, a call per rank ({median})": [p.load_s for p in result.points],
            f"load_many, one call ({median})": [p.load_many_s for p in result.points],
        },
    }
    return [
        lines(
            directory / f"scale-{what}.png",
            title=f"{title}, {what}",
            x=xs,
            series={**series, "raw disk write": raw},
            xlabel="ranks",
            ylabel="seconds",
        )
        for what, series in figures.items()
    ]


__all__ = [
    "targets",
    "SCHEMA",
    "ReadBackError",
    "ScaleBench",
    "ScalePoint",
    "plot",
    "run_scale_bench",
    "split_states",
    "table",
    "verify",
]
