"""``tectonic-emu bench sim``: projections beside real runs on this machine (issue 20).

The ``this-machine`` preset is measured here, at the start of each run, by the code the
real runs use:

- **the device:** its bandwidth by fio, direct I/O (no page cache, so no CPU copying
  pages: that is charged as the nodes' ``copy`` work), 8 MiB requests, ``QUEUE_DEPTH`` at
  once; its small operations by a real ``LocalNode`` writing (with fdatasync) and reading
  back (page cache dropped, as root) 4 KiB chunks at that depth. Every node's disks are
  this one device, and the nodes' CPU work is the client's (``Hardware.embedded``);
- **a node call:** a ``LocalNode.stat_chunk`` round trip through its I/O pool, the price
  of every call, as the fabric's round trip (embedded nodes have no network);
- **metadata:** a SQLite store's transactions one after another (their time is the
  shard's round trip), its reads in one transaction (their rate is the shard's), and a
  page of its WAL synced on the device by each transaction that writes (sharing the device
  with the chunks, as SQLite's file does);
- **the client's CPU:** ``CpuModel.measure()`` on this machine's cores; embedded nodes
  have no wire, so frames cost no CPU.

Then each scenario runs for real (an embedded cluster in ``directory``, the real
``Checkpointer``, DLIO's files for llama3-8b scaled by ``scale``, random bytes) and
projected (the same files as ``Synthetic`` values on ``this-machine``, in virtual time).
Real runs take ``runs`` rounds, scenarios interleaved; the report gives each real
duration's min/median/max, the projection, and the projection over the median. Target
(issue 20): within 15%.

Scenarios: r1, r3 and rs-6-3 saves at 16 and 1,024 ranks, each followed by every rank's
load of it, and an rs-6-3 save with a node stopped ``FAIL_AT_S`` into it. What is not here
yet: a slow node with hedging (only a served node can be slowed; served runs need a
served-machine preset with the loopback network and the nodes' CPU).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.progress import Stages, Step, no_step
from bench.schema import schema_of
from bench.store import drop_caches
from bench.tables import with_legend
from clients.checkpoint import Checkpointer
from clients.ckpt_models import checkpoint_plan
from clients.projection import Scenario, project_checkpoint
from tectonic_emu import Cluster
from tectonic_emu.chunkstore import LocalNode
from tectonic_emu.coding import crc32c
from tectonic_emu.config import DEFAULT_BLOCK_SIZE
from tectonic_emu.metadata import SQLiteKV
from tectonic_emu.sim.cluster import Hardware
from tectonic_emu.sim.cpu import CpuModel
from tectonic_emu.sim.devices import DiskModel
from tectonic_emu.sim.fabric import FabricModel
from tectonic_emu.sim.metadata import MetadataModel

MODEL = "llama3-8b"
NODES, DISKS = 9, 2  # an embedded cluster's (Cluster.create's defaults for rs-6-3)
QUEUE_DEPTH = 8  # chunk operations at once in the device measurement
FAIL_AT_S = 1.0  # seconds into the save when the failure scenario's node stops
TARGET = 0.15


@dataclass(frozen=True, slots=True)
class Machine:
    """What ``this-machine`` is made of, each figure measured in this run."""

    write_gb_s: float  # fio direct 8 MiB writes, QUEUE_DEPTH at once
    read_gb_s: float  # fio direct 8 MiB reads
    write_iops: float  # 4 KiB chunk writes per second, QUEUE_DEPTH at once
    read_iops: float
    call_s: float  # one node call through the I/O pool
    txn_s: float  # one metadata transaction (a read), one after another
    meta_ops: float  # metadata reads per second in one transaction
    cores: int
    cpu_gb_s: dict[str, float]  # per core, each kind of work (CpuModel.measure)
    cold_reads: bool  # whether the page cache could be dropped (root)

    def hardware(self) -> Hardware:
        return Hardware(
            servers=NODES,
            disks=DISKS,
            disk=DiskModel(
                read_bw=self.read_gb_s * 1e9,
                write_bw=self.write_gb_s * 1e9,
                read_iops=self.read_iops,
                write_iops=self.write_iops,
                latency=0.0,
                seek=0.0,
                queue_depth=QUEUE_DEPTH,
                name="this machine's device",
                source="measured by bench sim",
            ),
            # In-process nodes: no NIC to speak of (memory), a call's round trip is the hop.
            fabric=FabricModel(nic_gbps=8_000.0, rtt=self.call_s),
            servers_per_rack=NODES,
            # SQLite on the one device: each write transaction syncs a page of its WAL there.
            metadata=MetadataModel(
                1, self.meta_ops, self.txn_s, "measured: SQLite here", log_bytes=4096
            ),
            cpu=CpuModel(self.cores, self.cpu_gb_s, "measured by bench sim"),
            embedded=True,
        )


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    encoding: str
    ranks: int
    fail: bool = False  # a node stops FAIL_AT_S into the save


def cases(encodings: Sequence[str], ranks: Sequence[int], fail: bool) -> list[Case]:
    """A save of each encoding at each rank count, and with ``fail`` one of rs-6-3 (or the
    last encoding) at the fewest ranks with a node stopped into it."""
    out = [Case(f"{e} save, {n:,} ranks", e, n) for n in ranks for e in encodings]
    if fail:
        e = "rs-6-3" if "rs-6-3" in encodings else encodings[-1]
        out.append(Case(f"{e} save, {min(ranks):,} ranks, node stopped", e, min(ranks), True))
    return out


@dataclass(slots=True)
class Row:
    """One figure: its real durations (one per round), its projection, and the projection
    over the real median."""

    name: str
    real_s: list[float] = field(default_factory=list)
    projected_s: float = 0.0
    ratio: float = 0.0


@dataclass(slots=True)
class SimBench:
    machine: Machine
    scale: float
    runs: int
    rows: list[Row]
    projection_wall_s: float  # all projections together
    load_avg: tuple[float, float, float]
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def measure(directory: Path) -> Machine:
    """``this-machine``'s figures (module docstring), measured in ``directory``."""
    cpu = CpuModel.measure()
    work = Path(tempfile.mkdtemp(prefix="tectonic-sim-machine-", dir=directory))
    pool = concurrent.futures.ThreadPoolExecutor(QUEUE_DEPTH)
    try:
        write_gb_s = await asyncio.to_thread(_fio, work / "raw.bin", "write")
        read_gb_s = await asyncio.to_thread(_fio, work / "raw.bin", "read")
        node = LocalNode(work / "node", 0, 1, executor=pool)
        small = os.urandom(4096)
        write_small = await _chunk_ops(node, "s", small, 256)
        cold = drop_caches()
        read_small = await _chunk_ops(node, "s", small, 256, read=True)
        t0 = time.perf_counter()
        for _ in range(200):
            await node.stat_chunk(0, "s0")
        call_s = (time.perf_counter() - t0) / 200
        await node.close()
        txn_s, meta_ops = await _metadata(work / "meta.db")
    finally:
        pool.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return Machine(
        write_gb_s=write_gb_s,
        read_gb_s=read_gb_s,
        write_iops=256 / write_small,
        read_iops=256 / read_small,
        call_s=call_s,
        txn_s=txn_s,
        meta_ops=meta_ops,
        cores=cpu.cores,
        cpu_gb_s=dict(cpu.gbps),
        cold_reads=cold,
    )


