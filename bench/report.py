"""``tectonic-emu bench all --report docs/benchmarks.md``: every bench in one fresh run, and the
committed report made from it.

Each bench runs with the parameters of ``BENCHES`` (or the tiny ones of ``--quick``), one after
another on this machine; its JSON goes to ``<assets>/<name>.json`` and its plots to
``<assets>/``; the report states the machine and the versions, the command of each bench,
its tables (the same as the bench prints), every target of the issue with its measured value,
and the plots. Figures are only comparable within one report: the machine is shared.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from bench import environment
from bench.tables import as_tables
from tectonic_emu.config import parse_size


@dataclass(frozen=True, slots=True)
class BenchRun:
    """One bench of the report: how to run it, at full size and at ``--quick`` size."""

    name: str
    module: str  # bench.<module>: its run function, table(), plot()
    run: str  # the run function's name
    command: str  # the same run on the command line, for the report
    full: dict[str, Any]
    quick: dict[str, Any]
    about: str  # one paragraph: what it measures
    extra_tables: tuple[str, ...] = field(default=())  # more table functions of the module


BENCHES: tuple[BenchRun, ...] = (
    BenchRun(
        "store",
        "store",
        "run_store_bench",
        "tectonic-emu bench store --size 512MiB --encodings r1,r3,rs-6-3,rs-10-4 --runs 3",
        {
            "size": parse_size("512MiB"),
            "encodings": ["r1", "r3", "rs-6-3", "rs-10-4"],
            "block_size": 8 << 20,
            "runs": 3,
        },
        {
            "size": parse_size("8MiB"),
            "encodings": ["r1", "rs-6-3"],
            "block_size": 1 << 20,
            "runs": 1,
        },
        "The store's goodput per encoding beside the raw disk (pwrite + fdatasync), in the same "
        "rounds; reads cold.",
        ("served_table",),
    ),
    BenchRun(
        "fuse",
        "fuse",
        "run_fuse_bench",
        "tectonic-emu bench fuse --size 1GiB --runs 3",
        {"size": parse_size("1GiB"), "encoding": "rs-6-3", "runs": 3},
        {"size": parse_size("8MiB"), "encoding": "rs-6-3", "runs": 1},
        "The FUSE mount (page cache, and --direct-io) beside the native client and the local "
        "disk, 1 MiB I/O.",
        ("targets_table",),
    ),
    BenchRun(
        "random_reads",
        "random_reads",
        "run_random_bench",
        "tectonic-emu bench random --size 256MiB --requests 1000 --rounds 3",
        {"size": parse_size("256MiB"), "requests": 1000, "rounds": 3},
        {"size": parse_size("16MiB"), "requests": 20, "rounds": 1},
        "4 KiB and 128 KiB random reads (a data loader's pattern) through the native client, the "
        "mount, local pread (O_DIRECT, cold, page cache) and JuiceFS, in interleaved rounds: "
        "ops/s and read amplification (bytes the reading processes read / bytes asked).",
        ("targets_table",),
    ),
    BenchRun(
        "checkpoint",
        "checkpoint",
        "run_checkpoint_bench",
        "tectonic-emu bench checkpoint --model llama3-8b --scale 0.01 --writes 2 --hosts 3 "
        "--peers <every installed peer>",
        {"model": "llama3-8b", "scale": 0.01, "writes": 2, "hosts": 3},
        {"model": "llama3-8b", "scale": 0.00005, "writes": 1, "pause": 0.0},
        "MLPerf Storage v2.0 checkpointing (llama3-8b's files on 8 ranks, scaled) through every "
        "path, and our client against a cluster across 3 namespaced hosts (hosts/...): "
        "duration of the slowest rank, throughput = bytes / that duration.",
        ("targets_table",),
    ),
    BenchRun(
        "scale",
        "scale",
        "run_scale_bench",
        "tectonic-emu bench scale --size 256MiB --ranks 1,16,256,1024,4096 --runs 3",
        {"size": parse_size("256MiB"), "runs": 3},
        {"size": parse_size("4MiB"), "ranks": (1, 16, 64), "runs": 1},
        "The same bytes checkpointed (and loaded) by 1 to 4,096 ranks: the cost of ranks.",
    ),
    BenchRun(
        "metadata",
        "metadata",
        "run_metadata_bench",
        "tectonic-emu bench metadata",
        {},
        {"ranks": (1, 4), "files_total": 64},
        "mdtest-like: creates, stats, listings and deletes per second by 1 to 1,024 ranks, per "
        "metadata backend (and through the mount and JuiceFS, where they can run).",
        ("targets_table",),
    ),
    BenchRun(
        "ckpt",
        "ckpt",
        "run_ckpt_bench",
        "tectonic-emu bench ckpt --size 1GiB --ranks 1024 --runs 3",
        {"size": parse_size("1GiB"), "ranks": 1024, "encoding": "rs-6-3", "runs": 3},
        {"size": parse_size("4MiB"), "ranks": 16, "encoding": "rs-6-3", "runs": 1},
        "A synchronized Checkpointer save of 1,024 in-process ranks (and save_async) beside one "
        "writer of the same bytes.",
    ),
    BenchRun(
        "hedge",
        "hedge",
        "run_hedge_bench",
        "tectonic-emu bench hedge --size 256MiB --delay 200ms --runs 2",
        {
            "size": parse_size("256MiB"),
            "encodings": ["r3", "rs-6-3"],
            "delay": 0.2,
            "block_size": 8 << 20,
            "runs": 2,
        },
        {
            "size": parse_size("4MiB"),
            "encodings": ["r3"],
            "delay": 0.05,
            "block_size": 1 << 20,
            "runs": 1,
        },
        "Served clusters with one node slowed: writes and reads with and without hedging.",
    ),
    BenchRun(
        "qos",
        "qos",
        "run_qos_bench",
        "tectonic-emu bench qos --disk-model hdd --rounds 3",
        {"disk_model": "hdd", "rounds": 3},
        {
            "disk_model": "hdd",
            "rounds": 1,
            "records": 12,
            "checkpoint_bytes": 64 << 20,
            "alone_s": 3.0,
        },
        "A bronze multi-rank checkpoint burst beside a gold data loader on a served cluster "
        "(issue 23): alone, together with no scheduler, first come first served, and with "
        "weighted fair queueing on the nodes' disks (an HDD model each, in real time).",
    ),
    BenchRun(
        "train",
        "train",
        "run_train_bench",
        "tectonic-emu bench train",
        {},
        {"samples": 40, "epochs": 1},
        "The most emulated h100 accelerators that keep AU >= 90% on a scaled unet3d dataset, "
        "through the native client, fsspec and local disk.",
    ),
    BenchRun(
        "net",
        "net",
        "run_net_bench",
        "tectonic-emu bench net --nic-gbps 1 --rtt-ms 20",
        {"nic_gbps": 1.0, "rtt_ms": 20.0, "seconds": 3.0, "runs": 3},
        {"nic_gbps": 0.2, "rtt_ms": 20.0, "chunk": 256 << 10, "seconds": 0.5, "runs": 1},
        "The emulated network (issue 8): a node process and a client, each pacing its NIC, "
        "measured against the link's settings.",
    ),
    BenchRun(
        "sim",
        "sim",
        "run_sim_bench",
        "tectonic-emu bench sim --scale 0.01 --runs 3",
        {"scale": 0.01, "runs": 3},
        {
            "scale": 0.0005,
            "runs": 1,
            "encodings": ["rs-6-3"],
            "ranks": [16],
            "fail": False,
            "paper_ranks": 256,
            "paper_scale": 0.0001,
        },
        "Projections (issue 20) beside real runs on this machine: the this-machine preset "
        "measured, then checkpoint saves and loads run for real and projected; target: "
        "within 15% of the real median. Then meta-genai-24k's Llama 3 checkpoint burst "
        "beside the paper's 7 TB/s peak and 2 TB/s sustained; target: within 20%.",
    ),
)
NAMES = tuple(b.name for b in BENCHES)


def installed_peers() -> list[str]:
    from bench import peers

    return [name for name in peers.PEERS if peers.missing(name) is None]


def _metadata_backends(peers: Sequence[str] | None) -> tuple[str, ...]:
    """``bench metadata``'s default backends, the mount where FUSE works, and JuiceFS as
    ``peers`` says (default: where it is installed): issue 22 compares the last two. Beside
    them, where they run, the floors under the mount (``bench/fuse_floor.py``)."""
    from bench import fuse_floor
    from bench.metadata_backends import default_backends
    from bench.random_reads import fuse_missing

    extra: tuple[str, ...] = () if fuse_missing() is not None else ("mount",)
    if extra and ("juicefs" in peers if peers is not None else "juicefs" in installed_peers()):
        extra += ("juicefs",)
    if extra:
        floors = {"fuse-floor": "mfusepy", "fuse-raw-floor": "raw"}
        extra += tuple(name for name, kind in floors.items() if fuse_floor.why_not(kind) is None)
    return default_backends() + extra


def markdown(table: Table) -> str:
    """A rich table as a Markdown table (its title in bold above, caption below, each of its
    lines a paragraph)."""

    def plain(cell: Any) -> str:
        text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
        return text.replace("|", "\\|").replace("\n", " ")

    heads = [plain(c.header) for c in table.columns]
    rows = list(zip(*(list(c.cells) for c in table.columns), strict=True))
    lines = [f"**{plain(table.title)}**", ""] if table.title else []
    lines += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(plain(c) for c in row) + " |" for row in rows]
    if table.caption:  # a legend: one paragraph per line
        caption = table.caption.plain if isinstance(table.caption, Text) else str(table.caption)
        lines += ["", "\n\n".join(plain(line) for line in caption.splitlines())]
    return "\n".join(lines)


def tables_of(mod: Any, result: Any, extra: Sequence[str]) -> list[Table]:
    out: list[Table] = []
    for name in ("table", *extra):
        out += as_tables(getattr(mod, name)(result))
    return out


@dataclass(slots=True)
class Section:
    bench: BenchRun
    result: Any
    tables: list[Table]
    plots: list[Path]


async def run_all(
    *,
    directory: Path,
    assets: Path,
    only: Sequence[str] = NAMES,
    quick: bool = False,
    peers: Sequence[str] | None = None,
    step: Callable[..., None] = lambda *_: None,
) -> list[Section]:
    """Run the benches named in ``only`` (in ``BENCHES`` order), writing each one's JSON and
    plots into ``assets``. ``peers``: for the checkpoint bench, and JuiceFS for the random
    reads bench (default: every installed one; none with ``quick``)."""
    await asyncio.to_thread(assets.mkdir, parents=True, exist_ok=True)
    sections: list[Section] = []
    chosen = [b for b in BENCHES if b.name in only]
    for i, b in enumerate(chosen):
        mod = importlib.import_module(f"bench.{b.module}")
        kwargs = dict(b.quick if quick else b.full)
        if b.name == "checkpoint":
            kwargs["peers"] = list(
                peers if peers is not None else ([] if quick else installed_peers())
            )
        if b.name == "metadata" and not quick:  # the mount and JuiceFS, where they can run
            kwargs["backends"] = await asyncio.to_thread(_metadata_backends, peers)
        if b.name == "random_reads":  # JuiceFS as --peers says, else where installed
            auto = False if quick else None
            kwargs["juicefs"] = "juicefs" in peers if peers is not None else auto

        def sub(text: str, fraction: float | None = None, i: int = i, b: BenchRun = b) -> None:
            done = (i + (fraction or 0.0)) / len(chosen)
            step(f"{b.name} ({i + 1}/{len(chosen)}): {text}", done)

        result = await getattr(mod, b.run)(directory=directory, step=sub, **kwargs)
        doc = json.dumps(result.to_dict(), indent=2) + "\n"
        await asyncio.to_thread((assets / f"{b.name}.json").write_text, doc)
        plots = await asyncio.to_thread(mod.plot, result, assets)
        sections.append(Section(b, result, tables_of(mod, result, b.extra_tables), plots))
    return sections


def target_lines(sections: Sequence[Section]) -> list[str]:
    """Every target a bench's ``targets(result)`` reports, as Markdown list items."""
    lines = []
    for s in sections:
        found = getattr(importlib.import_module(f"bench.{s.bench.module}"), "targets", None)
        for t in found(s.result) if found else []:
            t = t if isinstance(t, dict) else {k: getattr(t, k) for k in t.__slots__}
            met = "n/a" if t["met"] is None else ("**met**" if t["met"] else "**not met**")
            value = "-" if t["value"] is None else f"{t['value']:.2f}"
            goal = f"{'<=' if t.get('at_most') else '>='} {t['goal']:g}"
            lines.append(f"- {s.bench.name}: {t['name']}: {value} (goal {goal}): {met}")
    return lines


