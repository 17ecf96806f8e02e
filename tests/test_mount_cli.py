"""``tectonic-emu mount`` and ``umount`` as a user meets them: the real command, run as a
subprocess against a real FUSE mount. Every stumble is one line on stderr with its cause, no
traceback, exit 1 (2 for a usage error), and never a second mount stacked on the first.

Each test has a mount point of its own; whatever a test leaves mounted there (stacked
mounts included) is detached and its mount processes ended, also when the test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tectonic_emu import Cluster

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs or a namespace (root)")


# -- running the command and reading the mount table -----------------------------------------
def tecto(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tectonic_emu", *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error(r: subprocess.CompletedProcess[str], code: int, *mentions: str) -> str:
    """The single stderr line of a command that failed with exit ``code``."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("tectonic-emu"), lines[0]
    for text in mentions:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def entries(path: Path) -> int:
    """How many file systems /proc/self/mounts has mounted at ``path`` (stacked ones too)."""
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return sum(1 for line in f if line.split()[1] == target)


def mounted_pid(r: subprocess.CompletedProcess[str]) -> int:
    """The mount process's pid, from ``mounted C at M (pid N)``."""
    assert r.returncode == 0, r.stderr
    return int(r.stdout.rsplit("(pid ", 1)[1].split(")")[0])


