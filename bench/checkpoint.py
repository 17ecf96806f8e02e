"""``tectonic-emu bench checkpoint``: MLPerf Storage v2.0's checkpointing workload, through
every path a user could take, in one run.

The files are those DLIO writes for the model (``bench/models.py``: fp16 weights, fp32
optimizer state, the TP/PP/DP layout and ZeRO stage of MLPerf's llama3 configs), every file
scaled by ``scale``, filled from one buffer of random bytes (so no path can compress or skip
zeros). The run is ``runs`` x ``writes`` rounds; in each round every path in turn:

1. writes one checkpoint: all ranks start together; each rank writes its files and makes them
   durable (fsync, or the store's fdatasync before commit); a rank's duration runs from the
   common start to the moment its own save returned;
2. (in the first ``reads`` rounds of every ``writes``) drops the page cache (as root; otherwise
   reads are warm and ``cold_reads`` says so) and loads it, each rank reading rank
   ``(r + read_shift) % ranks``'s files (0: its own), into buffers allocated once; the bytes
   are checked afterwards, outside the timing;
3. deletes it.

Paths take turns round by round, so that a disk whose speed drifts during the run (this
shared VM's does, by 2x within minutes) weighs on all of them alike, and the disk holds one
checkpoint at a time. ``pause_s`` separates rounds.

Ranks are concurrent: asyncio tasks for our native client (a ``Checkpointer`` shared by every
rank, which commits the step once all ranks wrote); a pool of ``workers`` threads for the
paths that make blocking calls (files on a mount, torch.save, DCP), where a rank waits for a
free worker as MLPerf's ranks would wait for a core.

Figures, per checkpoint written or read, as MLPerf reports them:

- ``duration_s``: the slowest rank's duration (max over ranks);
- ``throughput_gb_s``: the checkpoint's bytes over that duration (equivalently the minimum
  over ranks of bytes / the rank's duration);
- ``total_gb_s``: the checkpoint's bytes over the wall time of the whole operation,
  including a commit or drain after the last rank returned.

Each path's figure is the mean over its ``writes`` (or ``reads``) times ``runs`` samples, all
kept in ``samples``. GB is 10^9 bytes.

Paths (``key``: what it is):

- ``raw``: the disk's limit, the checkpoint's bytes as one file (fio with ``end_fsync`` when
  installed, else ``os.pwrite`` + ``fdatasync``), read back cold.
- ``native/<encoding>``: ``clients.checkpoint.Checkpointer.save`` / ``load`` on an embedded
  cluster (fsync on), one directory per encoding.
- ``fuse/<encoding>``: each rank's files written (1 MiB writes, fsync) and read through
  ``tectonic-emu mount`` of the same cluster.
- ``torch.save/local``, ``dcp/local``: ``torch.save`` + fsync per file, and DCP's
  ``FileSystemWriter`` (``sync_files=True``) per rank, into a local directory on the same disk.
- ``dcp/plugin``: DCP through our ``TectonicStorageWriter`` / ``Reader``.
- ``dcp/fuse``: DCP's ``FileSystemWriter`` pointed at the mount.
- ``peer/<name>``: the files on a peer file system set up on loopback by ``bench/peers.py``.

DCP saves are per rank (``no_dist``: one process, no process group), so each rank's
checkpoint is its own DCP checkpoint directory; loads fill tensors allocated once.

``targets`` compares paths as issue 7 asks (each with its goal and whether it is met).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.models import CheckpointFile, CheckpointPlan, checkpoint_plan
from bench.schema import schema_of
from bench.store import aligned_buffer, drop_caches, raw_read, raw_write, read_whole, write_durably
from bench.tables import beyond_raw, with_legend
from clients.checkpoint import Checkpointer
from tectonic_emu import Client, Cluster
from tectonic_emu.coding import Encoding
from tectonic_emu.config import parse_size

IO = 1 << 20
GB = 1e9
MAX_TOTAL = parse_size("6GiB")  # the payload and the read buffers both live in memory
STORE_ROOT = "/bench-ckpt"
DEFAULT_PATHS = ("raw", "native", "fuse", "torch.save", "dcp/local", "dcp/plugin", "dcp/fuse")
SCHEMA_ID = "tectonic-emu/bench-checkpoint/1"
# Peers whose fsync on the mount leaves the bytes in their own storage's page cache: JuiceFS's
# local-directory object store writes objects without fsync; SeaweedFS's volume servers fsync
# an appended needle only when the upload asks for it, which weed mount's uploads do not.
NOT_DURABLE_AT_FSYNC = ("juicefs", "seaweedfs", "seaweedfs-r3")


class BenchError(RuntimeError):
    """A path's bytes came back wrong, or the bench cannot run as asked."""


# -- the bytes ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Placed:
    """One checkpoint file, and where its bytes sit in the payload and in the read buffer."""

    file: CheckpointFile
    offset: int


