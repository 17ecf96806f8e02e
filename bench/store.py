"""``tectonic-emu bench store``: the client's goodput beside the raw disk, per encoding.

In one run, on the same file system: the raw limit (``os.pwrite`` of the same bytes in
block-sized pieces to one file, then ``fdatasync``; read back with ``os.preadv`` into a reused
buffer), and the store (``write_file`` of the same bytes, ``read_into`` a reused buffer) for
each encoding. Reads are cold (page cache dropped) when the process may write
``/proc/sys/vm/drop_caches`` (root), else warm, and the JSON says which.

The ratios the issue asks for are ``goodput / (raw rate / storage overhead)``: what fraction of
the disk's bandwidth, after paying for redundancy, the store delivers. For reads, where only
the data chunks are read, ``read_vs_raw`` (goodput / raw read rate) is the stricter figure.

``served=True`` adds the served path: a second cluster in the same directory, served by
``tectonic-emu serve`` (one process per node, chunks over loopback TCP), measured in the same
rounds right after the embedded path, and reported as ``served_vs_embedded`` ratios. Writes
are timed until every chunk is durable, also where the client acknowledges at a quorum.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mmap
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.fits import in_flight, stored_bytes
from bench.progress import Stages, Step, no_step
from bench.schema import schema_of
from bench.tables import beyond_raw, with_legend
from tectonic_emu import Cluster
from tectonic_emu.coding import Encoding
from tectonic_emu.resources import Needs, check_fits
from tectonic_emu.served import Serving
from tectonic_emu.sim.machine import drop_caches as drop_caches

PIECE = 8 << 20
MIB = 1 << 20  # the I/O size of the file-level paths (mounts, peers)


def aligned_buffer(size: int) -> memoryview:
    """A page-aligned buffer, touched once so that measured runs reuse warm memory."""
    buf = mmap.mmap(-1, max(size, 1))
    mv = memoryview(buf)
    for off in range(0, len(mv), mmap.PAGESIZE):
        mv[off] = 0
    return mv


def write_durably(path: Path, data: memoryview) -> None:
    """``data`` to a new file at ``path`` in 1 MiB writes, then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, len(data), MIB):
            os.write(fd, data[off : off + MIB])
        os.fsync(fd)
    finally:
        os.close(fd)


def read_whole(path: Path, buf: memoryview) -> None:
    """The file at ``path`` into ``buf`` in 1 MiB reads; it must fill ``buf`` exactly."""
    with open(path, "rb", buffering=0) as f:
        off = 0
        while off < len(buf):
            got = f.readinto(buf[off : off + MIB])
            if not got:
                raise OSError(errno.EIO, f"{off} bytes, {len(buf)} expected", str(path))
            off += got


