"""What a user sees of a bench: a ``--size`` that cannot fit refused in one line before any
work, progress that shows a percentage only where the total is known, and (below) tables
that fit 80 columns with a legend for their ratios and no Python repr in them."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import io
import json
import os
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from bench import checkpoint, ckpt, fits, fuse, hedge, scale, store
from bench.cli import bar_columns
from bench.progress import Stages
from bench.tables import as_tables
from tectonic_emu import resources
from tectonic_emu.errors import InvalidArgumentError, NoSpaceError

GiB = 1 << 30


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "tectonic_emu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


# -- --size against memory and disk ------------------------------------------------------------
def test_bench_store_100tib_is_refused_in_one_line(tmp_path: Path) -> None:
    r = cli("bench", "store", "--size", "100TiB", "--dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 1, r
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr  # no blank line from the progress bar either
    line = lines[0]
    assert line.startswith("tectonic-emu: error: --size 100 TiB does not fit: "), line
    assert "in memory (" in line and " available)" in line and f"on disk in {tmp_path}" in line
    assert line.split("; ")[-1].startswith("at most ") and line.endswith(" fits"), line
    assert r.stdout == ""
    assert list(tmp_path.iterdir()) == []  # refused before it made anything


@pytest.mark.parametrize("size", ["0", "-1MiB"])
def test_bench_store_size_zero_or_negative_is_refused(tmp_path: Path, size: str) -> None:
    r = cli("bench", "store", "--size", size, "--dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 1, r
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tectonic-emu: error: "), r.stderr
    assert "size" in lines[0]
    assert list(tmp_path.iterdir()) == []


def _machine(monkeypatch: pytest.MonkeyPatch, memory: int, disk: int) -> None:
    monkeypatch.setattr(resources, "memory_available", lambda: memory)
    monkeypatch.setattr(resources, "disk_free", lambda _directory: disk)


def test_the_largest_size_that_fits_is_named_and_does_fit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _machine(monkeypatch, memory=8 * GiB, disk=100 * GiB)

    def needs(n: int) -> resources.Needs:
        return store.needs(n, ["r1", "rs-6-3"], 8 << 20)

    with pytest.raises(InvalidArgumentError, match="at most ") as caught:  # memory binds
        resources.check_fits(100 * GiB, needs, tmp_path)
    quoted = caught.value.message.rsplit("at most ", 1)[1].removesuffix(" fits")
    number, unit = quoted.split()
    named = int(float(number) * {"GiB": GiB, "MiB": 1 << 20}[unit])
    resources.check_fits(named, needs, tmp_path)  # the size it names passes
    assert needs(named + GiB // 5).memory > 8 * GiB  # and is within a tenth of a unit or so

    _machine(monkeypatch, memory=64 * GiB, disk=2 * GiB)
    with pytest.raises(NoSpaceError, match=r"on disk in .* \(2 GiB free\)"):  # disk binds
        resources.check_fits(4 * GiB, needs, tmp_path)
    _machine(monkeypatch, memory=0, disk=2 * GiB)
    with pytest.raises(InvalidArgumentError, match="nothing fits"):
        resources.check_fits(4 * GiB, needs, tmp_path)


def test_what_each_bench_needs_follows_its_code() -> None:
    """The figures the check compares, against what each bench's code holds and writes."""
    size = GiB
    # store: the random bytes, write_file's copy, the read buffer; one file at a time on disk,
    # the widest overhead plus two pages per chunk.
    s = store.needs(size, ["r1", "r3"], 8 << 20)
    assert 3 * size < s.memory < 3 * size + (128 << 20)
    assert s.disk == 3 * size + 128 * 3 * 2 * 4096
    # hedge: two files at once (the one read back and the one timed).
    one = store.needs(size, ["rs-6-3"], 8 << 20).disk
    assert hedge.needs(size, ["rs-6-3"], 8 << 20).disk == 2 * one
    # fuse: no write_file copy (2x, not 3x), but two mount processes with blocks in flight.
    f = fuse.needs(size, "rs-6-3")
    assert 2 * size < f.memory < s.memory + 3 * fits.in_flight("rs-6-3", nbytes=size)
    # ckpt and scale: keep_last=1 keeps the last step while the next is written.
    assert ckpt.needs(size, 1024, "rs-6-3").disk >= 2 * 1.5 * size
    assert scale.needs(size, [1, 4096], "rs-6-3").disk >= 2 * 1.5 * size
    # More ranks put more blocks in flight at once, up to all the bytes times the overhead.
    assert ckpt.needs(size, 1, "rs-6-3").memory < ckpt.needs(size, 1024, "rs-6-3").memory
    assert ckpt.needs(size, 1024, "rs-6-3").memory <= 2 * size + 1.5 * size + size