class Payload:
    """The plan's files laid end to end in one random buffer; a second buffer of the same size
    receives reads (both page aligned, touched once, reused by every path and round)."""

    def __init__(self, plan: CheckpointPlan) -> None:
        self.plan = plan
        self.total = plan.total
        if self.total > MAX_TOTAL:
            raise BenchError(
                f"the checkpoint is {self.total / GB:.1f} GB at this scale; lower --scale "
                f"(at most {MAX_TOTAL / GB:.1f} GB here)"
            )
        self.data = aligned_buffer(self.total)
        fill = np.random.default_rng()  # PCG64: random bytes at memory speed; urandom is 0.2 GB/s
        words = np.frombuffer(self.data, dtype=np.uint8)
        for off in range(0, self.total, 64 << 20):
            n = min(64 << 20, self.total - off)
            words[off : off + n] = np.frombuffer(fill.bytes(n), dtype=np.uint8)
        self.back = aligned_buffer(self.total)
        self.ranks: list[list[Placed]] = []  # by rank, its files
        at = 0
        for r in plan.per_rank:
            self.ranks.append([])
            for f in r.files:
                self.ranks[-1].append(Placed(f, at))
                at += f.size

    def src(self, p: Placed) -> memoryview:
        return self.data[p.offset : p.offset + p.file.size]

    def dst(self, p: Placed) -> memoryview:
        return self.back[p.offset : p.offset + p.file.size]

    def clear_back(self) -> None:
        """Zero the read buffer, so that a read that skips a file cannot pass the check."""
        np.frombuffer(self.back, dtype=np.uint8)[:] = 0

    def check_back(self, key: str) -> None:
        if not np.array_equal(_array(self.back), _array(self.data)):
            raise BenchError(f"{key}: the bytes read back differ from those written")

    def source_rank(self, rank: int, shift: int) -> int:
        return (rank + shift) % self.plan.ranks


# -- measurements ------------------------------------------------------------------------------
@dataclass(slots=True)
class Sample:
    duration_s: float  # the slowest rank
    throughput_gb_s: float  # bytes / duration_s
    total_gb_s: float  # bytes / wall time of the whole operation

    @classmethod
    def of(cls, nbytes: int, start: float, ends: Sequence[float], wall_end: float) -> Sample:
        duration = max(max(ends) - start, 1e-9)
        wall = max(wall_end - start, duration)
        return cls(
            round(duration, 5), round(nbytes / duration / GB, 4), round(nbytes / wall / GB, 4)
        )


@dataclass(slots=True)
class Figures:
    duration_s: float
    throughput_gb_s: float
    total_gb_s: float
    samples: list[Sample]

    @classmethod
    def mean(cls, samples: list[Sample]) -> Figures:
        n = len(samples)
        return cls(
            round(sum(s.duration_s for s in samples) / n, 5),
            round(sum(s.throughput_gb_s for s in samples) / n, 4),
            round(sum(s.total_gb_s for s in samples) / n, 4),
            samples,
        )


@dataclass(slots=True)
class PathResult:
    key: str
    title: str
    tolerates: int  # disks (nodes) that can fail without loss: 0 for r1, 2 for r3, 3 rs-6-3
    overhead: float  # bytes stored per byte written (3.0 for r3, 1.5 for rs-6-3)
    available: bool
    reason: str | None = None  # why not, when not available
    write: Figures | None = None
    read: Figures | None = None


@dataclass(slots=True)
class Target:
    name: str
    value: float | None
    goal: float
    met: bool | None  # None when a path it needs did not run
    detail: str


@dataclass(slots=True)
class CheckpointBench:
    schema: str
    model: str
    ranks: int
    scale: float
    layout: dict[str, int]
    total_bytes: int
    full_total_bytes: int
    files: int
    rank_bytes_min: int
    rank_bytes_max: int
    writes: int
    reads: int
    pause_s: float
    runs: int
    read_shift: int
    workers: int
    cold_reads: bool
    paths: list[PathResult]
    targets: list[Target]
    versions: dict[str, str] = field(default_factory=dict)
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def path(self, key: str) -> PathResult | None:
        return next((p for p in self.paths if p.key == key and p.available), None)


def redundancy(encoding: str) -> tuple[int, float]:
    """(failures tolerated, bytes stored per byte) of an encoding."""
    enc = Encoding.parse(encoding)
    return enc.tolerance, enc.overhead


