"""``tectonic-emu bench train``: how many emulated accelerators the storage keeps busy.

MLPerf Storage's question on this machine: the largest number of emulated h100 accelerators
that keep accelerator utilization (AU) >= 90% on a scaled unet3d-like dataset, reading

- through the native client (``ShardStream`` on the store),
- through fsspec (``clients/fsspec.py``'s ``tectonic`` filesystem),
- straight from local disk (a copy of the same shards in a local directory),

in one run. For each source the count doubles from 1 while AU holds, then a binary search
finds the largest that passes. The page cache is dropped before every trial (root only).

The dataset keeps unet3d's batch (7) and computation time per batch (0.323 s on h100), with
records scaled by ``record_scale`` (146.6 MB x 1/32 = 4.6 MB: each accelerator then asks for
99 MB/s) and ``samples`` records in all. The target of issue 6: native >= 0.8x local.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.schema import schema_of
from bench.store import drop_caches
from bench.tables import with_legend
from clients.dataset import generate
from clients.simulate import FsspecSource, LocalSource, TrainReport, train
from clients.workloads import UNET3D
from tectonic_emu import Cluster

DATA = "/bench/unet3d"


@dataclass(slots=True)
class TrainBench:
    record_bytes: int
    samples: int
    epochs: int
    max_accelerators: dict[str, int]
    native_vs_local: float
    trials: dict[str, list[TrainReport]] = field(default_factory=dict)  # every trial run
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def largest_passing(
    trial: Callable[[int], Awaitable[TrainReport]], limit: int = 512
) -> tuple[int, list[TrainReport]]:
    """The largest n in [1, limit] for which ``trial(n).passed``, assuming it passes up to some
    n and fails beyond (0 if even 1 fails); the reports of every trial run."""
    reports: list[TrainReport] = []

    async def ok(n: int) -> bool:
        reports.append(await trial(n))
        return reports[-1].passed

    if not await ok(1):
        return 0, reports
    good, bad = 1, None
    while bad is None and good < limit:
        n = min(limit, good * 2)
        if await ok(n):
            good = n
        else:
            bad = n
    if bad is None:
        return good, reports
    while bad - good > 1:
        mid = (good + bad) // 2
        if await ok(mid):
            good = mid
        else:
            bad = mid
    return good, reports


async def run_train_bench(
    *,
    directory: Path,
    record_scale: float = 1 / 32,
    samples: int = 400,
    epochs: int = 2,
    sources: tuple[str, ...] = ("native", "fsspec", "local"),
    step: Callable[[str], None] = lambda _: None,
) -> TrainBench:
    work = Path(tempfile.mkdtemp(prefix="tectonic-train-bench-", dir=directory))
    try:
        root = work / "cluster"
        Cluster.create(root, nodes=9, encoding="rs-6-3")
        # unet3d with enough files that ``samples`` records remain after scaling.
        shaped = dataclasses.replace(UNET3D, files=math.ceil(samples / record_scale))
        results: dict[str, int] = {}
        trials: dict[str, list[TrainReport]] = {}
        async with Cluster.open(root) as cluster:
            client = cluster.client()
            step("generating the dataset")
            index = await generate(client, shaped, record_scale, DATA)
            local = work / "local"
            (local / DATA.lstrip("/")).mkdir(parents=True)
            for name in await client.listdir(DATA):
                (local / DATA.lstrip("/") / name).write_bytes(await client.read(f"{DATA}/{name}"))
            fs = None
            if "fsspec" in sources:
                import fsspec

                fs = fsspec.filesystem(
                    "tectonic", cluster=str(root), asynchronous=True, skip_instance_cache=True
                )
            where: dict[str, Any] = {
                "native": client,
                "fsspec": FsspecSource(fs) if fs is not None else None,
                "local": LocalSource(local),
            }
            try:
                for name in sources:

                    async def trial(n: int, name: str = name) -> TrainReport:
                        step(f"{name}: {n} accelerators")
                        drop_caches()
                        return await train(
                            client,
                            DATA,
                            workload="unet3d",
                            accelerators=n,
                            epochs=epochs,
                            source=where[name],
                            source_name=name,
                        )

                    results[name], trials[name] = await largest_passing(trial)
            finally:
                if fs is not None:  # its own cluster, else left open to interpreter exit
                    await fs._close()
        native, local_n = results.get("native", 0), results.get("local", 0)
        return TrainBench(
            record_bytes=index.nbytes // max(1, index.rows),
            samples=index.rows,
            epochs=epochs,
            max_accelerators=results,
            native_vs_local=round(native / local_n, 3) if local_n else 0.0,
            trials=trials,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(res: TrainBench) -> Table:
    """The largest accelerator count that kept AU >= 90%, per source; native / local in the
    caption."""
    t = Table(
        title=f"bench train: unet3d, {res.samples} records of {res.record_bytes} B",
        caption=f"native / local: {res.native_vs_local:.2f}",
    )
    for col in ("source", "accelerators at AU >= 90%"):
        t.add_column(col, justify="right")
    for name, n in res.max_accelerators.items():
        t.add_row(name, str(n))
    return with_legend(
        t,
        "native / local = accelerators kept at AU >= 90% through the native client / "
        "through the local disk.",
    )


def plot(res: TrainBench, directory: Path) -> list[Path]:
    """``train-accelerators.png``: the largest accelerator count at AU >= 90%, per source."""
    from clients.plotting import bars

    return [
        bars(
            directory / "train-accelerators.png",
            title=f"train: unet3d, {res.samples} records of {res.record_bytes / 1e6:.1f} MB, "
            f"{res.epochs} epochs",
            labels=list(res.max_accelerators),
            series={"accelerators": [float(n) for n in res.max_accelerators.values()]},
            ylabel="accelerators at AU >= 90%",
        )
    ]


SCHEMA = schema_of(TrainBench, "tectonic-emu/bench-train/1", "tectonic-emu bench train --json")

__all__ = ["SCHEMA", "TrainBench", "largest_passing", "plot", "run_train_bench", "table"]
