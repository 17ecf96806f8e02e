"""``tectonic-emu bench random``: small random reads, a data loader's access pattern (issue 22).

One file of ``size`` random bytes (256 MiB by default) is written once to each place below.
Then requests of each size (4 KiB and 128 KiB by default) read it at offsets drawn uniformly
from the multiples of the request size, all different where the file has enough (the same
offsets for every path in a round), one request at a time, through:

- **native client**: ``FileReader.read_into(offset, buf)`` of the file opened once
  (``Client.reader``, as the mount's descriptor), against a fresh embedded cluster (rs-6-3
  by default), its nodes in this process;
- **mount**: ``os.preadv`` on a descriptor of the file in a ``tectonic-emu mount`` of the same
  cluster (a child process); skipped, with the reason, where FUSE is not available;
- **local O_DIRECT**, **local cold**, **local page cache**: ``os.preadv`` on a plain file in the
  same directory tree, opened with ``O_DIRECT``, after dropping the page cache, and after
  reading the whole file once;
- **JuiceFS**: ``os.preadv`` in a JuiceFS mount with SQLite metadata and local-directory
  objects (``bench/peers.py``; no local block cache), when ``juicefs`` is installed.

The page cache is dropped (as root) before the native client, the mount, local cold and
JuiceFS read, for each request size; their processes' own caches stay (the mount's segments,
JuiceFS's read buffers), as they would in a long-running loader. Each round runs every path
once, in the order above, after one warm-up round of a tenth of the requests; figures are the
min, median and max over rounds, and ratios are taken round by round, then the median.

**Read amplification** is the growth of ``rchar`` in ``/proc/<pid>/io`` of the processes that
read the data's files, over the bytes asked: this process for the native client (its nodes are
embedded: the chunk files are read by its threads) and for local files, the mount's process
(and any child) for the mount, the ``juicefs`` processes of the run for JuiceFS. ``rchar``
counts every byte a ``read``-family call returned, cached or not: chunk and object files (with
their headers), SQLite's reads of its database and WAL, FUSE requests read from
``/dev/fuse``, and the few hundred bytes of reading ``/proc/<pid>/io`` itself. For local
files it is 1 by construction. ``read_bytes``, reported beside it, is what those processes
made the block layer fetch from the disk: 0 for cached reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import statistics
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.fits import in_flight, stored_bytes
from bench.progress import Stages, Step, no_step
from bench.random_paths import (
    Pids,
    Sample,
    check_last,
    processes_of,
    read_file,
    read_native,
    this_process,
    warm,
    with_descendants,
)
from bench.schema import schema_of
from bench.store import aligned_buffer, drop_caches, size_text, write_durably
from bench.tables import with_legend
from bench.targets import figure, target
from bench.targets import targets_table as shared_targets_table
from tectonic_emu import Cluster
from tectonic_emu.coding import Encoding
from tectonic_emu.errors import InvalidArgumentError, NotFoundError
from tectonic_emu.resources import Needs, check_fits

KiB = 1 << 10
MiB = 1 << 20
DEFAULT_SIZE = 256 * MiB
DEFAULT_REQUESTS = 1000
DEFAULT_SIZES = (4 * KiB, 128 * KiB)
ALIGN = 4 * KiB  # O_DIRECT's alignment on this machine's file systems
FILE = "random.bin"
PATHS = {  # key -> label, in the order each round runs them
    "local-direct": "local O_DIRECT",
    "local-cold": "local cold",
    "local-cached": "local page cache",
    "native": "native client",
    "mount": "mount",
    "juicefs": "JuiceFS",
}
COLD = frozenset({"local-cold", "native", "mount", "juicefs"})  # page cache dropped before
COUNTED = {
    "local-direct": "this process",
    "local-cold": "this process",
    "local-cached": "this process",
    "native": "this process (the client and its embedded nodes)",
    "mount": "the mount process and its children",
    "juicefs": "the juicefs processes of the run",
}
RATIOS = (  # name, numerator path, denominator path
    ("native / local O_DIRECT", "native", "local-direct"),
    ("mount / native", "mount", "native"),
    ("native / JuiceFS", "native", "juicefs"),
    ("mount / JuiceFS", "mount", "juicefs"),
)


@dataclass(slots=True)
class PathFigures:
    """One path at one request size, over the measured rounds."""

    path: str  # a key of PATHS
    request: int  # bytes per request
    ops_s: list[float]  # each round's requests per second
    ops_s_min: float
    ops_s_median: float
    ops_s_max: float
    amplification: list[float | None]  # each round's rchar / bytes asked
    amplification_median: float | None  # None: the counters were unreadable
    disk_amplification_median: float | None  # read_bytes / bytes asked
    counted: str  # whose /proc/<pid>/io counters


@dataclass(slots=True)
class Ratio:
    """``numerator``'s ops/s over ``denominator``'s, round by round."""

    name: str
    request: int
    numerator: str
    denominator: str
    rounds: list[float]
    median: float
    min: float
    max: float


@dataclass(slots=True)
class RandomBench:
    size: int
    requests: int
    request_sizes: list[int]
    rounds: int
    encoding: str
    cold_reads: bool  # the page cache was dropped before the cold paths (root)
    load_before: list[float]  # os.getloadavg(): 1, 5 and 15 minutes
    load_after: list[float]
    paths: list[str]  # measured, in order
    skipped: dict[str, str]  # path -> why it was not measured
    figures: list[PathFigures]
    ratios: list[Ratio]
    schema: str = "tectonic-emu/bench-random/1"
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def figure(self, path: str, request: int) -> PathFigures | None:
        return next((f for f in self.figures if (f.path, f.request) == (path, request)), None)

    def ratio(self, name: str, request: int) -> Ratio | None:
        return next((r for r in self.ratios if (r.name, r.request) == (name, request)), None)


def needs(size: int, encoding: str) -> Needs:
    """Memory: the file's bytes, the writer's blocks in flight, and blocks read at once in
    this process and in the mount's. Disk: the cluster's copy, the local file and JuiceFS's."""
    return Needs(
        size + 2 * in_flight(encoding, nbytes=size), stored_bytes(size, encoding) + 2 * size
    )