# -- paths -------------------------------------------------------------------------------------
class Route:
    """One way to write and read the checkpoint. ``save``/``load`` return the monotonic time at
    which each rank finished, and the wall end of the whole operation."""

    key: str = ""
    title: str = ""
    tolerates: int = 0
    overhead: float = 1.0
    verified = True  # loads fill the read buffer, checked against the payload

    def __init__(self) -> None:
        self._held: list[tuple[Placed, Any]] = []  # loaded values not yet in the read buffer

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        raise NotImplementedError

    async def load(self, n: int, pl: Payload, shift: int) -> tuple[list[float], float]:
        raise NotImplementedError

    async def remove(self, n: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what the route keeps open (nothing by default)."""

    def hold(self, p: Placed, value: Any) -> None:
        """Keep a loaded value; ``settle`` copies it into the read buffer after the timing."""
        self._held.append((p, value))  # list.append: safe from the worker threads

    def settle(self, pl: Payload) -> None:
        held, self._held = self._held, []
        for p, value in held:
            pl.dst(p)[:] = memoryview(np.asarray(value)).cast("B")


class ThreadedRoute(Route):
    """A route of blocking calls: ranks run ``save_rank``/``load_rank`` on a thread pool."""

    def __init__(self, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        super().__init__()
        self.pool = pool

    def save_rank(self, n: int, rank: int, pl: Payload) -> None:
        raise NotImplementedError

    def load_rank(self, n: int, rank: int, src: int, pl: Payload) -> None:
        raise NotImplementedError

    async def _each_rank(self, job: Callable[[int], None], ranks: int) -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()

        def timed(rank: int) -> float:
            job(rank)
            return time.perf_counter()

        ends = await asyncio.gather(
            *(loop.run_in_executor(self.pool, timed, r) for r in range(ranks))
        )
        return list(ends), time.perf_counter()

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        return await self._each_rank(lambda r: self.save_rank(n, r, pl), pl.plan.ranks)

    async def load(self, n: int, pl: Payload, shift: int) -> tuple[list[float], float]:
        timed = await self._each_rank(
            lambda r: self.load_rank(n, r, pl.source_rank(r, shift), pl), pl.plan.ranks
        )
        self.settle(pl)
        return timed


class FilesRoute(ThreadedRoute):
    """Each rank's files as plain files in ``root/ckpt-<n>/`` (a mount, or a peer's mount).

    ``sync_after``: for a peer whose fsync on the mount does not make the bytes durable in its
    own storage (``NOT_DURABLE_AT_FSYNC``), every save ends with ``sync``, counted in every
    rank's duration, so that all paths are timed to the same durability. JuiceFS's
    local-directory object store, for one, writes each object to a temporary file and renames
    it, never fsyncing (its pkg/object/file.go, ``Put``)."""

    def __init__(
        self,
        pool: concurrent.futures.ThreadPoolExecutor,
        key: str,
        title: str,
        root: Path,
        tolerates: int,
        overhead: float,
        *,
        sync_after: bool = False,
    ) -> None:
        super().__init__(pool)
        self.key, self.title, self.root = key, title, root
        self.tolerates, self.overhead = tolerates, overhead
        self.sync_after = sync_after

    def _dir(self, n: int) -> Path:
        return self.root / f"ckpt-{n}"

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        await asyncio.to_thread(self._dir(n).mkdir, exist_ok=True)
        ends, wall = await super().save(n, pl)
        if self.sync_after:
            await asyncio.to_thread(os.sync)
            wall = time.perf_counter()
            ends = [wall] * len(ends)  # no rank's checkpoint is durable before this
        return ends, wall

    def save_rank(self, n: int, rank: int, pl: Payload) -> None:
        for p in pl.ranks[rank]:
            write_durably(self._dir(n) / p.file.name, pl.src(p))

    def load_rank(self, n: int, rank: int, src: int, pl: Payload) -> None:
        for p in pl.ranks[src]:
            read_whole(self._dir(n) / p.file.name, pl.dst(p))

    async def remove(self, n: int) -> None:
        await asyncio.to_thread(shutil.rmtree, self._dir(n))


class RawRoute(Route):
    """The disk's limit: the checkpoint's bytes as one file, by fio if installed."""

    key, title = "raw", "raw disk"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.file = directory / "raw.bin"
        self.fio = shutil.which("fio")
        self.verified = self.fio is None  # fio reads into its own buffers
        self.title = "raw disk (fio, end_fsync)" if self.fio else "raw disk (pwrite + fdatasync)"

    def _fio(self, rw: str, size: int) -> float:
        assert self.fio is not None
        cmd = [
            self.fio,
            "--name=raw",
            f"--filename={self.file}",
            f"--rw={rw}",
            "--bs=1M",
            f"--size={size}",
            "--ioengine=psync",
            "--output-format=json",
        ]
        cmd += ["--end_fsync=1"] if rw == "write" else []
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        job = json.loads(out[out.index("{") :])["jobs"][0][rw]
        return size / max(job["bw_bytes"], 1)

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        t0 = time.perf_counter()
        if self.fio:
            secs = await asyncio.to_thread(self._fio, "write", pl.total)
        else:
            secs = await asyncio.to_thread(raw_write, self.file, pl.data)
        return [t0 + secs], t0 + secs

    async def load(self, n: int, pl: Payload, shift: int) -> tuple[list[float], float]:
        t0 = time.perf_counter()
        if self.fio:
            secs = await asyncio.to_thread(self._fio, "read", pl.total)
        else:
            secs = await asyncio.to_thread(raw_read, self.file, pl.back)
        return [t0 + secs], t0 + secs

    async def remove(self, n: int) -> None:
        self.file.unlink(missing_ok=True)


class NativeRoute(Route):
    """Our ``Checkpointer``: every rank ``save``s its files as arrays, and loads another
    rank's state (``load(src, into=...)``) into the read buffer in place, as the DCP routes
    load into tensors over it (allocating arrays per load costs fresh memory, 0.44 GB/s on
    this kind of VM: ../shared/MACHINE.md)."""

    def __init__(
        self,
        cluster: Cluster,
        client: Client,
        encoding: str,
        ranks: int,
        *,
        key: str = "native",
        where: str = "",
    ) -> None:
        super().__init__()
        enc = Encoding.parse(encoding).name
        self.key, self.title = f"{key}/{enc}", f"native Checkpointer, {enc}{where}"
        self.tolerates, self.overhead = redundancy(enc)
        self.cluster = cluster
        self.ckpt = Checkpointer(
            client, f"{STORE_ROOT}/native-{enc}", world_size=ranks, encoding=enc
        )

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        async def one(rank: int) -> float:
            state = {p.file.name: np.frombuffer(pl.src(p), dtype=np.uint8) for p in pl.ranks[rank]}
            await self.ckpt.save(n, rank, state)
            return time.perf_counter()

        ends = await asyncio.gather(*(one(r) for r in range(pl.plan.ranks)))
        await self.cluster.datapath.drain()
        return list(ends), time.perf_counter()

    async def load(self, n: int, pl: Payload, shift: int) -> tuple[list[float], float]:
        async def one(rank: int) -> float:
            src = pl.source_rank(rank, shift)
            into = {p.file.name: np.frombuffer(pl.dst(p), dtype=np.uint8) for p in pl.ranks[src]}
            await self.ckpt.load(src, step=n, into=into)
            return time.perf_counter()

        ends = await asyncio.gather(*(one(r) for r in range(pl.plan.ranks)))
        return list(ends), time.perf_counter()

    async def remove(self, n: int) -> None:
        await self.ckpt.delete(n)


class TorchSaveRoute(ThreadedRoute):
    """``torch.save`` of each file's tensor + fsync into a local directory; ``torch.load``."""

    key, title = "torch.save/local", "torch.save + fsync, local disk"

    def __init__(self, pool: concurrent.futures.ThreadPoolExecutor, root: Path) -> None:
        super().__init__(pool)
        self.root = root

    def _dir(self, n: int) -> Path:
        return self.root / f"ckpt-{n}"

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        await asyncio.to_thread(self._dir(n).mkdir, parents=True, exist_ok=True)
        return await super().save(n, pl)

    def save_rank(self, n: int, rank: int, pl: Payload) -> None:
        import torch

        for p in pl.ranks[rank]:
            with open(self._dir(n) / p.file.name, "wb") as f:
                torch.save({"data": torch.from_numpy(_array(pl.src(p)))}, f)
                f.flush()
                os.fsync(f.fileno())

    def load_rank(self, n: int, rank: int, src: int, pl: Payload) -> None:
        import torch

        for p in pl.ranks[src]:
            self.hold(p, torch.load(self._dir(n) / p.file.name, weights_only=True)["data"])

    async def remove(self, n: int) -> None:
        await asyncio.to_thread(shutil.rmtree, self._dir(n))


