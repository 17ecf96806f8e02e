"""``tectonic-emu bench checkpoint``: MLPerf Storage v2.0's checkpointing workload, through
every path a user could take, in one run.

The files are those DLIO writes for the model (``clients/ckpt_models.py``: fp16 weights, fp32
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

This module is the run and the public face; the rest is one module per concept:
``bench/ckpt_workload.py`` (the bytes: the plan's files in one buffer, the read buffer),
``bench/ckpt_paths.py`` (each path's save, load and delete, and how a run sets each up) and
``bench/ckpt_report.py`` (the result types, the targets, the tables and the plots).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.ckpt_paths import (
    DEFAULT_PATHS,
    FilesRoute,
    NativeRoute,
    RawRoute,
    Route,
    hosts_cluster,
    peer_route,
    redundancy,
    torch_routes,
)
from bench.ckpt_report import (
    SCHEMA,
    SCHEMA_ID,
    CheckpointBench,
    Figures,
    PathResult,
    Sample,
    Target,
    plot,
    table,
    targets,
    targets_table,
)
from bench.ckpt_workload import GB, BenchError, Payload
from bench.store import drop_caches
from clients.ckpt_models import checkpoint_plan
from tectonic_emu import Cluster
from tectonic_emu.coding import Encoding


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
                routes += torch_routes(paths, pool, local, mnt, root, client, dcp_enc)
            if hosts:
                across = await hosts_cluster(
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
                routes_or_reason = await peer_route(name, pool, work, stack, step)
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


__all__ = [
    "DEFAULT_PATHS",
    "SCHEMA",
    "SCHEMA_ID",
    "BenchError",
    "CheckpointBench",
    "Figures",
    "FilesRoute",
    "PathResult",
    "Payload",
    "Sample",
    "Target",
    "run_checkpoint_bench",
    "plot",
    "table",
    "targets",
    "targets_table",
]