def _fio(path: Path, rw: str, size: int = 512 << 20) -> float:
    """GB/s of fio's direct ``rw`` (write or read) of ``size`` bytes at ``path``, 8 MiB
    requests, QUEUE_DEPTH at once, the writes fsynced at the end."""
    fio = shutil.which("fio")
    if fio is None:
        raise RuntimeError("bench sim measures the device with fio: apt-get install fio")
    cmd = [
        fio,
        "--name=device",
        f"--filename={path}",
        f"--rw={rw}",
        "--bs=8M",
        f"--size={size}",
        "--direct=1",
        "--ioengine=libaio",
        f"--iodepth={QUEUE_DEPTH}",
        "--output-format=json",
    ]
    cmd += ["--end_fsync=1"] if rw == "write" else []
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out[out.index("{") :])["jobs"][0][rw]["bw_bytes"]) / 1e9


async def _chunk_ops(
    node: LocalNode, prefix: str, payload: bytes, count: int, *, read: bool = False
) -> float:
    """Seconds for ``count`` chunk writes (or reads) of ``payload``, QUEUE_DEPTH at once."""
    crc = crc32c(payload)
    gate = asyncio.Semaphore(QUEUE_DEPTH)

    async def one(k: int) -> None:
        async with gate:
            if read:
                await node.read_chunk(0, f"{prefix}{k}")
            else:
                await node.write_chunk(0, f"{prefix}{k}", payload, crc32c=crc)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(count)))
    return time.perf_counter() - t0