class DcpRoute(ThreadedRoute):
    """torch DCP, one checkpoint directory per rank (``no_dist``), saved by ``writer(path)``
    and loaded by ``reader(path)`` into tensors over the read buffer. The writer and reader of
    each worker thread are made once and reused (``reset``), as a trainer keeps its own."""

    def __init__(
        self,
        pool: concurrent.futures.ThreadPoolExecutor,
        key: str,
        title: str,
        *,
        where: Callable[[int, int], str],
        writer: Callable[[str], Any],
        reader: Callable[[str], Any],
        remove: Callable[[int], Any],
        tolerates: int = 0,
        overhead: float = 1.0,
    ) -> None:
        super().__init__(pool)
        self.key, self.title = key, title
        self.tolerates, self.overhead = tolerates, overhead
        self._where, self._writer, self._reader, self._remove = where, writer, reader, remove
        self._local = threading.local()
        self._made: list[Any] = []
        # dcp.save/load without a process group warns at every call that it runs as one process
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled")

    def _mine(self, kind: str, make: Callable[[str], Any], path: str) -> Any:
        obj = getattr(self._local, kind, None)
        if obj is None:
            obj = make(path)
            setattr(self._local, kind, obj)
            self._made.append(obj)
        return obj

    def save_rank(self, n: int, rank: int, pl: Payload) -> None:
        import torch
        import torch.distributed.checkpoint as dcp

        path = self._where(n, rank)
        state = {p.file.name: torch.from_numpy(_array(pl.src(p))) for p in pl.ranks[rank]}
        writer = self._mine("writer", self._writer, path)
        dcp.save(state, checkpoint_id=path, storage_writer=writer, no_dist=True)

    def load_rank(self, n: int, rank: int, src: int, pl: Payload) -> None:
        import torch
        import torch.distributed.checkpoint as dcp

        path = self._where(n, src)
        state = {p.file.name: torch.from_numpy(_array(pl.dst(p))) for p in pl.ranks[src]}
        reader = self._mine("reader", self._reader, path)
        dcp.load(state, checkpoint_id=path, storage_reader=reader, no_dist=True)

    async def remove(self, n: int) -> None:
        result = self._remove(n)
        if asyncio.iscoroutine(result):
            await result

    def close(self) -> None:
        for obj in self._made:
            if hasattr(obj, "close"):
                obj.close()
        self._made.clear()


def _array(view: memoryview) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.frombuffer(view, dtype=np.uint8)


# -- the run -----------------------------------------------------------------------------------
def _torch_missing() -> str | None:
    try:
        import torch.distributed.checkpoint  # noqa: F401
    except ImportError:
        return "torch is not installed (pip install -e '.[torch]')"
    return None


