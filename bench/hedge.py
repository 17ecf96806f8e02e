"""``tectonic-emu bench hedge``: what one slow node costs, with and without hedging.

For each encoding, a served cluster with two nodes more than the encoding is wide (so hedged
writes have somewhere else to go) runs three cases in the same rounds:

- ``baseline``: no slow node, hedging on (the served defaults);
- ``slow, hedged``: node 0 adds ``delay`` to every reply (``SET_DELAY``), hedging on;
- ``slow, unhedged``: the same slow node, with hedging off: every chunk acknowledged
  (``write_ack="all"``), no spare reservations, no hedged reads.

Write goodput is a file of ``size`` random bytes written with ``write_file`` in the case's
conditions; read goodput is ``read_into`` of a file of the same size written while every node
was fast (so that its chunks are on the slow node too), page cache dropped when root. The
figures that matter are the ratios to the baseline: hedging works when ``slow, hedged`` stays
near 1 while ``slow, unhedged`` falls to the slow node's pace.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.fits import in_flight, stored_bytes
from bench.progress import Stages, Step, no_step
from bench.schema import schema_of
from bench.store import aligned_buffer, drop_caches, mb_s, size_text
from bench.tables import with_legend
from tectonic_emu import Cluster
from tectonic_emu.coding import Encoding
from tectonic_emu.resources import Needs, check_fits
from tectonic_emu.served import Serving

CASES = ("baseline", "slow, hedged", "slow, unhedged")


@dataclass(slots=True)
class CaseFigures:
    case: str
    write_mb_s: float
    read_mb_s: float
    write_vs_baseline: float
    read_vs_baseline: float
    hedged_writes: int
    hedged_reads: int
    slow_node_reads: int
    stragglers: int
    write_runs_mb_s: list[float] = field(default_factory=list)
    read_runs_mb_s: list[float] = field(default_factory=list)


@dataclass(slots=True)
class HedgeBench:
    size: int
    delay_s: float
    runs: int
    block_size: int
    encodings: dict[str, list[CaseFigures]]
    nodes: dict[str, int]
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _set_hedging(cluster: Cluster, on: bool) -> None:
    dp = cluster.datapath
    dp.write_ack = "quorum" if on else "all"
    dp.hedge_extra = 2 if on else 0
    dp.hedge_share = 0.05 if on else 0.0
    dp.hedge_reads = on


async def _one_encoding(
    enc: str,
    *,
    size: int,
    delay: float,
    runs: int,
    block_size: int,
    work: Path,
    data: memoryview,
    payload: bytes,
    buf: memoryview,
    stage: Callable[[str], None],
) -> tuple[int, list[CaseFigures]]:
    nodes = Encoding.parse(enc).width + 2
    root = work / f"cluster-{enc}"
    Cluster.create(root, nodes=nodes, encoding=enc, block_size=block_size)
    serving = Serving(root, repair_interval=0, log=work / f"serve-{enc}.log")
    await asyncio.to_thread(serving.start)
    per: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in CASES}
    counts: dict[str, tuple[int, int, int, int]] = {}
    try:
        async with Cluster.open(root) as cluster:
            client = cluster.client()
            for rnd in range(runs + 1):  # round 0 warms up (and fills the latency samples)
                # The file read back is written while every node is fast, so its chunks sit
                # on the slow node as on any other (a hedged write would have kept them off
                # it, and the read would then not meet the slow node at all).
                await cluster.set_node_delay(0, 0.0)
                _set_hedging(cluster, True)
                await client.write_file("/hedge-read", payload, encoding=enc)
                await cluster.datapath.drain()
                # Rotate the order round by round, so no case always follows the same one.
                for case in CASES[rnd % 3 :] + CASES[: rnd % 3]:
                    stage(f"{enc}: {'warm-up' if rnd == 0 else f'run {rnd}/{runs}'}: {case}")
                    await cluster.set_node_delay(0, 0.0 if case == "baseline" else delay)
                    _set_hedging(cluster, case != "slow, unhedged")
                    stats = cluster.datapath.stats
                    before = (
                        stats.hedged_writes,
                        stats.hedged_reads,
                        stats.slow_node_reads,
                        stats.stragglers,
                    )
                    t0 = time.perf_counter()
                    await client.write_file("/hedge", payload, encoding=enc)
                    w = time.perf_counter() - t0
                    await cluster.datapath.drain()
                    await client.delete("/hedge")
                    drop_caches()
                    t0 = time.perf_counter()
                    n = await client.read_into("/hedge-read", 0, buf)
                    r = time.perf_counter() - t0
                    if n != size or buf != data:
                        raise AssertionError(f"{enc} {case}: read-back differs")
                    if rnd:
                        per[case][0].append(mb_s(size, w))
                        per[case][1].append(mb_s(size, r))
                        after = (
                            stats.hedged_writes,
                            stats.hedged_reads,
                            stats.slow_node_reads,
                            stats.stragglers,
                        )
                        prev = counts.get(case, (0, 0, 0, 0))
                        counts[case] = tuple(  # type: ignore[assignment]
                            p + a - b for p, a, b in zip(prev, after, before, strict=True)
                        )
                await client.delete("/hedge-read")
            await cluster.set_node_delay(0, 0.0)
    finally:
        await asyncio.to_thread(serving.stop)
    base_w = statistics.median(per["baseline"][0])
    base_r = statistics.median(per["baseline"][1])
    figures = []
    for case in CASES:
        wm, rm = statistics.median(per[case][0]), statistics.median(per[case][1])
        hw, hr, sr, sg = counts[case]
        figures.append(
            CaseFigures(
                case,
                wm,
                rm,
                round(wm / base_w, 3),
                round(rm / base_r, 3),
                hw,
                hr,
                sr,
                sg,
                per[case][0],
                per[case][1],
            )
        )
    return nodes, figures


def needs(size: int, encodings: Sequence[str], block_size: int) -> Needs:
    """What a run of ``size`` bytes holds at its peak (``bench.fits``). Memory: the random
    bytes, their immutable copy and the read-back buffer, and one encoding's blocks in
    flight. Disk: two files at once (the one read back and the one timed), on one
    encoding's cluster at a time. Hedged writes reserve on spare nodes but still write one
    encoding's width of chunks."""
    return Needs(
        3 * size + max(in_flight(e, block_size, nbytes=size) for e in encodings),
        max(2 * stored_bytes(size, e, block_size) for e in encodings),
    )