async def _metadata(path: Path) -> tuple[float, float]:
    """(seconds per transaction of one read, one after another: the round trip, its sync
    being the device's; reads per second in one transaction)."""
    kv = await SQLiteKV.open(path)
    try:
        async with kv.transaction() as tx:
            for k in range(100):
                await tx.put(b"k%05d" % k, b"v" * 100)
        t0 = time.perf_counter()
        for k in range(200):
            async with kv.transaction() as tx:
                await tx.get(b"k%05d" % (k % 100))
        txn_s = (time.perf_counter() - t0) / 200
        t0 = time.perf_counter()
        async with kv.transaction() as tx:
            for k in range(2000):
                await tx.get(b"k%05d" % (k % 100))
        return txn_s, 2000 / (time.perf_counter() - t0)
    finally:
        await kv.close()


async def _real(case: Case, scale: float, directory: Path) -> tuple[float, float]:
    """(save seconds, load seconds) of ``case`` on an embedded cluster in ``directory``:
    every rank from a common start to its commit, then (caches dropped) every rank's load
    of its own state."""
    plan = checkpoint_plan(MODEL, case.ranks, scale)
    data = memoryview(os.urandom(plan.total))
    states, at = [], 0
    for rank in plan.per_rank:
        state = {}
        for f in rank.files:
            state[f.name], at = data[at : at + f.size], at + f.size
        states.append(state)
    root = Path(tempfile.mkdtemp(prefix="tectonic-sim-real-", dir=directory)) / "cluster"
    try:
        Cluster.create(root, nodes=NODES, disks_per_node=DISKS, encoding=case.encoding)
        async with Cluster.open(root) as cluster:
            ckpt = Checkpointer(cluster.client(), "/ck", world_size=case.ranks)
            if case.fail:
                asyncio.get_running_loop().call_later(FAIL_AT_S, cluster.stop_node, 0)
            t0 = time.perf_counter()
            await asyncio.gather(*(ckpt.save(1, r, s) for r, s in enumerate(states)))
            save = time.perf_counter() - t0
            await cluster.datapath.drain()
            drop_caches()
            t0 = time.perf_counter()
            got = await asyncio.gather(*(ckpt.load(r, 1) for r in range(case.ranks)))
            load = time.perf_counter() - t0
            for r, (loaded, saved) in enumerate(zip(got, states, strict=True)):
                if any(loaded[n] != bytes(v) for n, v in saved.items()):
                    raise RuntimeError(f"{case.name}: rank {r} loaded other bytes than it saved")
            await ckpt.close()
        return save, load
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def _projected(case: Case, scale: float, hw: Hardware) -> tuple[float, float]:
    sc = Scenario(
        MODEL,
        case.ranks,
        case.encoding,
        hw,
        ranks_per_host=case.ranks,  # one process: one host, one Checkpointer
        block_size=DEFAULT_BLOCK_SIZE,
        scale=scale,
        write_ack="all",  # an embedded cluster's
        fail_servers=1 if case.fail else 0,
        fail_at=FAIL_AT_S if case.fail else 0.0,
    )
    p = project_checkpoint(sc)
    assert p.load is not None
    return p.duration_s, p.load.duration_s


