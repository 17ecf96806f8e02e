"""``tectonic-emu bench posix``: pjdfstest on the mount (issue 21).

pjdfstest is the POSIX suite that JuiceFS runs in its CI: 238 shell scripts, one per
system call and case, each printing TAP (``ok 3``, ``not ok 4 - tried ..., expected ...,
got ...``). This bench builds a copy of the suite (its source is read-only where it is
kept: ``../shared/third_party/pjdfstest`` beside the checkout, or ``--source``), creates a
fresh cluster, mounts it with the page cache and again with ``--direct-io``, and runs the
suite inside each mount as root, one ``prove`` per script, ``JOBS`` at a time, each bounded
by ``SCRIPT_TIMEOUT_S``. It reports, per directory and in all, the tests ok of those planned,
and every failing test file with its first failure's reason.

A test that never printed its line (its script died, or timed out) counts as not ok.
``ok ... # SKIP`` counts as ok, as prove counts it.

Reference on this machine (../shared/third_party/README.md): local ext4 8,827 of 8,827
ok; JuiceFS 1.4 8,798 of 8,798. The target of issue 21 is 8,798 on both mounts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.progress import Step, no_step
from bench.schema import schema_of
from bench.tables import with_legend
from fuse_mount.mount import start_mount, unmount
from tectonic_emu import Cluster
from tectonic_emu.errors import TectonicError

# Where the suite's source is kept, beside the checkout (read-only: built from a copy).
DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "third_party" / "pjdfstest"
SCRIPT_TIMEOUT_S = 300.0  # one script (the longest, rename/00.t, takes about 30 s here)
# Scripts run at once: 4 took a run from 225 s to 99 s here (2 cores; most of a
# script's time is its sleeps, waiting for second-granular times to move).
JOBS = 4
BUILD = ("autoreconf -ifs", "./configure", "make pjdfstest")

_FILE = re.compile(r"^(\S+\.t) \.\.(?: (.*))?$")
_PLAN = re.compile(r"^1\.\.(\d+)")
_RESULT = re.compile(r"^(not )?ok (\d+)(.*)$")


@dataclass(slots=True)
class TestFile:
    """One of the suite's scripts: its tests planned and ok, and the numbers and first
    reason of those not ok."""

    name: str  # e.g. "chmod/00.t"
    planned: int = 0
    ok: int = 0
    failed: list[int] = field(default_factory=list)
    reason: str = ""  # the first failure's text, or why the script gave no results

    @property
    def directory(self) -> str:
        return self.name.split("/", 1)[0]


@dataclass(slots=True)
class MountRun:
    """The suite on one mount: each script's results, and the run's wall seconds."""

    direct_io: bool
    files: list[TestFile]
    wall_s: float
    planned: int = field(init=False)  # of every script
    ok: int = field(init=False)

    def __post_init__(self) -> None:
        self.planned = sum(f.planned for f in self.files)
        self.ok = sum(f.ok for f in self.files)


@dataclass(slots=True)
class PosixBench:
    source: str  # where the suite was built from
    runs: list[MountRun]
    load_avg: tuple[float, float, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_tap(text: str, tests: Path) -> list[TestFile]:
    """The scripts of ``prove -v --merge`` output ``text``, named relative to ``tests``
    (the suite's tests directory). Tests planned but not reported are not ok."""
    files: list[TestFile] = []
    cur: TestFile | None = None
    for line in text.splitlines():
        m = _FILE.match(line)
        if m:
            path = Path(m[1])
            name = str(path.relative_to(tests)) if path.is_relative_to(tests) else m[1]
            cur = TestFile(name)
            files.append(cur)
            line = m[2] or ""
        if cur is None:
            continue
        if (p := _PLAN.match(line)) and not cur.planned:
            cur.planned = int(p[1])
        elif r := _RESULT.match(line):
            rest = r[3]
            if r[1] is None or "# TODO" in rest:
                cur.ok += 1
            else:
                cur.failed.append(int(r[2]))
                if not cur.reason:
                    cur.reason = rest.removeprefix(" - ").strip()
    for f in files:
        missing = f.planned - f.ok - len(f.failed)
        if missing > 0 and not f.reason:
            f.reason = f"{missing} tests gave no result"
    return files


def build(source: Path, into: Path) -> Path:
    """The suite built from a copy of ``source`` in ``into``; its directory. Raises
    TectonicError naming the step that failed and the log it left."""
    if not (source / "pjdfstest.c").is_file():
        raise TectonicError("no pjdfstest source there (pass --source)", str(source))
    pjd = into / "pjdfstest"
    shutil.copytree(source, pjd)
    log = into / "build.log"
    with log.open("w") as out:
        for cmd in BUILD:
            done = subprocess.run(cmd, shell=True, cwd=pjd, stdout=out, stderr=out, check=False)
            if done.returncode != 0:
                raise TectonicError(f"building pjdfstest: '{cmd}' failed (see {log})", str(pjd))
    return pjd


def run_suite(
    pjd: Path,
    mountpoint: Path,
    only: list[str] | None = None,
    step: Step = no_step,
    jobs: int = JOBS,
) -> list[TestFile]:
    """Every script of the suite built in ``pjd`` (or of the directories ``only``), each
    run by a ``prove`` of its own inside ``mountpoint``, ``jobs`` at a time (each script
    works in a directory of its own, and most of a run is their ``sleep 1``s)."""
    tests = pjd / "tests"
    scripts = sorted(t for t in tests.glob("*/*.t") if only is None or t.parent.name in only)
    done = 0
    lock = threading.Lock()

    def one(script: Path) -> list[TestFile]:
        nonlocal done
        name = str(script.relative_to(tests))
        try:
            out = subprocess.run(
                ["prove", "-v", "--merge", str(script)],
                cwd=mountpoint,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=SCRIPT_TIMEOUT_S,
                check=False,
            ).stdout
        except subprocess.TimeoutExpired as exc:
            got = exc.stdout
            out = got.decode(errors="replace") if isinstance(got, bytes) else (got or "")
        got_files = parse_tap(out, tests) or [TestFile(name, reason="no output (timed out)")]
        with lock:
            done += 1
            step(f"{name} ({done}/{len(scripts)})", done / max(1, len(scripts)))
        return got_files

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, scripts))
    return sorted((f for got in results for f in got), key=lambda f: f.name)