def check_arguments(size: int, requests: int, request_sizes: Sequence[int], rounds: int) -> None:
    """Raise InvalidArgumentError for counts below 1 and for request sizes that are not
    multiples of 4 KiB (O_DIRECT's alignment) or do not fit in the file."""
    if requests < 1 or rounds < 1 or not request_sizes:
        raise InvalidArgumentError("--requests, --rounds and --sizes need at least 1")
    for r in request_sizes:
        if r < ALIGN or r % ALIGN:
            raise InvalidArgumentError(f"--sizes: {r} bytes is not a multiple of 4 KiB")
        if r > size:
            raise InvalidArgumentError(f"--sizes: {size_text(r)} is larger than --size")


def offsets(size: int, request: int, count: int, seed: int) -> list[int]:
    """``count`` offsets drawn uniformly from the multiples of ``request`` that leave a
    whole request inside ``size`` bytes; all different while the file has that many, so
    that no request is served by a cache that an earlier one in the round filled."""
    rng = random.Random(seed)
    slots = size // request
    if count <= slots:
        return [k * request for k in rng.sample(range(slots), count)]
    return [rng.randrange(slots) * request for _ in range(count)]


def fuse_missing() -> str | None:
    """None where a mount can be made here, else why not (one line)."""
    from fuse_mount.mount import check_fuse

    try:
        check_fuse()
    except NotFoundError as e:
        return str(e)
    return None


Reader = Callable[[list[int], memoryview], Awaitable[Sample]]


def _file_reader(path: Path, pids: Pids, *, direct: bool = False) -> Reader:
    async def read(offs: list[int], buf: memoryview) -> Sample:
        return await asyncio.to_thread(read_file, path, offs, buf, pids, direct=direct)

    return read