async def run_checkpoint_bench(
    *,
    model: str,
    directory: Path,
    ranks: int | None = None,
    scale: float = 0.005,
    encodings: Sequence[str] = ("r1", "r3", "rs-6-3"),
    paths: Sequence[str] = DEFAULT_PATHS,
    peers: Sequence[str] = (),
    writes: int = 2,
    reads: int | None = None,
    pause: float = 0.5,
    runs: int = 1,
    read_shift: int = 1,
    workers: int = 8,
    hosts: int = 0,
    hosts_nic_gbps: float = 0.0,
    hosts_rtt_ms: float = 0.0,
    step: Callable[..., None] = lambda *_: None,
) -> CheckpointBench:
    """Run every path in ``paths`` (keys of DEFAULT_PATHS; ``native`` and ``fuse`` once per
    encoding) and each peer named in ``peers``; see the module docstring. ``hosts``: also
    the native client against a cluster across that many hosts (``hosts/<encoding>``). A
    path that cannot run here (torch or a peer not installed) is reported with its reason,
    not measured.
    Raises BenchError when a path reads back wrong bytes, InvalidArgumentError for a bad
    model, ranks or scale."""
    from bench import environment

    plan = checkpoint_plan(model, ranks, scale)
    reads = writes if reads is None else reads
    if writes < 1 or not 0 <= reads <= writes or runs < 1:
        raise BenchError("writes and runs must be at least 1, reads from 0 to writes")
    unknown = [p for p in paths if p not in DEFAULT_PATHS]
    if unknown:
        raise BenchError(f"unknown paths {unknown}; choose from {', '.join(DEFAULT_PATHS)}")
    encs = [Encoding.parse(e).name for e in encodings]
    dcp_enc = "r1" if "r1" in encs else encs[0]
    work = Path(tempfile.mkdtemp(prefix="tectonic-checkpoint-bench-", dir=directory))
    step(f"{plan.total / GB:.2f} GB of random bytes in {len(plan.files)} files")
    pl = Payload(plan)
    results: dict[str, PathResult] = {}
    cold = True
    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="rank")
    mounts: list[tuple[Path, subprocess.Popen[bytes]]] = []
    routes: list[Route] = []
    try:
        root = work / "cluster"
        width = max(Encoding.parse(e).width for e in encs)
        Cluster.create(root, nodes=max(9, width), encoding=dcp_enc)
        async with Cluster.open(root) as cluster, contextlib.AsyncExitStack() as stack:
            client = cluster.client()
            torch_missing = _torch_missing()

            def unavailable(key: str, title: str, reason: str) -> None:
                results[key] = PathResult(key, title, 0, 1.0, False, reason)

            if "raw" in paths:
                routes.append(RawRoute(work))
            if "native" in paths:
                routes += [NativeRoute(cluster, client, e, plan.ranks) for e in encs]
            mnt = work / "mnt"
            if {"fuse", "dcp/fuse"} & set(paths):
                from fuse_mount.mount import start_mount

                step("mounting the cluster")
                for e in encs:
                    await client.mkdir(f"/fuse-{e}", encoding=e)
                await client.mkdir("/dcp-fuse", encoding=dcp_enc)
                mnt.mkdir()
                proc = await asyncio.to_thread(start_mount, root, mnt, log=work / "mount.log")
                mounts.append((mnt, proc))
            if "fuse" in paths:
                for e in encs:
                    t, o = redundancy(e)
                    routes.append(
                        FilesRoute(pool, f"fuse/{e}", f"FUSE mount, {e}", mnt / f"fuse-{e}", t, o)
                    )
            local = work / "local"
            local.mkdir()
            for key in ("torch.save", "dcp/local", "dcp/plugin", "dcp/fuse"):
                if key in paths and torch_missing:
                    unavailable(
                        key if key != "torch.save" else "torch.save/local", key, torch_missing
                    )
            if not torch_missing:
                routes += _torch_routes(paths, pool, local, mnt, root, client, dcp_enc)
            if hosts:
                across = await _hosts_cluster(
                    work, hosts, width, hosts_nic_gbps, hosts_rtt_ms, stack, step
                )
                if isinstance(across, str):
                    for e in encs:
                        unavailable(f"hosts/{e}", f"native, {e}, across {hosts} hosts", across)
                else:
                    hc, where = across
                    routes += [
                        NativeRoute(hc, hc.client(), e, plan.ranks, key="hosts", where=where)
                        for e in encs
                    ]
            for name in peers:
                routes_or_reason = await _peer_route(name, pool, work, stack, step)
                if isinstance(routes_or_reason, str):
                    unavailable(f"peer/{name}", name, routes_or_reason)
                else:
                    routes.append(routes_or_reason)

            samples: dict[str, tuple[list[Sample], list[Sample]]] = {
                r.key: ([], []) for r in routes
            }
            done, todo = 0, runs * writes * len(routes)
            for k in range(runs * writes):  # round k: every path writes (and reads) once
                if k:
                    await asyncio.sleep(pause)
                for route in routes:
                    step(f"checkpoint {k + 1}/{runs * writes}: {route.key}", done / todo)
                    done += 1
                    ws, rs = samples[route.key]
                    t0 = time.perf_counter()
                    ends, wall = await route.save(k + 1, pl)
                    ws.append(Sample.of(pl.total, t0, ends, wall))
                    if k % writes < reads:
                        cold = drop_caches() and cold
                        pl.clear_back()
                        t0 = time.perf_counter()
                        ends, wall = await route.load(k + 1, pl, read_shift)
                        rs.append(Sample.of(pl.total, t0, ends, wall))
                        if route.verified:
                            pl.check_back(route.key)
                    await route.remove(k + 1)
            for route in routes:
                ws, rs = samples[route.key]
                results[route.key] = PathResult(
                    route.key,
                    route.title,
                    route.tolerates,
                    route.overhead,
                    True,
                    None,
                    Figures.mean(ws),
                    Figures.mean(rs) if rs else None,
                )
            for route in routes:
                route.close()
            for route in routes:
                if isinstance(route, NativeRoute):
                    await route.ckpt.close()
        versions = environment.versions(peers=peers)
    finally:
        from fuse_mount.mount import unmount

        for where, proc in mounts:
            await asyncio.to_thread(unmount, where)
            await asyncio.to_thread(proc.wait, 30)
        pool.shutdown(wait=True)
        shutil.rmtree(work, ignore_errors=True)
    order = [r.key for r in routes]
    paths_out = sorted(
        results.values(), key=lambda p: order.index(p.key) if p.key in order else len(order)
    )
    sizes = [r.size for r in plan.per_rank]
    par = plan.model.parallelism
    out = CheckpointBench(
        SCHEMA_ID,
        plan.model.name,
        plan.ranks,
        plan.scale,
        {
            "tensor": par.tensor,
            "pipeline": par.pipeline,
            "data": plan.data_parallel,
            "zero_stage": par.zero_stage,
        },
        plan.total,
        plan.full_total,
        len(plan.files),
        min(sizes),
        max(sizes),
        writes,
        reads,
        pause,
        runs,
        read_shift,
        workers,
        cold,
        paths_out,
        [],
        versions,
    )
    out.targets = targets(out)
    return out


