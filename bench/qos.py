"""``tectonic-emu bench qos``: a checkpoint burst beside a data loader, with and without QoS.

On one served cluster (3 nodes of one disk each, ``r3``), two jobs in processes of their own
(``bench/qos_worker.py``): a **gold** data loader (``accelerators`` emulated h100s reading a
scaled unet3d dataset through ``ShardStream``, computing 0.323 s per batch) and a **bronze**
multi-rank checkpoint (``ranks`` ranks of a ``Checkpointer`` saving ``checkpoint_bytes``).
Each round runs, in turn (the order of the last three rotating):

- ``loader alone`` and ``checkpoint alone``, on nodes that fair-queue (one group each);
- ``together, off``: the nodes have no scheduler; requests go straight to the disks;
- ``together, fifo``: the same slots per disk as with QoS, first come first served;
- ``together, fair``: weighted fair queueing in disk time (gold 16 : bronze 1).

Figures: the loader's MB/s and AU over the burst (the checkpoint's save, start to commit);
the checkpoint's seconds and GB/s; each class's share of the disks' time over the burst
(the nodes' charges). Targets (issue 23): with fair queueing the loader keeps >= 90% of its
solo throughput during the burst, and the checkpoint gets >= 80% of what the loader leaves
(its solo throughput times the share of the disks' time the loader leaves when alone);
without, the loss shows.

The nodes' disks take a modelled device's time (``--disk-model``, default ``hdd``: each
node one disk of ``sim/devices.py``'s HDD, in real time) so that, as on a cluster, the
disks are what the jobs share. On this machine's own disk (``--disk-model none``) the two
jobs first share its two cores, which no storage-side scheduler divides (docs/qos.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.schema import schema_of
from bench.tables import with_legend
from clients.dataset import generate
from clients.workloads import UNET3D
from tectonic_emu import Cluster
from tectonic_emu.chunkstore import StorageNode
from tectonic_emu.served import Serving
from tectonic_emu.status import qos_status

CASES = ("loader alone", "checkpoint alone", "together, off", "together, fifo", "together, fair")
COMPUTE_S = UNET3D.accelerator("h100").computation_time
BATCH = UNET3D.accelerator("h100").batch_size
LEAD_S = 4.0  # the loader runs this long before the burst (its warm-up and steady state)
GOLD, BRONZE = "loader:gold", "ckpt:bronze"
NODES = 3  # of one disk each

# Ranks saving the checkpoint. A burst from many ranks queues deeper at each disk than the
# loader's readahead: with 8, disks serving in order still left the loader all of its solo
# throughput without a scheduler; with 32 it kept 66% (2026-12-07, docs/qos.md).
RANKS = 32


@dataclass(slots=True)
class Phase:
    """One case of one round."""

    case: str
    loader_mb_s: float | None = None  # over the burst (alone: over its steady state)
    loader_au: float | None = None
    checkpoint_s: float | None = None
    checkpoint_gb_s: float | None = None
    gold_share: float | None = None  # of the disks' time charged over the burst
    bronze_share: float | None = None
    # Alone: the share of the disks' time the loader's requests were charged (their
    # modelled device-seconds per second, over the 3 disks).
    loader_disk_use: float | None = None


@dataclass(slots=True)
class QosBench:
    disk_model: str
    depth: int
    accelerators: int
    checkpoint_bytes: int
    checkpoint_ranks: int
    dataset_bytes: int
    rounds: int
    phases: list[Phase]
    # Medians over rounds, per case (None where a case has no such figure).
    median: dict[str, Phase]
    gold_kept: float  # loader MB/s, together with fair queueing / alone
    gold_kept_fifo: float
    gold_kept_off: float
    # checkpoint GB/s with fair queueing / (its GB/s alone x (1 - the loader's disk use))
    bronze_of_leftover: float
    loadavg: list[float]
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _worker(job: str, args: dict[str, Any]) -> subprocess.Popen[bytes]:
    """``bench/qos_worker.py``'s ``job``; a loader stops when its standard input closes."""
    return subprocess.Popen(
        [sys.executable, "-m", "bench.qos_worker", job, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
    )


def _result(proc: subprocess.Popen[bytes], what: str) -> dict[str, Any]:
    out, _ = proc.communicate()  # (closes its standard input: a loader stops)
    if proc.returncode != 0:
        raise RuntimeError(f"bench qos: the {what} exited with {proc.returncode}")
    got: dict[str, Any] = json.loads(out)
    return got


def loader_figures(
    steps: Sequence[Sequence[float]], lo: float, hi: float, ranks: int
) -> tuple[float, float]:
    """(MB/s, AU) of the loader over [lo, hi): the bytes of the batches it got then, and
    the share of the ranks' time spent computing then."""
    span = max(hi - lo, 1e-9)
    got = sum(s[3] for s in steps if lo <= s[2] < hi)
    computing = sum(max(0.0, min(s[2] + COMPUTE_S, hi) - max(s[2], lo)) for s in steps)
    return round(got / span / 1e6, 1), round(computing / (ranks * span), 4)


async def _charged(nodes: Sequence[StorageNode]) -> dict[str, float]:
    """Each group's disk time charged so far, over every node."""
    groups = (await qos_status(nodes))["groups"]
    return {name: float(g["charged_s"]) for name, g in groups.items()}


@dataclass(slots=True)
class _Setup:
    root: Path
    accelerators: int
    checkpoint_bytes: int
    ranks: int
    steps: int = 0


def _loader(s: _Setup) -> subprocess.Popen[bytes]:
    args = {"cluster": str(s.root), "path": "/data", "ranks": s.accelerators, "batch": BATCH}
    args |= {"compute_s": COMPUTE_S, "group": GOLD}
    return _worker("loader", args)


async def _burst(
    s: _Setup, lead: float, nodes: Sequence[StorageNode]
) -> tuple[dict[str, Any], dict[str, float] | None]:
    """Save one checkpoint, starting ``lead`` seconds from now; its times, and each
    group's disk time charged over it (None when the nodes keep no figures)."""
    s.steps += 1
    start = time.monotonic() + lead
    args = {"cluster": str(s.root), "root": "/ckpt", "ranks": s.ranks, "step": s.steps}
    args |= {"bytes_per_rank": s.checkpoint_bytes // s.ranks, "start_at": start}
    proc = _worker("checkpoint", args | {"group": BRONZE})
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    before = await _charged(nodes)
    ckpt = await asyncio.to_thread(_result, proc, "checkpoint")
    after = await _charged(nodes)
    if not after:
        return ckpt, None
    return ckpt, {g: after[g] - before.get(g, 0.0) for g in after}


async def _case(s: _Setup, case: str, alone_s: float) -> Phase:
    mode = case.rsplit(", ", 1)[1] if case.startswith("together") else "fair"
    # One client of the served nodes for the whole case, to read their figures.
    with Serving(s.root, repair_interval=0, qos=mode):
        async with Cluster.open(s.root) as c:
            return await _measure(s, case, alone_s, c.nodes)


async def _measure(s: _Setup, case: str, alone_s: float, nodes: Sequence[StorageNode]) -> Phase:
    phase = Phase(case)
    loader = None if case == "checkpoint alone" else _loader(s)
    if case == "loader alone":
        await asyncio.sleep(LEAD_S / 2)  # its start-up
        lo, before = time.monotonic(), await _charged(nodes)
        await asyncio.sleep(max(alone_s - LEAD_S / 2, 1.0))
        hi, after = time.monotonic(), await _charged(nodes)
        steps = (await asyncio.to_thread(_result, loader, "loader"))["steps"]
        mb, au = loader_figures(steps, lo, hi, s.accelerators)
        phase.loader_mb_s, phase.loader_au = mb, au
        used = after.get("loader", 0.0) - before.get("loader", 0.0)
        phase.loader_disk_use = round(used / ((hi - lo) * NODES), 4)
        return phase
    ckpt, charged = await _burst(s, LEAD_S if loader is not None else 1.0, nodes)
    began, ended = ckpt["began"], ckpt["ended"]
    phase.checkpoint_s = round(ended - began, 3)
    phase.checkpoint_gb_s = round(ckpt["bytes"] / (ended - began) / 1e9, 4)
    if charged:
        total = sum(charged.values()) or 1.0
        phase.gold_share = round(charged.get("loader", 0.0) / total, 4)
        phase.bronze_share = round(charged.get("ckpt", 0.0) / total, 4)
    if loader is not None:
        steps = (await asyncio.to_thread(_result, loader, "loader"))["steps"]
        mb, au = loader_figures(steps, began, ended, s.accelerators)
        phase.loader_mb_s, phase.loader_au = mb, au
    return phase


def _median(phases: Sequence[Phase], case: str) -> Phase:
    mine = [p for p in phases if p.case == case]
    out = Phase(case)
    for f in dataclasses.fields(Phase):
        values = [getattr(p, f.name) for p in mine if getattr(p, f.name) is not None]
        if f.name != "case" and values:
            setattr(out, f.name, round(statistics.median(values), 4))
    return out


def _ratio(a: float | None, b: float | None) -> float:
    return round(a / b, 3) if a is not None and b else 0.0


async def run_qos_bench(
    *,
    directory: Path,
    disk_model: str = "hdd",
    depth: int = 2,
    accelerators: int = 2,
    checkpoint_bytes: int = 1 << 30,
    ranks: int = RANKS,
    records: int = 300,
    rounds: int = 3,
    alone_s: float = 10.0,
    step: Callable[..., None] = lambda *_: None,
) -> QosBench:
    """See the module docstring. ``records``: the dataset's unet3d records (4.6 MB each)."""
    work = Path(tempfile.mkdtemp(prefix="tectonic-qos-bench-", dir=directory))
    try:
        root = work / "cluster"
        model = "" if disk_model == "none" else disk_model
        Cluster.create(
            root, nodes=NODES, disks_per_node=1, encoding="r3", qos_depth=depth, disk_model=model
        )
        shaped = dataclasses.replace(UNET3D, files=math.ceil(records * 32))
        step("writing the dataset")
        async with Cluster.open(root) as c:
            index = await generate(c.client(), shaped, 1 / 32, "/data")
        s = _Setup(root, accelerators, checkpoint_bytes, ranks)
        phases: list[Phase] = []
        together = list(CASES[2:])
        for r in range(rounds):
            order = [*CASES[:2], *together[r % 3 :], *together[: r % 3]]
            for i, case in enumerate(order):
                step(f"round {r + 1}/{rounds}: {case}", (r * len(CASES) + i) / (rounds * 5))
                phases.append(await _case(s, case, alone_s))
        median = {case: _median(phases, case) for case in CASES}
        alone, ckpt_alone = median["loader alone"], median["checkpoint alone"]
        fair = median["together, fair"]
        use, solo = alone.loader_disk_use, ckpt_alone.checkpoint_gb_s
        leftover = solo * (1 - use) if solo and use is not None and use < 1 else None
        return QosBench(
            disk_model=disk_model,
            depth=depth,
            accelerators=accelerators,
            checkpoint_bytes=checkpoint_bytes,
            checkpoint_ranks=ranks,
            dataset_bytes=index.nbytes,
            rounds=rounds,
            phases=phases,
            median=median,
            gold_kept=_ratio(fair.loader_mb_s, alone.loader_mb_s),
            gold_kept_fifo=_ratio(median["together, fifo"].loader_mb_s, alone.loader_mb_s),
            gold_kept_off=_ratio(median["together, off"].loader_mb_s, alone.loader_mb_s),
            bronze_of_leftover=_ratio(fair.checkpoint_gb_s, leftover),
            loadavg=[round(x, 2) for x in os.getloadavg()],
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(res: QosBench) -> Table:
    """Medians per case (80 columns)."""
    t = Table(
        title=f"bench qos: {res.accelerators} gold loaders, a bronze "
        f"{res.checkpoint_bytes / 1e9:.1f} GB checkpoint; disks: {res.disk_model}, "
        f"depth {res.depth}; median of {res.rounds}",
    )
    for col in ("case", "loader MB/s", "AU", "ckpt s", "ckpt GB/s", "gold", "bronze"):
        t.add_column(col, justify="left" if col == "case" else "right")
    for case, p in res.median.items():
        t.add_row(
            case,
            _cell(p.loader_mb_s, ".0f"),
            _cell(p.loader_au, ".1%"),
            _cell(p.checkpoint_s, ".2f"),
            _cell(p.checkpoint_gb_s, ".3f"),
            _cell(p.gold_share, ".0%"),
            _cell(p.bronze_share, ".0%"),
        )
    return with_legend(
        t,
        "loader MB/s and AU over the burst (alone: its steady state); gold, bronze: each "
        "class's share of the disks' time charged over the burst.",
        f"The loader alone used {_cell(res.median['loader alone'].loader_disk_use, '.0%')} "
        "of the disks' time.",
        f"gold kept: {res.gold_kept:.0%} with fair queueing (target >= 90%), "
        f"{res.gold_kept_fifo:.0%} fifo, {res.gold_kept_off:.0%} with no scheduler.",
        f"bronze got {res.bronze_of_leftover:.0%} of what the loader left (target >= 80%).",
        f"load average {res.loadavg}, {res.cpu_count} cores.",
    )


def plot(res: QosBench, directory: Path) -> list[Path]:
    """``qos.png``: loader MB/s and checkpoint GB/s per case (medians)."""
    from clients.plotting import bars

    cases = [c for c in res.median if c != "checkpoint alone"]
    return [
        bars(
            directory / "qos.png",
            title=f"qos: gold loader during a bronze checkpoint ({res.disk_model} disks)",
            labels=cases,
            series={"loader MB/s": [res.median[c].loader_mb_s or 0.0 for c in cases]},
            ylabel="MB/s",
        )
    ]


SCHEMA = schema_of(QosBench, "tectonic-emu/bench-qos/1", "tectonic-emu bench qos --json")

__all__ = ["CASES", "SCHEMA", "QosBench", "loader_figures", "plot", "run_qos_bench", "table"]