@pytest.mark.parametrize(
    ("run", "kwargs"),
    [
        (store.run_store_bench, {"encodings": ["r1"], "block_size": 1 << 20}),
        (hedge.run_hedge_bench, {"encodings": ["r3"], "block_size": 1 << 20, "delay": 0.0}),
        (fuse.run_fuse_bench, {"encoding": "rs-6-3"}),
        (ckpt.run_ckpt_bench, {"ranks": 4, "encoding": "rs-6-3"}),
        (scale.run_scale_bench, {"ranks": [1, 4], "encoding": "rs-6-3"}),
    ],
)
def test_every_sized_bench_checks_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, run: object, kwargs: dict[str, object]
) -> None:
    import asyncio

    _machine(monkeypatch, memory=64 << 20, disk=GiB)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        asyncio.run(run(size=GiB, directory=tmp_path, **kwargs))  # type: ignore[operator]
    assert list(tmp_path.iterdir()) == []


# -- progress ----------------------------------------------------------------------------------
def _bar(total: float | None, completed: float) -> str:
    out = io.StringIO()
    console = Console(file=out, width=120)
    progress = Progress(*bar_columns(), console=console, auto_refresh=False)
    progress.add_task("bench x: run 1/3: r3 embedded", total=total, completed=completed)
    console.print(progress.make_tasks_table(progress.tasks))
    return out.getvalue()


def test_the_bar_shows_percent_and_eta_only_when_the_total_is_known() -> None:
    known = _bar(1.0, 0.5)
    assert "50%" in known and "eta " in known
    unknown = _bar(None, 0)
    assert "%" not in unknown and "eta" not in unknown  # it pulses instead of saying 0%
    assert "bench x: run 1/3: r3 embedded" in unknown


def test_stages_move_the_bar_evenly() -> None:
    log: list[tuple[str, float | None]] = []
    stage = Stages(lambda text, fraction=None: log.append((text, fraction)), 4)
    for name in "abcd":
        stage(name)
    assert log == [("a", 0.0), ("b", 0.25), ("c", 0.5), ("d", 0.75)]


# -- tables ------------------------------------------------------------------------------------
DOCS = Path(__file__).resolve().parent.parent / "docs"
RESULTS = {  # bench -> (its result class, a committed real run)
    "store": ("StoreBench", "bench/store.json"),
    "served": ("StoreBench", "bench-served-512MiB.json"),
    "hedge": ("HedgeBench", "bench/hedge.json"),
    "fuse": ("FuseBench", "bench/fuse.json"),
    "ckpt": ("CkptBench", "bench/ckpt.json"),
    "scale": ("ScaleBench", "bench/scale.json"),
    "checkpoint": ("CheckpointBench", "bench/checkpoint.json"),
    "metadata": ("MetadataBench", "bench/metadata.json"),
    "net": ("NetBench", "bench/net.json"),
    "train": ("TrainBench", "bench/train.json"),
    "sim": ("SimBench", "bench/sim.json"),
}
TABLES = ("table", "served_table", "targets_table")


def from_json(cls: Any, value: Any) -> Any:
    """A result dataclass rebuilt from its ``to_dict()`` (nested dataclasses, lists, dicts)."""
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        fields = [f.name for f in dataclasses.fields(cls) if f.name in value]
        return cls(**{name: from_json(hints[name], value[name]) for name in fields})
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin is list:
        return [from_json(args[0], v) for v in value]
    if origin is dict:
        return {k: from_json(args[1], v) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType) and value is not None:
        return from_json(next(a for a in args if a is not type(None)), value)
    return value


def module_of(name: str) -> ModuleType:
    return importlib.import_module(f"bench.{'store' if name == 'served' else name}")


def result(name: str) -> Any:
    cls, file = RESULTS[name]
    return from_json(getattr(module_of(name), cls), json.loads((DOCS / file).read_text()))


def wide_results() -> dict[str, Any]:
    """The committed runs, and variants with the widest figures a run may print."""
    out = {name: result(name) for name in RESULTS}
    s = result("served")
    s.encodings.append(copy.deepcopy(s.encodings[-1]))
    s.encodings[-1].encoding = "rs-10-4"
    s.raw_write_mb_s, s.raw_read_mb_s = 12345.6, 23456.7
    out["served, rs-10-4"] = s
    h = result("hedge")
    h.encodings["rs-10-4"] = copy.deepcopy(h.encodings["rs-6-3"])
    h.nodes["rs-10-4"] = 16
    h.encodings["rs-10-4"][2].write_mb_s = 12345.6
    out["hedge, rs-10-4"] = h
    sc = result("scale")
    for p in sc.points:  # loads as slow as they once were (368 s at 4,096 ranks)
        p.load_s, p.load_vs_16 = p.load_s * 1000, 245.33
    out["scale, slow loads"] = sc
    c = result("checkpoint")
    c.paths.append(
        dataclasses.replace(
            c.paths[-1],
            key="peer/seaweedfs-r3",
            available=False,
            reason="weed is not installed (docs/peers.md says how)",
            write=None,
            read=None,
        )
    )
    out["checkpoint, a peer missing"] = c
    return out


