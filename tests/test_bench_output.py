"""What a user sees of a bench: a ``--size`` that cannot fit refused in one line before any
work, progress that shows a percentage only where the total is known, and (below) tables
that fit 80 columns with a legend for their ratios and no Python repr in them."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress

from bench import ckpt, fits, fuse, hedge, scale, store
from bench.cli import bar_columns
from bench.progress import Stages
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
    monkeypatch.setattr(fits, "memory_available", lambda: memory)
    monkeypatch.setattr(fits, "disk_free", lambda _directory: disk)


def test_the_largest_size_that_fits_is_named_and_does_fit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _machine(monkeypatch, memory=8 * GiB, disk=100 * GiB)

    def needs(n: int) -> fits.Needs:
        return store.needs(n, ["r1", "rs-6-3"], 8 << 20)

    with pytest.raises(InvalidArgumentError, match="at most ") as caught:  # memory binds
        fits.check_fits(100 * GiB, needs, tmp_path)
    quoted = caught.value.message.rsplit("at most ", 1)[1].removesuffix(" fits")
    number, unit = quoted.split()
    named = int(float(number) * {"GiB": GiB, "MiB": 1 << 20}[unit])
    fits.check_fits(named, needs, tmp_path)  # the size it names passes
    assert needs(named + GiB // 5).memory > 8 * GiB  # and is within a tenth of a unit or so

    _machine(monkeypatch, memory=64 * GiB, disk=2 * GiB)
    with pytest.raises(NoSpaceError, match=r"on disk in .* \(2 GiB free\)"):  # disk binds
        fits.check_fits(4 * GiB, needs, tmp_path)
    _machine(monkeypatch, memory=0, disk=2 * GiB)
    with pytest.raises(InvalidArgumentError, match="nothing fits"):
        fits.check_fits(4 * GiB, needs, tmp_path)


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