async def run_sim_bench(
    *,
    directory: Path,
    scale: float = 0.01,
    runs: int = 3,
    encodings: Sequence[str] = ("r1", "r3", "rs-6-3"),
    ranks: Sequence[int] = (16, 1024),
    fail: bool = True,
    step: Step = no_step,
) -> SimBench:
    todo = cases(encodings, ranks, fail)
    stage = Stages(step, 1 + len(todo) * (runs + 1))
    stage("measuring this machine")
    machine = await measure(directory)
    hw = machine.hardware()
    rows: dict[str, Row] = {}
    t0 = time.perf_counter()
    for case in todo:
        stage(f"projecting {case.name}")
        save, load = await asyncio.to_thread(_projected, case, scale, hw)
        rows[case.name] = Row(case.name, projected_s=save)
        if not case.fail:
            rows[f"{case.name}: load"] = Row(f"{case.name}: load", projected_s=load)
    wall = time.perf_counter() - t0
    for rnd in range(runs):
        for case in todo:
            stage(f"round {rnd + 1}/{runs}: {case.name}")
            save, load = await _real(case, scale, directory)
            rows[case.name].real_s.append(save)
            if not case.fail:
                rows[f"{case.name}: load"].real_s.append(load)
    for row in rows.values():
        row.ratio = row.projected_s / statistics.median(row.real_s) if row.real_s else 0.0
    return SimBench(machine, scale, runs, list(rows.values()), wall, os.getloadavg())


def table(res: SimBench) -> Table:
    t = Table(
        title=f"{MODEL} x {res.scale:g} on this machine, seconds",
        title_justify="left",
    )
    for col in ("scenario", "real", "projected", "ratio"):
        t.add_column(col, justify="left" if col == "scenario" else "right")
    for row in res.rows:
        real = sorted(row.real_s)
        ok = abs(row.ratio - 1) <= TARGET
        t.add_row(
            row.name,
            f"{real[0]:.2f}/{statistics.median(real):.2f}/{real[-1]:.2f}" if real else "-",
            f"{row.projected_s:.2f}",
            f"{row.ratio:.2f}" + ("" if ok else " *"),
        )
    m = res.machine
    return with_legend(
        t,
        "real = min/median/max of the rounds; ratio = projected / real median "
        f"(* : beyond the {TARGET:.0%} target)",
        f"this machine: device {m.write_gb_s:.2f} GB/s write, {m.read_gb_s:.2f} read"
        f"{'' if m.cold_reads else ' (warm: not root)'}; {m.write_iops:,.0f}/{m.read_iops:,.0f}"
        f" small ops/s; a node call {m.call_s * 1e6:,.0f} us; a metadata transaction "
        f"{m.txn_s * 1e3:.2f} ms; {m.cores} cores",
        f"load average {res.load_avg[0]:.1f}; projections took {res.projection_wall_s:.1f} s",
    )


def plot(res: SimBench, directory: Path) -> list[Path]:
    from clients.plotting import bars

    return [
        bars(
            directory / "sim.png",
            title="Projections beside real runs on this machine (1 = exact)",
            labels=[r.name for r in res.rows],
            series={"projected / real median": [r.ratio for r in res.rows]},
            ylabel="ratio",
            limit=1.0,
            limit_label="exact",
        )
    ]


SCHEMA = schema_of(SimBench, "tectonic-emu/bench-sim/1", "tectonic-emu bench sim --json")

__all__ = [
    "SCHEMA",
    "Case",
    "Machine",
    "Row",
    "SimBench",
    "cases",
    "measure",
    "plot",
    "run_sim_bench",
    "table",
]
