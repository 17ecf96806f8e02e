"""``tectonic-emu bench ckpt``: a synchronized checkpoint of many ranks beside one writer.

In one run, per round, with the same random bytes (``size`` in all, split evenly over
``ranks`` in-process ranks, each a ``Shard`` of one global array):

- **one writer**: an ``open_writer`` appending the bytes as one file (1 MiB pieces), closed;
- **save**: every rank calls ``Checkpointer.save`` at once; timed until the last returns
  (committed);
- **save_async**: every rank calls ``save_async``; each rank's blocked time is what the call
  took, and the step is timed until every ``committed`` resolves.

The targets of issue 5: ``save_vs_writer`` >= 0.7 (goodput of the synchronized save against
the one writer), ``async_blocked_vs_save`` <= 0.2 (the slowest rank's blocked time in
``save_async`` against a synchronous save of the same state).
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

import numpy as np
from rich.table import Table

from bench.fits import in_flight, stored_bytes
from bench.progress import Stages, Step, no_step
from bench.schema import schema_of
from bench.store import aligned_buffer, mb_s, raw_write, size_text
from bench.tables import beyond_raw, with_legend
from clients.checkpoint import Checkpointer, Shard
from tectonic_emu import Cluster
from tectonic_emu.coding import Encoding
from tectonic_emu.resources import Needs, check_fits

IO = 1 << 20
ROW_BYTES = 256 * 4  # a row of the float32 array the ranks' shards are cut from


@dataclass(slots=True)
class CkptBench:
    size: int
    ranks: int
    encoding: str
    runs: int
    raw_write_mb_s: float
    writer_mb_s: float
    save_mb_s: float
    async_mb_s: float
    async_blocked_max_s: float
    save_s: float
    save_vs_writer: float
    async_blocked_vs_save: float
    runs_mb_s: dict[str, list[float]] = field(default_factory=dict)
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def needs(size: int, ranks: int, encoding: str) -> Needs:
    """What a run of ``size`` bytes holds at its peak (``bench.fits``). Memory: the random
    bytes (the ranks' shards are views of them), ``save_async``'s staged copy of every
    rank's state, and every rank's blocks in flight at once. Disk: with ``keep_last=1`` the
    last step stays while the next is written (or the raw file, or the one writer's file)."""
    step = stored_bytes(size, encoding, files=ranks)
    return Needs(
        2 * size + in_flight(encoding, writers=ranks, nbytes=size),
        step + max(size, stored_bytes(size, encoding), step),
    )


async def run_ckpt_bench(
    *,
    size: int,
    ranks: int,
    encoding: str,
    directory: Path,
    runs: int = 3,
    step: Step = no_step,
) -> CkptBench:
    """Raises InvalidArgumentError or NoSpaceError, before allocating anything, when
    ``size`` is less than one 1 KiB row or does not fit (``bench.fits``)."""
    check_fits(
        size,
        lambda n: needs(n, ranks, encoding),
        directory,
        minimum=ROW_BYTES,
        at_least="one row of 256 float32",
    )
    work = Path(tempfile.mkdtemp(prefix="tectonic-ckpt-bench-", dir=directory))
    try:
        rows = size // ROW_BYTES  # a float32 array of 256 columns
        data = aligned_buffer(rows * 256 * 4)
        data[:] = os.urandom(len(data))
        g = np.frombuffer(data, dtype=np.float32).reshape(rows, 256)
        pieces = np.array_split(np.arange(rows), ranks)
        states = [
            {"w": Shard(g[p[0] : p[-1] + 1], g.shape, (int(p[0]), 0))} if len(p) else {}
            for p in pieces
        ]
        root = work / "cluster"
        Cluster.create(root, nodes=max(9, Encoding.parse(encoding).width), encoding=encoding)
        per: dict[str, list[float]] = {k: [] for k in ("raw", "writer", "save", "async")}
        blocked: list[float] = []
        save_s: list[float] = []
        stage = Stages(step, (runs + 1) * len(per))
        async with Cluster.open(root) as cluster:
            client = cluster.client()
            ckpt = Checkpointer(client, "/ckpt", world_size=ranks, keep_last=1)
            n = 0
            for rnd in range(runs + 1):
                label = "warm-up" if rnd == 0 else f"run {rnd}/{runs}"
                stage(f"{label}: raw disk")
                raw = await asyncio.to_thread(raw_write, work / "raw.bin", data)
                (work / "raw.bin").unlink()
                stage(f"{label}: one writer")
                t0 = time.perf_counter()
                async with client.open_writer("/one") as w:
                    for off in range(0, len(data), IO):
                        await w.append(data[off : off + IO])
                await cluster.datapath.drain()
                one = time.perf_counter() - t0
                await client.delete("/one")
                stage(f"{label}: {ranks} ranks save")
                n += 1
                t0 = time.perf_counter()
                await asyncio.gather(*(ckpt.save(n, r, s) for r, s in enumerate(states)))
                await cluster.datapath.drain()
                sync = time.perf_counter() - t0
                await ckpt.wait_cleanup()  # retention of the previous step: not in any timing
                stage(f"{label}: {ranks} ranks save_async")
                n += 1
                t0 = time.perf_counter()
                pending = await asyncio.gather(
                    *(ckpt.save_async(n, r, s) for r, s in enumerate(states))
                )
                await asyncio.gather(*(p.committed for p in pending))
                await cluster.datapath.drain()
                asy = time.perf_counter() - t0
                await ckpt.wait_cleanup()
                if rnd:
                    for key, secs in zip(per, (raw, one, sync, asy), strict=True):
                        per[key].append(mb_s(len(data), secs))
                    blocked.append(max(p.blocked_s for p in pending))
                    save_s.append(sync)
            await ckpt.close()
        med = {k: statistics.median(v) for k, v in per.items()}
        return CkptBench(
            len(data),
            ranks,
            encoding,
            runs,
            med["raw"],
            med["writer"],
            med["save"],
            med["async"],
            round(statistics.median(blocked), 4),
            round(statistics.median(save_s), 4),
            round(med["save"] / med["writer"], 3),
            round(statistics.median(blocked) / statistics.median(save_s), 3),
            per,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _title(res: CkptBench) -> str:
    return f"{size_text(res.size)} over {res.ranks} ranks, {res.encoding}"


def table(res: CkptBench) -> Table:
    """MB/s of each way to write the bytes against the one writer; the caption gives the time
    ``save_async`` blocked the slowest rank."""
    t = Table(
        title=f"bench ckpt: {_title(res)}, {res.runs} runs (median)",
        caption=f"save_async blocked the slowest rank {res.async_blocked_max_s:.3f} s; "
        f"a synchronous save took {res.save_s:.3f} s ({res.async_blocked_vs_save:.2f}x)",
    )
    for col in ("path", "MB/s", "vs one writer"):
        t.add_column(col, justify="right")
    w = res.writer_mb_s
    t.add_row("raw disk", f"{res.raw_write_mb_s:.0f}", "")
    t.add_row("one writer, one file", f"{w:.0f}", "1.00")
    t.add_row("save (synchronized)", f"{res.save_mb_s:.0f}", f"{res.save_vs_writer:.2f}")
    t.add_row("save_async, to commit", f"{res.async_mb_s:.0f}", f"{res.async_mb_s / w:.2f}")
    paths = {
        "one writer": res.writer_mb_s,
        "save": res.save_mb_s,
        "save_async": res.async_mb_s,
    }
    return with_legend(
        t,
        "vs one writer = this way's MB/s / one writer's writing the same bytes as one file, "
        "same rounds (the target for save: at least 0.7).",
        beyond_raw(
            [name for name, mb in paths.items() if mb > res.raw_write_mb_s],
            streams="blocks in flight, every rank's at once for save, each chunk a file on "
            "another node's disk",
        ),
    )


def plot(res: CkptBench, directory: Path) -> list[Path]:
    """``ckpt-throughput.png``: MB/s of the one writer, save and save_async, the raw disk's
    write rate as the limit line."""
    from clients.plotting import bars

    return [
        bars(
            directory / "ckpt-throughput.png",
            title=f"ckpt: {_title(res)}",
            labels=["one writer, one file", "save (synchronized)", "save_async, to commit"],
            series={"write": [res.writer_mb_s, res.save_mb_s, res.async_mb_s]},
            ylabel="MB/s",
            limit=res.raw_write_mb_s,
            limit_label="raw disk",
        )
    ]


SCHEMA = schema_of(CkptBench, "tectonic-emu/bench-ckpt/1", "tectonic-emu bench ckpt --json")

__all__ = ["SCHEMA", "CkptBench", "plot", "run_ckpt_bench", "table"]