WIDE = wide_results()


def rendered(table: Table, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def cells(table: Table) -> list[str]:
    """Every header and cell of ``table`` as plain text."""
    out = []
    for column in table.columns:
        for cell in [column.header, *column.cells]:
            text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
            out.append(text)
    return [c for c in out if c]


def tables_of(name: str) -> list[tuple[str, Table]]:
    mod = module_of(name.split(",")[0])
    made = [(f, getattr(mod, f, lambda _: None)(WIDE[name])) for f in TABLES]
    out: list[tuple[str, Table]] = []
    for f, t in made:
        out += [(f, x) for x in as_tables(t)]
    return out


@pytest.mark.parametrize("name", WIDE)
def test_every_table_fits_80_columns_whole(name: str) -> None:
    for fn, table in tables_of(name):
        text = rendered(table)
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= 80, f"{name}.{fn}:\n{text}"
        assert "…" not in text, f"{name}.{fn}: a cell was cut:\n{text}"
        for cell in cells(table):  # whole on one line: not wrapped onto a second
            assert any(cell in line for line in lines), f"{name}.{fn}: {cell!r} wrapped:\n{text}"


@pytest.mark.parametrize("name", WIDE)
def test_no_python_repr_is_printed(name: str) -> None:
    for fn, table in tables_of(name):
        text = rendered(table, width=200)
        assert not re.search(r"[{}]|\['|\[\d|'\]|': ", text), f"{name}.{fn}:\n{text}"


LEGENDS = {  # bench -> what its legend defines (each ratio column's name, then " = ")
    "store": ("write ratio, read ratio = ", "storage overhead", "read vs raw = "),
    "served": ("Writes acknowledged: embedded when every chunk is durable, served at a quorum",),
    "hedge": ("vs base w/r = ",),
    "fuse": ("mount / native, direct-io / native = ",),
    "ckpt": ("vs one writer = ",),
    "scale": ("vs 16 = ",),
    "checkpoint": ("(wall) = ", "vs raw w/r = ", "not divided by the encoding's storage overhead"),
    "net": ("ratio = measured / expected",),
    "train": ("native / local = ",),
    "sim": ("ratio = projected / real median",),
}


@pytest.mark.parametrize("name", LEGENDS)
def test_ratio_columns_have_a_legend(name: str) -> None:
    text = " ".join(rendered(t, width=400) for _, t in tables_of(name))
    for phrase in LEGENDS[name]:
        assert phrase in " ".join(text.split()), f"{name}: no {phrase!r} in\n{text}"


def test_why_a_path_beats_the_raw_disk_is_said_only_when_one_does() -> None:
    res = result("store")  # a real run: r1 wrote at 2.23x the raw disk's rate
    said = " ".join(rendered(store.table(res), width=400).split())
    assert "Above the raw disk (r1, r3, rs-6-3, rs-10-4): " in said and "parallel streams" in said
    assert "page cache" not in said  # these reads were cold, and every write synced
    res.cold_reads, res.sync = False, False
    said = " ".join(rendered(store.table(res), width=400).split())
    assert "reads were warm, from the page cache" in said and "--no-sync left" in said
    for f in res.encodings:  # a read ratio above 1 alone is the overhead's division
        f.write_ratio, f.read_ratio, f.read_vs_raw = 0.8, 1.9, 0.95
    said = " ".join(rendered(store.table(res), width=400).split())
    assert "Above the raw disk" not in said and "read ratio above 1 is not faster" in said

    c = result("checkpoint")
    said = " ".join(rendered(checkpoint.table(c), width=400).split())
    assert "Above the raw disk (native/r1, native/r3," in said
    slow = [p for p in c.paths if p.key in ("raw", "peer/seaweedfs", "peer/glusterfs-r3")]
    c.paths = slow
    assert "Above the raw disk" not in " ".join(rendered(checkpoint.table(c), width=400).split())


def test_fuse_targets_are_the_runs_ratios_to_the_native_client() -> None:
    from bench import fuse

    res = result("fuse")
    got = {t["name"]: (t["value"], t["goal"], t["met"]) for t in fuse.targets(res)}
    assert got == {
        "page-cache mount read / native": (
            res.mount_vs_native_read,
            0.8,
            res.mount_vs_native_read >= 0.8,
        ),
        "--direct-io mount read / native": (
            res.direct_vs_native_read,
            1.0,
            res.direct_vs_native_read >= 1.0,
        ),
    }