def raw_write(path: Path, data: memoryview) -> float:
    """Seconds to pwrite ``data`` in PIECE-sized writes and fdatasync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for off in range(0, len(data), PIECE):
            os.pwrite(fd, data[off : off + PIECE], off)
        os.fdatasync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def raw_read(path: Path, buf: memoryview) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for off in range(0, len(buf), PIECE):
            os.preadv(fd, [buf[off : off + PIECE]], off)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


@dataclass(slots=True)
class EncodingFigures:
    encoding: str
    overhead: float
    write_mb_s: float
    read_mb_s: float
    write_ratio: float  # goodput / (raw write / overhead)
    read_ratio: float  # goodput / (raw read / overhead)
    read_vs_raw: float  # goodput / raw read
    write_runs_mb_s: list[float] = field(default_factory=list)
    read_runs_mb_s: list[float] = field(default_factory=list)
    # The served path (None unless measured): goodput, and served / embedded in the same run.
    served_write_mb_s: float | None = None
    served_read_mb_s: float | None = None
    served_vs_embedded_write: float | None = None
    served_vs_embedded_read: float | None = None
    # Served writes timed to the acknowledgment (a quorum by default), not to the last chunk.
    served_write_acked_mb_s: float | None = None
    served_write_runs_mb_s: list[float] = field(default_factory=list)
    served_read_runs_mb_s: list[float] = field(default_factory=list)


@dataclass(slots=True)
class StoreBench:
    size: int
    block_size: int
    runs: int
    nodes: int
    sync: bool
    cold_reads: bool
    directory: str
    raw_write_mb_s: float
    raw_read_mb_s: float
    raw_write_runs_mb_s: list[float]
    raw_read_runs_mb_s: list[float]
    encodings: list[EncodingFigures]
    served: bool = False
    write_ack: dict[str, str] = field(default_factory=dict)  # path -> "all" or "quorum"
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mb_s(nbytes: int, seconds: float) -> float:
    """Throughput in MB/s (10**6 bytes), to one decimal."""
    return round(nbytes / seconds / 1e6, 1)


async def _measure(
    client: Any, enc: str, payload: bytes, data: memoryview, buf: memoryview
) -> tuple[float, float, float]:
    """(seconds to the acknowledgment, seconds until every chunk is durable, read seconds)
    of one file of ``payload``, checked and deleted.

    The second write figure includes the stragglers (``drain``): a quorum acknowledgment
    returns earlier, but the disks still owe the last chunks, and leaving them out would
    credit the served path with work it pushes onto the next read."""
    t0 = time.perf_counter()
    await client.write_file(f"/bench-{enc}", payload, encoding=enc)
    acked = time.perf_counter() - t0
    await client.datapath.drain()
    w = time.perf_counter() - t0
    drop_caches()
    t0 = time.perf_counter()
    n = await client.read_into(f"/bench-{enc}", 0, buf)
    r = time.perf_counter() - t0
    if n != len(data) or buf != data:
        raise AssertionError(f"{enc}: read-back differs")
    await client.delete(f"/bench-{enc}")
    return acked, w, r


def needs(size: int, encodings: Sequence[str], block_size: int) -> Needs:
    """What a run of ``size`` bytes holds at its peak (``bench.fits``). Memory: the random
    bytes, their immutable copy for ``write_file`` and the read-back buffer (``os.urandom``'s
    transient copy comes and goes before the last two exist), and one encoding's blocks in
    flight. Disk: the raw file, or one encoding's file on one path: each is deleted before
    the next is written."""
    return Needs(
        3 * size + max(in_flight(e, block_size, nbytes=size) for e in encodings),
        max(size, *(stored_bytes(size, e, block_size) for e in encodings)),
    )


async def run_store_bench(
    *,
    size: int,
    encodings: list[str],
    directory: Path,
    block_size: int,
    runs: int = 3,
    sync: bool = True,
    served: bool = False,
    write_ack: str | None = None,
    step: Step = no_step,
) -> StoreBench:
    """Warm-up, then ``runs`` measured rounds; figures are medians of the rounds.

    ``write_ack`` forces one acknowledgment policy on both paths (default: each path's own,
    ``all`` embedded and ``quorum`` served). Raises InvalidArgumentError or NoSpaceError,
    before allocating anything, when ``size`` does not fit (``bench.fits``)."""
    check_fits(size, lambda n: needs(n, encodings, block_size), directory)
    work = Path(tempfile.mkdtemp(prefix="tectonic-bench-", dir=directory))
    serving: Serving | None = None
    try:
        data = aligned_buffer(size)
        data[:] = os.urandom(size)  # random: nothing to compress, as with trained weights
        payload = bytes(data)  # write_file's zero-copy path wants immutable bytes
        buf = aligned_buffer(size)
        widest = max(Encoding.parse(e).width for e in encodings)
        roots = {"embedded": work / "cluster"}
        if served:
            roots["served"] = work / "cluster-served"
        for root in roots.values():
            Cluster.create(
                root,
                nodes=widest,
                disks_per_node=2,
                encoding=encodings[0],
                block_size=block_size,
                sync=sync,
            )
        if served:
            step("starting the node processes")
            serving = Serving(roots["served"], repair_interval=0, log=work / "serve.log")
            await asyncio.to_thread(serving.start)
        raw_w: list[float] = []
        raw_r: list[float] = []
        per: dict[tuple[str, str], tuple[list[float], list[float]]] = {
            (path, e): ([], []) for path in roots for e in encodings
        }
        acked_runs: dict[tuple[str, str], list[float]] = {k: [] for k in per}
        cold = False
        acks: dict[str, str] = {}
        stage = Stages(step, (runs + 1) * (1 + len(encodings) * len(roots)))
        async with contextlib.AsyncExitStack() as stack:
            clients = {}
            for path, root in roots.items():
                cluster = await stack.enter_async_context(Cluster.open(root, write_ack=write_ack))
                acks[path] = cluster.datapath.write_ack
                clients[path] = cluster.client()
            for rnd in range(runs + 1):  # round 0 warms up and is not counted
                label = "warm-up" if rnd == 0 else f"run {rnd}/{runs}"
                stage(f"{label}: raw disk")
                raw_file = work / "raw.bin"
                w = await asyncio.to_thread(raw_write, raw_file, data)
                cold = drop_caches()
                r = await asyncio.to_thread(raw_read, raw_file, buf)
                assert buf == data, "raw read-back differs"
                raw_file.unlink()
                if rnd:
                    raw_w.append(mb_s(size, w))
                    raw_r.append(mb_s(size, r))
                for enc in encodings:
                    for path, client in clients.items():
                        stage(f"{label}: {enc} {path}")
                        acked, w, r = await _measure(client, enc, payload, data, buf)
                        if rnd:
                            per[(path, enc)][0].append(mb_s(size, w))
                            per[(path, enc)][1].append(mb_s(size, r))
                            acked_runs[(path, enc)].append(mb_s(size, acked))
        raw_wm, raw_rm = statistics.median(raw_w), statistics.median(raw_r)
        figures = []
        for enc in encodings:
            ov = Encoding.parse(enc).overhead
            ws, rs = per[("embedded", enc)]
            wm, rm = statistics.median(ws), statistics.median(rs)
            fig = EncodingFigures(
                enc,
                round(ov, 3),
                wm,
                rm,
                round(wm / (raw_wm / ov), 3),
                round(rm / (raw_rm / ov), 3),
                round(rm / raw_rm, 3),
                ws,
                rs,
            )
            if served:
                sw, sr = per[("served", enc)]
                fig.served_write_mb_s = statistics.median(sw)
                fig.served_read_mb_s = statistics.median(sr)
                fig.served_vs_embedded_write = round(fig.served_write_mb_s / wm, 3)
                fig.served_vs_embedded_read = round(fig.served_read_mb_s / rm, 3)
                fig.served_write_runs_mb_s, fig.served_read_runs_mb_s = sw, sr
                fig.served_write_acked_mb_s = statistics.median(acked_runs[("served", enc)])
            figures.append(fig)
        return StoreBench(
            size,
            block_size,
            runs,
            widest,
            sync,
            cold,
            str(directory),
            raw_wm,
            raw_rm,
            raw_w,
            raw_r,
            figures,
            served,
            acks,
        )
    finally:
        if serving is not None:
            await asyncio.to_thread(serving.stop)
        shutil.rmtree(work, ignore_errors=True)


def size_text(nbytes: int) -> str:
    """``536870912`` -> ``'512MiB'``: a size as the command line takes it (binary units)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g}{unit}"
    return f"{nbytes}B"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(res: StoreBench) -> Table:
    """The raw disk and each encoding's embedded goodput, with the ratios to the raw disk."""
    mode = "cold" if res.cold_reads else "warm (page cache; run as root for cold)"
    t = Table(
        title=f"bench store: {size_text(res.size)} per encoding, {res.runs} runs (median), "
        f"reads {mode}"
    )
    for col in ("path", "write MB/s", "read MB/s", "write ratio", "read ratio", "read vs raw"):
        t.add_column(col, justify="right")
    t.add_row("raw disk", _mb(res.raw_write_mb_s), _mb(res.raw_read_mb_s), "", "", "")
    for f in res.encodings:
        t.add_row(
            f.encoding,
            _mb(f.write_mb_s),
            _mb(f.read_mb_s),
            _ratio(f.write_ratio),
            _ratio(f.read_ratio),
            _ratio(f.read_vs_raw),
        )
    faster = [f.encoding for f in res.encodings if f.write_ratio > 1 or f.read_vs_raw > 1]
    return with_legend(
        t,
        "write ratio, read ratio = the encoding's MB/s / (the raw disk's MB/s in this run / "
        "the encoding's storage overhead): the share of the disk left after paying for "
        "redundancy.",
        "read vs raw = read MB/s / the raw disk's read MB/s. A read fetches only the data "
        "chunks, so this undivided figure is the stricter one (a read ratio above 1 is "
        "not faster than the disk).",
        beyond_raw(
            faster,
            streams="blocks in flight, each chunk a file on another node's disk",
            warm_reads=not res.cold_reads,
            cached_writes=not res.sync,
        ),
    )