async def run_posix_bench(
    *,
    directory: Path,
    source: Path = DEFAULT_SOURCE,
    only: list[str] | None = None,
    modes: tuple[bool, ...] = (False, True),
    step: Step = no_step,
) -> PosixBench:
    """The suite on a fresh cluster in ``directory``, mounted with the page cache and with
    ``--direct-io`` (``modes``: whether direct I/O, each)."""
    if os.geteuid() != 0:
        raise TectonicError("pjdfstest runs as root (it changes owners and modes)")
    with tempfile.TemporaryDirectory(prefix="tectonic-posix-", dir=directory) as tmp:
        base = Path(tmp)
        step("building pjdfstest")
        pjd = await asyncio.to_thread(build, source, base)
        runs = []
        for direct in modes:
            name = "direct" if direct else "cached"
            cluster, mnt = base / f"cluster-{name}", base / f"mnt-{name}"
            Cluster.create(cluster, nodes=9, encoding="rs-6-3", block_size=64 << 10)
            mnt.mkdir()
            proc = start_mount(cluster, mnt, direct_io=direct, log=base / f"mount-{name}.log")
            t0 = time.perf_counter()
            try:
                files = await asyncio.to_thread(
                    run_suite, pjd, mnt, only, lambda t, f=None, n=name: step(f"{n}: {t}", f)
                )
            finally:
                unmount(mnt, lazy=True)
                proc.wait(30)
            runs.append(MountRun(direct, files, time.perf_counter() - t0))
    return PosixBench(str(source), runs, os.getloadavg())


def table(res: PosixBench) -> list[Table]:
    t = Table(title="pjdfstest on the mount: tests ok of planned", title_justify="left")
    t.add_column("system call", no_wrap=True)
    for run in res.runs:
        t.add_column("--direct-io" if run.direct_io else "page cache", justify="right")
    dirs = sorted({f.directory for run in res.runs for f in run.files})

    def cell(run: MountRun, d: str | None) -> str:
        files = [f for f in run.files if d is None or f.directory == d]
        ok, planned = sum(f.ok for f in files), sum(f.planned for f in files)
        return f"{ok:,}/{planned:,}"

    for d in dirs:
        t.add_row(d, *(cell(run, d) for run in res.runs))
    t.add_row("all", *(cell(run, None) for run in res.runs))
    failing = sorted({f.name for run in res.runs for f in run.files if f.ok < f.planned})
    return [
        with_legend(
            t,
            f"{len(failing)} of {len({f.name for r in res.runs for f in r.files})} scripts "
            "have tests not ok (--json lists each with its first failure); reference here: "
            "ext4 8,827/8,827, JuiceFS 1.4 8,798/8,798",
            "runs: "
            + ", ".join(f"{r.wall_s:.0f} s" for r in res.runs)
            + f"; load average {res.load_avg[0]:.1f}",
        )
    ]


SCHEMA = schema_of(PosixBench, "tectonic-emu/bench-posix/1", "tectonic-emu bench posix --json")

__all__ = [
    "DEFAULT_SOURCE",
    "SCHEMA",
    "MountRun",
    "PosixBench",
    "TestFile",
    "build",
    "parse_tap",
    "run_posix_bench",
    "run_suite",
    "table",
]