def write_report(
    path: Path,
    sections: Sequence[Section],
    *,
    assets: Path,
    command: str,
    started: datetime.datetime,
    quick: bool,
) -> None:
    """The Markdown report at ``path``; plot links are relative to it."""
    m = environment.machine()
    v = environment.versions(peers=installed_peers())
    took = datetime.datetime.now(datetime.UTC) - started
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` on {started:%Y-%m-%d %H:%M} UTC in "
        f"{took.total_seconds() / 60:.0f} minutes"
        f"{' (--quick: tiny sizes, not figures to quote)' if quick else ''}. "
        "Every figure beside its limit was measured in the same run; the machine is shared, so "
        "compare ratios within this report, not absolute figures across reports.",
        "",
        "## Machine and versions",
        "",
        "| what | value |",
        "|---|---|",
        *[f"| {k} | {val} |" for k, val in m.items()],
        *[f"| {k} | {val} |" for k, val in v.items()],
        "",
    ]
    targets = target_lines(sections)
    if targets:
        out += ["## Targets", "", *targets, ""]
    for s in sections:
        out += [f"## {s.bench.name}", "", s.bench.about, "", f"`{s.bench.command}`", ""]
        for t in s.tables:
            out += [markdown(t), ""]
        for png in s.plots:
            rel = os.path.relpath(png, path.parent)
            out += [f"![{png.stem}]({rel})", ""]
        out += [f"JSON: `{os.path.relpath(assets / (s.bench.name + '.json'), path.parent)}`", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out).rstrip() + "\n")


__all__ = ["BENCHES", "NAMES", "run_all", "write_report", "markdown"]