def gone(pid: int, wait: float = 10.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def mount_processes(mnt: Path) -> list[int]:
    """Pids of tectonic-emu mount processes serving ``mnt`` (a path of this test's own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tectonic_emu" in argv and b"mount" in argv and str(mnt).encode() in argv:
                pids.append(int(entry.name))
    return pids


def clear(mnt: Path) -> None:
    """End the mount processes serving ``mnt`` (SIGTERM unmounts cleanly; SIGKILL if need
    be), then detach whatever is still mounted there, stacked or dead."""
    for pid in mount_processes(mnt):
        os.kill(pid, signal.SIGTERM)
        if not gone(pid, 5.0):
            os.kill(pid, signal.SIGKILL)
            gone(pid, 5.0)
    for _ in range(10):
        if not entries(mnt):
            break
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        else:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


@pytest.fixture
def place(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A small cluster and an empty mount point, cleared afterwards whatever happened."""
    cluster, mnt = tmp_path / "cluster", tmp_path / "mnt"
    Cluster.create(cluster, nodes=5, encoding="r3", block_size=64 << 10)
    mnt.mkdir()
    try:
        yield cluster, mnt
    finally:
        clear(mnt)
        assert entries(mnt) == 0 and not mount_processes(mnt), "left a mount behind"


# -- mount -----------------------------------------------------------------------------------
def test_mounting_on_a_live_mount_is_refused_and_stacks_nothing(place: tuple[Path, Path]) -> None:
    cluster, mnt = place
    first = mounted_pid(tecto("mount", "--cluster", cluster, mnt))
    (mnt / "f").write_bytes(b"kept")
    for extra in ([], ["--foreground"]):
        r = tecto("mount", "--cluster", cluster, *extra, mnt)
        one_error(r, 1, f"already mounted: {mnt}", f"tectonic-emu umount {mnt} first")
        assert entries(mnt) == 1
    assert mount_processes(mnt) == [first]  # no second mount process is left running
    assert (mnt / "f").read_bytes() == b"kept"  # the first mount still serves
    assert tecto("umount", mnt).returncode == 0
    assert entries(mnt) == 0 and gone(first)


def test_a_dead_mount_is_refused_until_umount_clears_it(place: tuple[Path, Path]) -> None:
    cluster, mnt = place
    pid = mounted_pid(tecto("mount", "--cluster", cluster, mnt))
    os.kill(pid, signal.SIGKILL)
    assert gone(pid)
    with pytest.raises(OSError):
        os.listdir(mnt)  # "Transport endpoint is not connected"
    for extra in ([], ["--foreground"]):
        r = tecto("mount", "--cluster", cluster, *extra, mnt)
        one_error(r, 1, f"dead mount: {mnt}", "killed", f"tectonic-emu umount {mnt} clears it")
        assert entries(mnt) == 1
    r = tecto("umount", mnt)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert entries(mnt) == 0
    pid = mounted_pid(tecto("mount", "--cluster", cluster, mnt))  # cleared: mounts again
    assert entries(mnt) == 1 and os.listdir(mnt) == []


def test_a_background_mount_that_fails_says_why(place: tuple[Path, Path]) -> None:
    """The cheap causes, which the command finds before it starts a mount process."""
    cluster, mnt = place
    (mnt.parent / "empty").mkdir()
    (mnt.parent / "file").write_bytes(b"")
    cases = [
        (mnt.parent / "empty", mnt, 1, f"no cluster here (cluster.json missing): {mnt.parent}"),
        (cluster, mnt.parent / "missing", 1, f"mount point does not exist: {mnt.parent}"),
        (cluster, mnt.parent / "file", 2, "is a file"),  # click: a usage error
    ]
    for cluster_dir, point, code, cause in cases:
        r = tecto("mount", "--cluster", cluster_dir, point)
        one_error(r, code, cause)
        assert entries(point) == 0 and not mount_processes(point)


def test_an_error_of_the_mount_process_reaches_the_command(place: tuple[Path, Path]) -> None:
    """A broken metadata store passes the command's own checks (cluster.json is fine): the
    mount process finds it, and its error is the command's."""
    cluster, mnt = place
    (cluster / "metadata.db").write_bytes(b"not a database" * 1000)
    log = mnt.parent / "mount.log"
    r = tecto("mount", "--cluster", cluster, "--log", log, mnt)
    line = one_error(r, 1, "metadata store: file is not a database", "metadata.db")
    assert line in log.read_text()  # said by the mount process, into its log
    assert entries(mnt) == 0 and not mount_processes(mnt)


@needs_root
def test_a_libfuse_failure_is_passed_on_in_its_own_words(place: tuple[Path, Path]) -> None:
    """In a mount namespace of its own, /dev/fuse is /dev/null: the command's checks pass,
    libfuse's mount fails, and what libfuse says is the one line."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    cluster, mnt = place
    script = (
        'mount --bind /dev/null /dev/fuse || exit 99; "$0" -m tectonic_emu mount'
        ' --cluster "$1" $3 "$2"; rc=$?; grep -c " $2 " /proc/self/mounts; exit $rc'
    )
    unshare = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, sys.executable]
    for extra in ("", "--foreground"):
        r = subprocess.run(
            [*unshare, str(cluster), str(mnt), extra],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode != 99, r.stderr
        one_error(r, 1, "libfuse cannot mount (mount failed: Invalid argument)", str(mnt))
        assert r.stdout.split() == ["0"]  # nothing mounted in that namespace either


# -- umount ----------------------------------------------------------------------------------
def test_umount_of_what_is_not_mounted_says_so(place: tuple[Path, Path]) -> None:
    _, mnt = place
    one_error(tecto("umount", mnt), 1, f"not mounted: {mnt}")
    missing = mnt.parent / "missing"
    one_error(tecto("umount", missing), 1, f"not mounted (no such directory): {missing}")
    for r in (tecto("umount", mnt), tecto("umount", missing)):
        assert "fusermount" not in r.stderr


@needs_root
def test_umount_leaves_other_file_systems_alone(place: tuple[Path, Path]) -> None:
    cluster, mnt = place
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], check=True)
    one_error(tecto("umount", mnt), 1, f"not a tectonic-emu mount (tmpfs): {mnt}")
    assert entries(mnt) == 1
    r = tecto("mount", "--cluster", cluster, mnt)
    one_error(r, 1, f"already mounted (tmpfs): {mnt}")
    assert entries(mnt) == 1


def test_umount_of_a_busy_mount_says_what_to_do(place: tuple[Path, Path]) -> None:
    cluster, mnt = place
    pid = mounted_pid(tecto("mount", "--cluster", cluster, mnt))
    with open(mnt / "open", "wb") as f:
        f.write(b"x")
        f.flush()
        r = tecto("umount", mnt)
        one_error(r, 1, f"busy: {mnt}", "close them", f"tectonic-emu umount --lazy {mnt}")
        assert entries(mnt) == 1
    r = tecto("umount", mnt)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert entries(mnt) == 0 and gone(pid)