ACKS = {"all": "when every chunk is durable", "quorum": "at a quorum (all chunks but one)"}


def served_table(res: StoreBench) -> Table | None:
    """The served path beside the embedded one (None when the served path was not measured)."""
    if not res.served:
        return None
    t = Table(title="served (node processes over TCP) vs embedded, same rounds")
    columns = ("encoding", "write MB/s", "(to ack)", "read MB/s", "write vs emb", "read vs emb")
    for col in columns:
        t.add_column(col, justify="right")
    for f in res.encodings:
        t.add_row(
            f.encoding,
            _mb(f.served_write_mb_s),
            _mb(f.served_write_acked_mb_s),
            _mb(f.served_read_mb_s),
            _ratio(f.served_vs_embedded_write),
            _ratio(f.served_vs_embedded_read),
        )
    acks = ", ".join(f"{path} {ACKS.get(ack, ack)}" for path, ack in res.write_ack.items())
    return with_legend(
        t,
        f"Writes acknowledged: {acks}. write MB/s counts until every chunk is durable, "
        "(to ack) until the write returned.",
        "write vs emb, read vs emb = served MB/s / embedded MB/s, same encoding and rounds.",
    )


def plot(res: StoreBench, directory: Path) -> list[Path]:
    """``store-write.png`` and ``store-read.png``: MB/s per encoding (embedded, and served when
    measured), the raw disk's rate as the limit line."""
    from clients.plotting import bars

    labels = [f.encoding for f in res.encodings]
    out = []
    for rw, raw in (("write", res.raw_write_mb_s), ("read", res.raw_read_mb_s)):
        series = {"embedded": [getattr(f, f"{rw}_mb_s") for f in res.encodings]}
        if res.served:
            series["served"] = [getattr(f, f"served_{rw}_mb_s") or 0.0 for f in res.encodings]
        out.append(
            bars(
                directory / f"store-{rw}.png",
                title=f"store {rw}: {size_text(res.size)} per encoding, {res.runs} runs (median)",
                labels=labels,
                series=series,
                ylabel="MB/s",
                limit=raw,
                limit_label="raw disk",
            )
        )
    return out


SCHEMA = schema_of(StoreBench, "tectonic-emu/bench-store/1", "tectonic-emu bench store --json")

__all__ = [
    "SCHEMA",
    "StoreBench",
    "mb_s",
    "plot",
    "run_store_bench",
    "served_table",
    "size_text",
    "table",
]