def _torch_routes(
    paths: Sequence[str],
    pool: concurrent.futures.ThreadPoolExecutor,
    local: Path,
    mnt: Path,
    cluster_dir: Path,
    client: Client,
    encoding: str,
) -> list[Route]:
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    from clients.torch_dcp import TectonicStorageReader, TectonicStorageWriter

    def fs_writer(path: str) -> Any:
        return FileSystemWriter(path, sync_files=True, thread_count=1)

    def fs_dcp(key: str, title: str, base: Path, tolerates: int, overhead: float) -> DcpRoute:
        return DcpRoute(
            pool,
            key,
            title,
            where=lambda n, r: str(base / f"ckpt-{n}" / f"rank-{r}"),
            writer=fs_writer,
            reader=FileSystemReader,
            remove=lambda n: asyncio.to_thread(shutil.rmtree, base / f"ckpt-{n}"),
            tolerates=tolerates,
            overhead=overhead,
        )

    routes: list[Route] = []
    if "torch.save" in paths:
        routes.append(TorchSaveRoute(pool, local / "torch-save"))
    if "dcp/local" in paths:
        routes.append(
            fs_dcp("dcp/local", "DCP FileSystemWriter, local disk", local / "dcp", 0, 1.0)
        )
    if "dcp/plugin" in paths:
        t, o = redundancy(encoding)
        routes.append(
            DcpRoute(
                pool,
                "dcp/plugin",
                f"DCP through TectonicStorageWriter, {encoding}",
                where=lambda n, r: f"{STORE_ROOT}/dcp-plugin/ckpt-{n}/rank-{r}",
                writer=lambda path: TectonicStorageWriter(cluster_dir, path, encoding=encoding),
                reader=lambda path: TectonicStorageReader(cluster_dir, path),
                remove=lambda n: client.delete(f"{STORE_ROOT}/dcp-plugin/ckpt-{n}", recursive=True),
                tolerates=t,
                overhead=o,
            )
        )
    if "dcp/fuse" in paths:
        t, o = redundancy(encoding)
        routes.append(
            fs_dcp(
                "dcp/fuse", f"DCP FileSystemWriter on the mount, {encoding}", mnt / "dcp-fuse", t, o
            )
        )
    return routes


