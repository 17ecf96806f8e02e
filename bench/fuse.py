"""``tectonic-emu bench fuse``: the FUSE mount beside the native client and the local disk.

In one run, per round, with the same random bytes:

- **local disk**: ``os.write`` of 1 MiB pieces to a file beside the cluster, ``fsync``, then
  1 MiB ``readinto`` calls after dropping the page cache;
- **native client**: an ``open_writer`` appending 1 MiB pieces, closed; ``read_into`` of the
  whole file into a reused buffer (the client's fast path);
- **mount**: the same 1 MiB ``write`` calls through the mount (``tectonic-emu mount`` in a
  child process), ``fsync``, ``close``; 1 MiB ``readinto`` calls after dropping the cache;
- **mount --direct-io**: the same through a second mount of the cluster in direct-I/O mode
  (no kernel page cache).

The mount processes and this one open the cluster at the same time (embedded: all read and
write the node directories; SQLite serialises the metadata), each on its own files.
The target of issue 4 is ``mount_vs_native`` >= 0.7 for write and for read.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.fits import in_flight, stored_bytes
from bench.progress import Stages, Step, no_step
from bench.schema import schema_of
from bench.store import aligned_buffer, drop_caches, mb_s, size_text, write_durably
from bench.tables import beyond_raw, with_legend
from bench.targets import target
from bench.targets import targets_table as shared_targets_table
from fuse_mount.mount import start_mount, unmount
from tectonic_emu import Cluster
from tectonic_emu.coding import Encoding
from tectonic_emu.resources import Needs, check_fits

IO = 1 << 20


@dataclass(slots=True)
class FuseBench:
    size: int
    encoding: str
    runs: int
    cold_reads: bool
    local_write_mb_s: float
    local_read_mb_s: float
    native_write_mb_s: float
    native_read_mb_s: float
    mount_write_mb_s: float
    mount_read_mb_s: float
    mount_vs_native_write: float
    mount_vs_native_read: float
    direct_write_mb_s: float
    direct_read_mb_s: float
    direct_vs_native_write: float
    direct_vs_native_read: float
    runs_mb_s: dict[str, list[float]] = field(default_factory=dict)
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _write_file(path: Path, data: memoryview) -> float:
    t0 = time.perf_counter()
    write_durably(path, data)
    return time.perf_counter() - t0


def _read_file(path: Path, buf: memoryview) -> float:
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        off = 0
        while off < len(buf):
            n = f.readinto(buf[off : off + IO])
            if not n:
                break
            off += n
    return time.perf_counter() - t0


def needs(size: int, encoding: str) -> Needs:
    """What a run of ``size`` bytes holds at its peak (``bench.fits``). Memory: the random
    bytes and the read-back buffer (``os.urandom``'s transient copy is gone before the
    buffer exists), and blocks in flight in this process and in each of the two mount
    processes. Disk: one file at a time (local, native, then each mount's, each deleted
    before the next)."""
    return Needs(
        2 * size + 3 * in_flight(encoding, nbytes=size),
        max(size, stored_bytes(size, encoding)),
    )


async def run_fuse_bench(
    *,
    size: int,
    encoding: str,
    directory: Path,
    runs: int = 3,
    step: Step = no_step,
) -> FuseBench:
    """Raises InvalidArgumentError or NoSpaceError, before allocating anything, when
    ``size`` does not fit (``bench.fits``)."""
    check_fits(size, lambda n: needs(n, encoding), directory)
    work = Path(tempfile.mkdtemp(prefix="tectonic-fuse-bench-", dir=directory))
    procs = []
    mnt, dmnt = work / "mnt", work / "mnt-direct"
    try:
        data = aligned_buffer(size)
        data[:] = os.urandom(size)
        buf = aligned_buffer(size)
        root = work / "cluster"
        Cluster.create(root, nodes=max(9, Encoding.parse(encoding).width), encoding=encoding)
        mnt.mkdir()
        dmnt.mkdir()
        step("mounting")
        procs.append(await asyncio.to_thread(start_mount, root, mnt, log=work / "mount.log"))
        procs.append(
            await asyncio.to_thread(
                start_mount, root, dmnt, direct_io=True, log=work / "mount-direct.log"
            )
        )
        keys = ("local", "native", "mount", "direct")
        per: dict[str, list[float]] = {f"{k}_{rw}": [] for k in keys for rw in "wr"}
        cold = False
        stage = Stages(step, (runs + 1) * len(keys))
        async with Cluster.open(root) as cluster:
            client = cluster.client()
            for rnd in range(runs + 1):
                label = "warm-up" if rnd == 0 else f"run {rnd}/{runs}"
                stage(f"{label}: local disk")
                w = await asyncio.to_thread(_write_file, work / "local.bin", data)
                cold = drop_caches()
                r = await asyncio.to_thread(_read_file, work / "local.bin", buf)
                assert buf == data, "local read-back differs"
                (work / "local.bin").unlink()
                stage(f"{label}: native client")
                t0 = time.perf_counter()
                async with client.open_writer("/native") as writer:
                    for off in range(0, size, IO):
                        await writer.append(data[off : off + IO])
                await cluster.datapath.drain()
                nw = time.perf_counter() - t0
                drop_caches()
                t0 = time.perf_counter()
                await client.read_into("/native", 0, buf)
                nr = time.perf_counter() - t0
                assert buf == data, "native read-back differs"
                await client.delete("/native")
                timed = [w, r, nw, nr]
                for where, name in ((mnt, "mount"), (dmnt, "mount --direct-io")):
                    stage(f"{label}: {name}")
                    timed.append(await asyncio.to_thread(_write_file, where / "mounted", data))
                    drop_caches()
                    timed.append(await asyncio.to_thread(_read_file, where / "mounted", buf))
                    assert buf == data, f"{name}: read-back differs"
                    (where / "mounted").unlink()
                if rnd:
                    for key, secs in zip(per, timed, strict=True):
                        per[key].append(mb_s(size, secs))
        med = {k: statistics.median(v) for k, v in per.items()}
        return FuseBench(
            size,
            encoding,
            runs,
            cold,
            med["local_w"],
            med["local_r"],
            med["native_w"],
            med["native_r"],
            med["mount_w"],
            med["mount_r"],
            round(med["mount_w"] / med["native_w"], 3),
            round(med["mount_r"] / med["native_r"], 3),
            med["direct_w"],
            med["direct_r"],
            round(med["direct_w"] / med["native_w"], 3),
            round(med["direct_r"] / med["native_r"], 3),
            per,
        )
    finally:
        for where, proc in zip((mnt, dmnt), procs, strict=False):
            await asyncio.to_thread(unmount, where)
            await asyncio.to_thread(proc.wait, 30)
        shutil.rmtree(work, ignore_errors=True)


def _paths(res: FuseBench) -> list[tuple[str, float, float]]:
    """(path, write MB/s, read MB/s) of every path, in the order of the table."""
    return [
        ("local disk", res.local_write_mb_s, res.local_read_mb_s),
        ("native client", res.native_write_mb_s, res.native_read_mb_s),
        ("mount", res.mount_write_mb_s, res.mount_read_mb_s),
        ("mount --direct-io", res.direct_write_mb_s, res.direct_read_mb_s),
    ]


def table(res: FuseBench) -> Table:
    """MB/s of each path, and the two mounts against the native client."""
    t = Table(
        title=f"bench fuse: {size_text(res.size)} of {res.encoding}, 1 MiB I/O, "
        f"{res.runs} runs (median)"
    )
    for col in ("path", "write MB/s", "read MB/s"):
        t.add_column(col, justify="right")
    beside_native = {  # each mount is followed by its ratio to the native client
        "mount": ("mount / native", res.mount_vs_native_write, res.mount_vs_native_read),
        "mount --direct-io": (
            "direct-io / native",
            res.direct_vs_native_write,
            res.direct_vs_native_read,
        ),
    }
    for name, w, r in _paths(res):
        t.add_row(name, f"{w:.0f}", f"{r:.0f}")
        if name in beside_native:
            label, rw, rr = beside_native[name]
            t.add_row(label, f"{rw:.2f}", f"{rr:.2f}")
    local_w, local_r = res.local_write_mb_s, res.local_read_mb_s
    faster = [name for name, w, r in _paths(res)[1:] if w > local_w or r > local_r]
    return with_legend(
        t,
        "mount / native, direct-io / native = that mount's write and read MB/s over the "
        "native client's, same rounds (the target: at least 0.7). local disk is the raw "
        "limit: the same 1 MiB writes to one file, fsync, 1 MiB reads.",
        beyond_raw(
            faster,
            streams="blocks in flight, each chunk a file on another node's disk",
            warm_reads=not res.cold_reads,
        ),
    )


def targets(res: FuseBench) -> list[dict[str, Any]]:
    """Issue 22's goals for sequential reads through the mount, as ratios to the native
    client in the same run."""
    return [
        target(
            "page-cache mount read / native",
            res.mount_vs_native_read,
            0.8,
            detail="sequential 1 MiB reads, cold: ratio of the median MB/s",
        ),
        target(
            "--direct-io mount read / native",
            res.direct_vs_native_read,
            1.0,
            detail="sequential 1 MiB reads, cold: ratio of the median MB/s",
        ),
    ]


def targets_table(res: FuseBench) -> Table:
    return shared_targets_table("bench fuse: targets (issue 22)", targets(res))


def plot(res: FuseBench, directory: Path) -> list[Path]:
    """``fuse-throughput.png``: write and read MB/s of each path."""
    from clients.plotting import bars

    paths = _paths(res)
    return [
        bars(
            directory / "fuse-throughput.png",
            title=f"fuse: {size_text(res.size)} of {res.encoding}, 1 MiB I/O, "
            f"reads {'cold' if res.cold_reads else 'warm'}",
            labels=[name for name, _, _ in paths],
            series={"write": [w for _, w, _ in paths], "read": [r for _, _, r in paths]},
            ylabel="MB/s",
        )
    ]


SCHEMA = schema_of(FuseBench, "tectonic-emu/bench-fuse/1", "tectonic-emu bench fuse --json")

__all__ = ["SCHEMA", "FuseBench", "plot", "run_fuse_bench", "table", "targets", "targets_table"]
