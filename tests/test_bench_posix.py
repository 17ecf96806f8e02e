"""``bench posix``: pjdfstest's TAP read right, and the suite built and run in a mount."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from bench import posix
from tectonic_emu.errors import TectonicError

TESTS = Path("/x/pjd/tests")

# What ``prove -r -v --merge`` prints (cut down; its header lines end in a space, or not):
# a script with failures and a SKIP, a passing one, one that died after a TODO, and one
# whose plan shares the header line.
TAP = """\
/x/pjd/tests/chmod/00.t ..\x20
1..4
ok 1
not ok 2 - tried 'stat a mode', expected 0111, got 0644
ok 3 # SKIP not here
not ok 4 - tried 'chmod b 0222', expected 0, got ENOENT
Failed 2/4 subtests
/x/pjd/tests/chmod/08.t ..
1..1
ok 1
ok
/x/pjd/tests/link/00.t ..
1..5
ok 1
not ok 2 # TODO known
Dubious, test returned 1
/x/pjd/tests/mkfifo/01.t .. 1..2
ok 1
ok 2
ok

Test Summary Report
-------------------
/x/pjd/tests/chmod/00.t (Wstat: 0 Tests: 4 Failed: 2)
  Failed tests:  2, 4
Files=4, Tests=12,  1 wallclock secs
Result: FAIL
"""


def test_tap_is_read_per_script_with_missing_results_not_ok() -> None:
    files = {f.name: f for f in posix.parse_tap(TAP, TESTS)}
    assert list(files) == ["chmod/00.t", "chmod/08.t", "link/00.t", "mkfifo/01.t"]
    chmod = files["chmod/00.t"]
    assert (chmod.planned, chmod.ok, chmod.failed) == (4, 2, [2, 4])  # a SKIP is ok
    assert chmod.reason == "tried 'stat a mode', expected 0111, got 0644"  # the first
    assert (files["chmod/08.t"].planned, files["chmod/08.t"].ok) == (1, 1)
    link = files["link/00.t"]  # a TODO passes; three never reported
    assert (link.planned, link.ok, link.failed) == (5, 2, [])
    assert link.reason == "3 tests gave no result"
    assert (files["mkfifo/01.t"].planned, files["mkfifo/01.t"].ok) == (2, 2)
    run = posix.MountRun(False, list(files.values()), 1.0)
    assert (run.planned, run.ok) == (12, 7)


def test_a_missing_source_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TectonicError, match="no pjdfstest source"):
        posix.build(tmp_path / "nowhere", tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="pjdfstest runs as root")
@pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)
@pytest.mark.skipif(
    not posix.DEFAULT_SOURCE.is_dir() or not shutil.which("autoreconf"),
    reason="pjdfstest's source or autotools missing (scripts/bootstrap.sh installs them)",
)
@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "direct-io"])
def test_every_pjdfstest_test_is_ok_on_a_fresh_mount(tmp_path: Path, direct: bool) -> None:
    """Issue 21's target, in CI: the whole suite built and run by ``prove`` inside a fresh
    mount (about 100 s here, 4 scripts at a time), every planned test ok, as on JuiceFS.
    A failure names each script with tests not ok and its first failure."""
    res = asyncio.run(posix.run_posix_bench(directory=tmp_path, modes=(direct,)))
    (run,) = res.runs
    bad = [
        f"{f.name}: {f.planned - f.ok} of {f.planned} not ok, the first: {f.reason}"
        for f in run.files
        if f.ok < f.planned
    ]
    assert not bad, "pjdfstest tests not ok:\n" + "\n".join(bad)
    scripts = sorted((posix.DEFAULT_SOURCE / "tests").glob("*/*.t"))
    assert len(run.files) == len(scripts) and all(f.planned > 0 for f in run.files)
    assert run.ok == run.planned == 8_798  # pjdfstest 85a8aea on a file system not ext4
    (table,) = posix.table(res)
    assert table.row_count == len({s.parent.name for s in scripts}) + 1  # and "all"
    assert not list(tmp_path.iterdir())  # the build, cluster and mount point cleaned up