async def run_hedge_bench(
    *,
    size: int,
    encodings: list[str],
    delay: float,
    directory: Path,
    block_size: int,
    runs: int = 2,
    step: Step = no_step,
) -> HedgeBench:
    """Raises InvalidArgumentError or NoSpaceError, before allocating anything, when
    ``size`` does not fit (``bench.fits``)."""
    check_fits(size, lambda n: needs(n, encodings, block_size), directory)
    work = Path(tempfile.mkdtemp(prefix="tectonic-hedge-", dir=directory))
    try:
        data = aligned_buffer(size)
        data[:] = os.urandom(size)
        payload = bytes(data)
        buf = aligned_buffer(size)
        results: dict[str, list[CaseFigures]] = {}
        widths: dict[str, int] = {}
        stage = Stages(step, len(encodings) * (runs + 1) * len(CASES))
        for enc in encodings:
            widths[enc], results[enc] = await _one_encoding(
                enc,
                size=size,
                delay=delay,
                runs=runs,
                block_size=block_size,
                work=work,
                data=data,
                payload=payload,
                buf=buf,
                stage=stage,
            )
        return HedgeBench(size, delay, runs, block_size, results, widths)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(res: HedgeBench) -> Table:
    """One table for every encoding: a section of the three cases each, with the ratios to the
    baseline (the encoding and its node count on the section's first row)."""
    t = Table(
        title=f"bench hedge: node 0 slowed by {res.delay_s * 1000:.0f} ms, "
        f"{size_text(res.size)} files, {res.runs} runs (median)"
    )
    t.add_column("encoding")
    t.add_column("nodes", justify="right")
    t.add_column("case", no_wrap=True)  # "slow, unhedged" on one line
    for col in ("write MB/s", "read MB/s", "vs base w/r"):
        t.add_column(col, justify="right")
    for enc, cases in res.encodings.items():
        for i, c in enumerate(cases):
            t.add_row(
                enc if i == 0 else "",
                str(res.nodes[enc]) if i == 0 else "",
                c.case,
                f"{c.write_mb_s:.0f}",
                f"{c.read_mb_s:.0f}",
                f"{c.write_vs_baseline:.2f}/{c.read_vs_baseline:.2f}",
                end_section=i == len(cases) - 1,
            )
    return with_legend(
        t,
        "vs base w/r = this case's write / read MB/s over the baseline's (same encoding and "
        "rounds, no slow node). Hedging works when slow, hedged stays near 1 while slow, "
        "unhedged falls toward the slow node's pace.",
    )


def plot(res: HedgeBench, directory: Path) -> list[Path]:
    """``hedge-write.png`` and ``hedge-read.png``: MB/s per case, one bar per encoding."""
    from clients.plotting import bars

    by_case = {enc: {f.case: f for f in fs} for enc, fs in res.encodings.items()}
    cases = [c for c in CASES if any(c in figs for figs in by_case.values())]
    out = []
    for rw in ("write", "read"):
        series = {
            enc: [getattr(figs[c], f"{rw}_mb_s") if c in figs else 0.0 for c in cases]
            for enc, figs in by_case.items()
        }
        out.append(
            bars(
                directory / f"hedge-{rw}.png",
                title=f"hedge {rw}: node 0 slowed by {res.delay_s * 1000:.0f} ms, "
                f"{size_text(res.size)} files",
                labels=cases,
                series=series,
                ylabel="MB/s",
            )
        )
    return out


SCHEMA = schema_of(HedgeBench, "tectonic-emu/bench-hedge/1", "tectonic-emu bench hedge --json")

__all__ = ["SCHEMA", "HedgeBench", "plot", "run_hedge_bench", "table"]