async def _start_mount(stack: contextlib.AsyncExitStack, root: Path, work: Path) -> Reader:
    from fuse_mount.mount import start_mount, unmount

    mnt = work / "mnt"
    mnt.mkdir()
    proc = await asyncio.to_thread(start_mount, root, mnt, log=work / "mount.log")

    async def stop() -> None:
        await asyncio.to_thread(unmount, mnt)
        await asyncio.to_thread(proc.wait, 30)

    stack.push_async_callback(stop)
    return _file_reader(mnt / FILE, lambda: with_descendants(proc.pid))


async def _start_juicefs(stack: contextlib.AsyncExitStack, work: Path, data: memoryview) -> Reader:
    from bench import peers

    where = work / "juicefs"
    mnt = await asyncio.to_thread(stack.enter_context, peers.mounted("juicefs", where))
    await asyncio.to_thread(write_durably, mnt / FILE, data)
    daemons = processes_of("juicefs", f"{where}/")

    def pids() -> list[int]:
        return sorted({p for d in daemons for p in with_descendants(d)})

    return _file_reader(mnt / FILE, pids)


async def run_random_bench(
    *,
    directory: Path,
    size: int = DEFAULT_SIZE,
    requests: int = DEFAULT_REQUESTS,
    request_sizes: Sequence[int] = DEFAULT_SIZES,
    rounds: int = 3,
    encoding: str = "rs-6-3",
    mount: bool = True,
    juicefs: bool | None = None,
    seed: int = 0,
    step: Step = no_step,
) -> RandomBench:
    """Measure every path (module docstring). ``mount=False`` leaves the mount out;
    ``juicefs``: None runs JuiceFS where it is installed, False never, True fails without it.

    Raises InvalidArgumentError for bad counts or sizes, InvalidArgumentError or NoSpaceError
    for a ``size`` that does not fit (before anything is made), ReadBackError when a path
    returns other bytes than the file's, and what setting up a path raises (a mount's
    TectonicError, ``peers.PeerError``). The work directory is removed in every case and
    every mount is unmounted."""
    check_arguments(size, requests, request_sizes, rounds)
    check_fits(size, lambda n: needs(n, encoding), directory)
    load_before = list(os.getloadavg())
    made = tempfile.mkdtemp(prefix="tectonic-random-bench-", dir=directory)
    work = await asyncio.to_thread(Path(made).resolve)  # peers match their daemons by it
    skipped: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)  # last, after the unmounts
        step("writing the file")
        data = aligned_buffer(size)
        data[:] = os.urandom(size)
        root = work / "cluster"
        Cluster.create(root, nodes=max(9, Encoding.parse(encoding).width), encoding=encoding)
        cluster = await stack.enter_async_context(Cluster.open(root))
        client = cluster.client()
        async with client.open_writer(f"/{FILE}") as writer:
            for off in range(0, size, 8 * MiB):
                await writer.append(data[off : off + 8 * MiB])
        await cluster.datapath.drain()
        local = work / "local.bin"
        await asyncio.to_thread(write_durably, local, data)

        async def native(offs: list[int], buf: memoryview) -> Sample:
            return await read_native(client, f"/{FILE}", offs, buf, this_process)

        readers: dict[str, Reader] = {
            "local-direct": _file_reader(local, this_process, direct=True),
            "local-cold": _file_reader(local, this_process),
            "local-cached": _file_reader(local, this_process),
            "native": native,
        }
        why_not = "left out (--no-mount)" if not mount else fuse_missing()
        if why_not is None:
            step("mounting")
            readers["mount"] = await _start_mount(stack, root, work)
        else:
            skipped["mount"] = why_not
        why_not = await asyncio.to_thread(_juicefs_missing, juicefs)
        if why_not is None:
            step("setting up JuiceFS")
            readers["juicefs"] = await _start_juicefs(stack, work, data)
        else:
            skipped["juicefs"] = why_not
        order = [p for p in PATHS if p in readers]
        samples, cold = await _rounds(
            readers, order, data, local, requests, request_sizes, rounds, seed, step
        )
    figures = [_figures(p, r, samples[p, r]) for r in request_sizes for p in order]
    return RandomBench(
        size,
        requests,
        list(request_sizes),
        rounds,
        encoding,
        cold,
        load_before,
        list(os.getloadavg()),
        order,
        skipped,
        figures,
        _ratios(samples, request_sizes),
    )