async def _hosts_cluster(
    work: Path,
    hosts: int,
    width: int,
    nic_gbps: float,
    rtt_ms: float,
    stack: contextlib.AsyncExitStack,
    step: Callable[[str], None],
) -> tuple[Cluster, str] | str:
    """A cluster across ``hosts`` network namespaces (issue 8), open (torn down when
    ``stack`` closes), and the words for its paths' titles; or why it cannot be made here.
    Nodes: ``ceil(width / hosts)`` on each host, each served by ``node serve`` from the host's
    own copy of ``cluster.json``; metadata in a throwaway PostgreSQL server on the bridge; the
    links paced at ``nic_gbps`` and ``rtt_ms`` (0: not paced). This process is the client,
    in the root namespace."""
    from bench import netns, postgres

    reason = netns.unavailable()
    bindir = postgres.bin_dir()
    if reason or bindir is None:
        return reason or "no PostgreSQL server here (apt-get install postgresql)"
    step(f"making {hosts} hosts as network namespaces")
    names = [f"h{i}" for i in range(hosts)]
    net = stack.enter_context(netns.Hosts(names))
    server = postgres.PostgresServer(bindir, listen=(net.gateway,), trust=(net.network,))
    await asyncio.to_thread(server.start)
    stack.callback(server.stop)
    per_host = -(-width // hosts)
    placed = [(h, 7100 + j) for h in names for j in range(per_host)]
    template = work / "hosts" / "template"
    Cluster.create(
        template,
        nodes=len(placed),
        encoding="r1",
        metadata=server.url,
        node_addresses=tuple(f"{net.ip[h]}:{port}" for h, port in placed),
        nic_gbps=nic_gbps,
        rtt_ms=rtt_ms,
    )
    await asyncio.to_thread(
        netns.serve_nodes, net, template, work / "hosts", [h for h, _ in placed]
    )
    deadline = time.monotonic() + 60
    for h, port in placed:
        while not netns.listening(net.ip[h], port):
            if time.monotonic() > deadline:
                return f"the nodes on the namespaced hosts did not start ({work / 'hosts'})"
            await asyncio.sleep(0.05)
    cluster = await stack.enter_async_context(Cluster.open(template))
    link = f", {nic_gbps:g} Gb/s, {rtt_ms:g} ms" if nic_gbps or rtt_ms else ""
    return cluster, f", across {hosts} namespaced hosts x {per_host} nodes{link}"


async def _peer_route(
    name: str,
    pool: concurrent.futures.ThreadPoolExecutor,
    work: Path,
    stack: contextlib.AsyncExitStack,
    step: Callable[[str], None],
) -> Route | str:
    """The peer ``name`` set up and mounted (torn down when ``stack`` closes), or why not."""
    from bench import peers

    if name not in peers.PEERS:
        return f"unknown peer; known: {', '.join(peers.PEERS)}"
    reason = peers.missing(name)
    if reason:
        return reason
    peer = peers.PEERS[name]
    title = f"{peer.title} {peers.version(name) or ''}".strip()
    step(f"setting up {title}")
    cm = peers.mounted(name, work / f"peer-{name}")
    where = await asyncio.to_thread(cm.__enter__)
    stack.push_async_callback(asyncio.to_thread, cm.__exit__, None, None, None)
    # A fresh peer makes its volumes on the first write (SeaweedFS: 7 of them): not measured.
    warm = where / "warm-up"
    await asyncio.to_thread(write_durably, warm, memoryview(os.urandom(8 << 20)))
    await asyncio.to_thread(warm.unlink)
    return FilesRoute(
        pool,
        f"peer/{name}",
        title,
        where,
        peer.copies - 1,
        float(peer.copies),
        sync_after=name in NOT_DURABLE_AT_FSYNC,
    )


# -- what the issue asks of the figures --------------------------------------------------------
def _ratio(a: Figures | None, b: Figures | None) -> float | None:
    if a is None or b is None or b.throughput_gb_s <= 0:
        return None
    return round(a.throughput_gb_s / b.throughput_gb_s, 3)


def targets(res: CheckpointBench) -> list[Target]:
    """Issue 7's goals, each from figures of this run; ``met`` is None where a path is
    missing."""
    out: list[Target] = []

    def add(name: str, value: float | None, goal: float, detail: str) -> None:
        out.append(Target(name, value, goal, None if value is None else value >= goal, detail))

    def fig(key: str, rw: str) -> Figures | None:
        p = res.path(key)
        return None if p is None else getattr(p, rw)

    for rw in ("write", "read"):
        add(
            f"native/r1 vs dcp/local, {rw}",
            _ratio(fig("native/r1", rw), fig("dcp/local", rw)),
            0.9,
            "same bytes, same fsync",
        )
    raw = fig("raw", "write")
    for p in res.paths:
        if p.key.startswith("native/") and p.key != "native/r1" and p.available and raw:
            limit = raw.throughput_gb_s / p.overhead
            value = None if p.write is None else round(p.write.throughput_gb_s / limit, 3)
            add(
                f"{p.key} vs raw / {p.overhead:g}, write",
                value,
                0.7,
                "raw disk write divided by the encoding's overhead",
            )
    for p in res.paths:
        if p.key.startswith("fuse/"):
            native = "native/" + p.key.split("/", 1)[1]
            for rw in ("write", "read"):
                add(
                    f"{p.key} vs {native}, {rw}",
                    _ratio(fig(p.key, rw), fig(native, rw)),
                    0.7,
                    "the mount against our client, same encoding",
                )
    dcp_plugin = res.path("dcp/plugin")
    if dcp_plugin is not None:
        native = "native/" + dcp_plugin.title.rsplit(", ", 1)[1]
        for rw in ("write", "read"):
            add(
                f"dcp/plugin vs {native}, {rw}",
                _ratio(fig("dcp/plugin", rw), fig(native, rw)),
                0.9,
                "DCP through our plugin against our Checkpointer",
            )
    for tolerates, ours in ((0, "fuse/r1"), (2, "fuse/r3")):
        peers = [
            p
            for p in res.paths
            if p.key.startswith("peer/") and p.available and p.tolerates == tolerates
        ]
        if not peers or res.path(ours) is None:
            continue
        for rw, goal in (("write", 1.5), ("read", 1.0)):
            best = max(
                peers, key=lambda p: getattr(p, rw).throughput_gb_s if getattr(p, rw) else 0.0
            )
            add(
                f"{ours} vs best peer ({best.key}), {rw}",
                _ratio(fig(ours, rw), getattr(best, rw)),
                goal,
                f"same redundancy: {tolerates} failures tolerated",
            )
    return out


# -- presenting --------------------------------------------------------------------------------
def table(res: CheckpointBench) -> Any:
    """The rich table of every path: MLPerf's duration and throughput, and the total rate."""
    from rich.table import Table

    shift = f"rank r reads rank r+{res.read_shift}'s files" if res.read_shift else "own files"
    t = Table(
        title=f"bench checkpoint: {res.model}, {res.ranks} ranks, scale {res.scale:g} "
        f"({res.total_bytes / GB:.2f} GB in {res.files} files), {res.writes} writes and "
        f"{res.reads} reads x {res.runs} runs (mean); reads "
        f"{'cold' if res.cold_reads else 'warm'}, {shift}"
    )
    t.add_column("path", no_wrap=True)
    # Seconds are in the JSON (duration_s): with the bytes in the title they say no more.
    cols = ("write GB/s", "(wall)", "read GB/s", "(wall)", "vs raw w/r")
    for c in cols:
        t.add_column(c, justify="right")
    raw = res.path("raw")
    skipped, faster = [], []
    for p in res.paths:
        if not p.available:
            t.add_row(p.key, "[dim]not run[/dim]", *[""] * (len(cols) - 1))
            skipped.append(f"{p.key}: {p.reason}")
            continue
        cells = [p.key]
        for f in (p.write, p.read):
            cells += ["", ""] if f is None else [f"{f.throughput_gb_s:.3f}", f"{f.total_gb_s:.3f}"]
        vs = [
            _ratio(p.write, raw.write if raw else None),
            _ratio(p.read, raw.read if raw else None),
        ]
        cells.append("/".join("-" if v is None else f"{v:.2f}" for v in vs))
        t.add_row(*cells)
        if p.key != "raw" and any(v is not None and v > 1 for v in vs):
            faster.append(p.key)
    return with_legend(
        t,
        "GB/s = the checkpoint's bytes / the slowest rank's time (MLPerf's throughput); "
        "(wall) = the bytes / the whole operation's time, a commit or drain included.",
        "vs raw w/r = this path's write / read GB/s over the raw path's in this run, not "
        "divided by the encoding's storage overhead.",
        beyond_raw(
            faster,
            streams="every rank's files at once, and for our client each chunk a file on "
            "another node's disk",
            warm_reads=not res.cold_reads,
        ),
        f"Not run: {'; '.join(skipped)}." if skipped else None,
    )


def targets_table(res: CheckpointBench) -> Any:
    from rich.table import Table

    t = Table(title="targets (issue 7)")
    for c in ("target", "measured", "goal", "met"):
        t.add_column(c)
    for g in res.targets:
        met = "n/a" if g.met is None else ("[green]yes[/green]" if g.met else "[red]no[/red]")
        t.add_row(g.name, "-" if g.value is None else f"{g.value:.2f}", f">= {g.goal:g}", met)
    return t


def plot(res: CheckpointBench, directory: Path) -> list[Path]:
    """Two PNGs: GB/s per path (write and read), and each path's rate over the raw disk's."""
    from bench.plotting import bars

    ran = [p for p in res.paths if p.available and p.write is not None]
    labels = [p.key for p in ran]
    title = f"{res.model}, {res.ranks} ranks, {res.total_bytes / GB:.2f} GB"
    out = [
        bars(
            directory / f"checkpoint-{res.model}-throughput.png",
            title=f"checkpoint throughput (MLPerf: bytes / slowest rank): {title}",
            labels=labels,
            series={
                "write": [p.write.throughput_gb_s if p.write else 0.0 for p in ran],
                "read": [p.read.throughput_gb_s if p.read else 0.0 for p in ran],
            },
            ylabel="GB/s",
        )
    ]
    raw = res.path("raw")
    if raw is not None and raw.write is not None:
        out.append(
            bars(
                directory / f"checkpoint-{res.model}-vs-raw.png",
                title=f"ratio to the raw disk: {title}",
                labels=labels,
                series={
                    "write": [_ratio(p.write, raw.write) or 0.0 for p in ran],
                    "read": [_ratio(p.read, raw.read) or 0.0 for p in ran],
                },
                ylabel="x raw disk",
                limit=1.0,
                limit_label="raw disk",
            )
        )
    return out


SCHEMA = schema_of(CheckpointBench, SCHEMA_ID, "tectonic-emu bench checkpoint --json")

__all__ = [
    "DEFAULT_PATHS",
    "SCHEMA",
    "BenchError",
    "CheckpointBench",
    "run_checkpoint_bench",
    "plot",
    "table",
    "targets",
    "targets_table",
]