def _juicefs_missing(wanted: bool | None) -> str | None:
    from bench import peers

    if wanted is False:
        return "left out (--no-juicefs; in bench all, --quick or --peers without it)"
    reason = peers.missing("juicefs")
    if reason is not None and wanted:
        raise peers.PeerError(f"juicefs: {reason}")
    return reason


async def _rounds(
    readers: dict[str, Reader],
    order: list[str],
    data: memoryview,
    local: Path,
    requests: int,
    request_sizes: Sequence[int],
    rounds: int,
    seed: int,
    step: Step,
) -> tuple[dict[tuple[str, int], list[Sample]], bool]:
    """A warm-up round (a tenth of the requests) and ``rounds`` measured ones: each request
    size, each path in ``order``. Returns the measured samples and whether the page cache
    could be dropped."""
    samples: dict[tuple[str, int], list[Sample]] = {
        (p, r): [] for p in order for r in request_sizes
    }
    bufs = {r: aligned_buffer(r) for r in request_sizes}
    stage = Stages(step, (rounds + 1) * len(order) * len(request_sizes))
    cold = True
    for rnd in range(rounds + 1):
        label = "warm-up" if rnd == 0 else f"round {rnd}/{rounds}"
        count = max(1, requests // 10) if rnd == 0 else requests
        for req in request_sizes:
            offs = offsets(len(data), req, count, seed * 1_000_003 + rnd * 1009 + req)
            for path in order:
                stage(f"{label}: {size_text(req)} through {PATHS[path]}")
                if path in COLD:
                    cold = await asyncio.to_thread(drop_caches) and cold
                elif path == "local-cached":
                    await asyncio.to_thread(warm, local)
                sample = await readers[path](offs, bufs[req])
                check_last(PATHS[path], bufs[req], data, offs)
                if rnd:
                    samples[path, req].append(sample)
    return samples, cold


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def _figures(path: str, request: int, samples: list[Sample]) -> PathFigures:
    ops = [round(s.ops_s, 1) for s in samples]
    amps = [s.amplification() for s in samples]
    return PathFigures(
        path,
        request,
        ops,
        min(ops),
        round(statistics.median(ops), 1),
        max(ops),
        [None if a is None else round(a, 4) for a, _ in amps],
        _median([a for a, _ in amps]),
        _median([d for _, d in amps]),
        COUNTED[path],
    )


def _ratios(samples: dict[tuple[str, int], list[Sample]], sizes: Sequence[int]) -> list[Ratio]:
    out = []
    for req in sizes:
        for name, num, den in RATIOS:
            if (num, req) not in samples or (den, req) not in samples:
                continue
            per = [
                round(a.ops_s / b.ops_s, 4)
                for a, b in zip(samples[num, req], samples[den, req], strict=True)
            ]
            out.append(Ratio(name, req, num, den, per, statistics.median(per), min(per), max(per)))
    return out


# -- output ------------------------------------------------------------------------------------
def _rate(x: float) -> str:
    """``286`` -> ``'286'``, ``38120`` -> ``'38.1k'``, ``322000`` -> ``'322k'``."""
    if x >= 100_000:
        return f"{x / 1e3:.0f}k"
    if x >= 10_000:
        return f"{x / 1e3:.1f}k"
    return f"{x:,.0f}"


def _load(res: RandomBench) -> str:
    return f"load average {res.load_before[0]:.2f} before, {res.load_after[0]:.2f} after"


def table(res: RandomBench) -> list[Table]:
    """Per path and request size: ops/s over rounds and the read amplification; then the
    ratios of the same rounds."""
    t = Table(
        title=f"bench random: {size_text(res.size)} file ({res.encoding}), "
        f"{res.requests:,} reads x {res.rounds} round{'' if res.rounds == 1 else 's'}"
    )
    for col in ("path", "request", "ops/s min/med/max", "read/asked", "disk/asked"):
        t.add_column(col, justify="right")
    for f in res.figures:
        t.add_row(
            PATHS[f.path],
            size_text(f.request),
            "/".join(_rate(x) for x in (f.ops_s_min, f.ops_s_median, f.ops_s_max)),
            figure(f.amplification_median),
            figure(f.disk_amplification_median),
        )
    skipped = "; ".join(f"{PATHS[p]} not measured: {why}" for p, why in res.skipped.items())
    tables = [
        with_legend(
            t,
            "read/asked = bytes the reading processes' read calls returned (rchar: chunk "
            "files, SQLite, FUSE requests) over bytes asked; disk/asked = bytes they fetched "
            "from the disk (read_bytes). Medians over rounds.",
            "Page cache dropped before the cold paths."
            if res.cold_reads
            else "Page cache NOT dropped (not root): every read was warm.",
            f"{_load(res)} (1 min; {res.cpu_count} CPUs).",
            skipped or None,
        )
    ]
    if res.ratios:
        r = Table(title="bench random: ratios of ops/s in the same rounds")
        r.add_column("ratio", justify="right")
        for req in res.request_sizes:
            r.add_column(size_text(req), justify="right")
        for name, _, _ in RATIOS:
            cells = [res.ratio(name, req) for req in res.request_sizes]
            if any(c is not None for c in cells):
                r.add_row(name, *("-" if c is None else _ratio_text(c) for c in cells))
        tables.append(with_legend(r, "Each cell: median (min-max) of the rounds' ratios."))
    return tables


def _ratio_text(r: Ratio) -> str:
    return f"{r.median:.3g} ({r.min:.3g}-{r.max:.3g})"


def targets(res: RandomBench) -> list[dict[str, Any]]:
    """Issue 22's goals for random reads, from this run; ``met`` is None where a path or a
    request size they need was not measured."""

    def ops(path: str) -> float | None:
        f = res.figure(path, 4 * KiB)
        return None if f is None else f.ops_s_median

    ratio = res.ratio("native / local O_DIRECT", 4 * KiB)
    out = [
        target("native 4 KiB random reads/s", ops("native"), 8000, detail="median of the rounds"),
        target(
            "native / local O_DIRECT, 4 KiB",
            None if ratio is None else ratio.median,
            0.5,
            detail="round by round, median",
        ),
        target("mount 4 KiB random reads/s", ops("mount"), 2000, detail="median of the rounds"),
    ]
    for req in (r for r in res.request_sizes if r >= 64 * KiB):
        for path in ("native", "mount"):
            f = res.figure(path, req)
            out.append(
                target(
                    f"{PATHS[path]} read amplification, {size_text(req)}",
                    None if f is None else f.amplification_median,
                    1.2,
                    at_most=True,
                    detail="rchar / bytes asked",
                )
            )
    return out


def targets_table(res: RandomBench) -> Table:
    return shared_targets_table("bench random: targets (issue 22)", targets(res))


def plot(res: RandomBench, directory: Path) -> list[Path]:
    """``random-reads.png``: median ops/s of each path per request size, log scale (the
    paths differ by up to 10,000x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(res.request_sizes))
    for i, req in enumerate(res.request_sizes):
        heights = [getattr(res.figure(p, req), "ops_s_median", 0.0) for p in res.paths]
        xs = [k + (i - (len(res.request_sizes) - 1) / 2) * width for k in range(len(res.paths))]
        ax.bar(xs, heights, width, label=size_text(req))
    ax.set_xticks(range(len(res.paths)), [PATHS[p] for p in res.paths], rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("random reads/s (log)")
    ax.set_title(f"bench random: {size_text(res.size)} file, {res.encoding}, {_load(res)}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "random-reads.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [out]


SCHEMA = schema_of(RandomBench, "tectonic-emu/bench-random/1", "tectonic-emu bench random --json")

__all__ = [
    "SCHEMA",
    "PathFigures",
    "RandomBench",
    "Ratio",
    "check_arguments",
    "offsets",
    "plot",
    "run_random_bench",
    "table",
    "targets",
    "targets_table",
]
