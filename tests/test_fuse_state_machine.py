"""Random operations on a real mount and on a local directory, compared after every step.

The JuiceFS pattern: each operation runs on both sides and must give the same result, or fail
with the same errno; after every step both trees must hold the same names and the same of
each. The local directory is the model, so nothing here predicts POSIX by hand.

One cluster and one mount per test function; each hypothesis example works in a fresh
directory of its own on both sides. Names come from a small universe (three at the top, two
below each), so a name is often a file on one step and a directory, a symlink or a fifo the
next, and calls that must fail (mkdir over a name, rmdir of a full directory or of a file,
unlink of a directory, a path under a file, a missing file, a 256-byte name, a hard link to a
directory, a symlink over a name, readlink of a file, a dangling or looping symlink) come up
by themselves; ``must_fail`` also picks them on purpose from the tree as it is, and
``rename`` the moves that succeed.

What is compared, of every name (by lstat) and of the example's directory itself: its kind;
its permission bits with setuid, setgid and sticky (``chmod`` sets any of 0..0o7777); its
owner and group (``chown``); its link count, a directory's too (2 and one per
subdirectory); which other names are the same file (hard links: "same inode as name X",
never the numbers, which differ between the sides); a file's size and bytes, a symlink's
target. A directory's size is not (ext4 reports its block size, the mount 0). Times: the
atime and mtime ``utime`` sets explicitly (in nanoseconds) must read back, and the mtime
stay on the mount until the local one moves (a write, a name added to a directory), and
then must have moved there too. A time set "now" differs between the sides by how long a
call takes and is never compared: a touch's, and the ctime a chmod, chown or utime moves,
are checked to fall within the call. Files kept open across steps (``open_fd``) are
compared by fstat after every step too, while their names are renamed, unlinked and linked,
and their bytes must land in the file wherever it went (``write_while_moved`` too).

Errnos are compared exactly: no call here has a reason to fail differently on the store
than on ext4.

The bugs the machine found have tests of their own at the end, all fixed but three, which
are limits of libfuse's high-level API (``docs/posix.md``), kept as strict xfails: the
machine steers around each of those where a docstring names its test (an ``event`` counts
how often), so that it keeps finding new ones.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import random
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fuse_mount.mount import is_mounted, start_mount, unmount
from tectonic_emu import Cluster, TectonicError

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)

BLOCK = 64 << 10  # the cluster's block size; an rs-3-3 block holds 3 of them
# A call on the mount taking longer than this is a hang (they take milliseconds here).
HANG = 10.0

PATHS = ("a", "b", "c", "a/x", "a/y", "b/x", "b/y", "c/x", "c/y")
paths = st.sampled_from(PATHS)
LONG_OPS = ("mkdir", "create", "stat", "rename to", "rename from")
EDGES = (0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK - 1, 3 * BLOCK, 3 * BLOCK + 1)
NONDIRS = ("file", "symlink", "fifo")
# Symlink targets: names of the universe (resolved from wherever the link is, so the same
# target names different things in different directories), dangling ones, one 4,000 bytes
# long. None climbs out with "..": a link can be moved anywhere, and one at the top would
# lead out of the example's directory.
TARGETS = (
    *PATHS,
    "x",
    "y",
    ".",
    "nowhere",
    "a/nowhere",
    "/nowhere/at/all",
    "/".join(["d" * 199] * 20),
)
IDS = (-1, 0, 1000, 65534)  # uids and gids; -1 keeps it
# Times utimensat sets, in nanoseconds: the epoch, before it, 2038 and after, and any other
# (ext4 keeps 1901-12-13 to 2446; these stay within).
times_ns = st.sampled_from(
    (0, 1, 10**9, -(10**9), 1_234_567_890_123_456_789, 2**31 * 10**9 - 1, 2**32 * 10**9)
) | st.integers(-(2**31) * 10**9, 2**62)
# The mount keeps times as float seconds (docs/fuse.md: "to about 0.25 us" for today's; 1 us
# by 2**62 ns), ext4 every nanosecond.
TIME_SLOP_NS = 2_000
# A time set "now" by a call falls between the clock read before it and after it, give or
# take the coarse clock ext4 stamps with (a jiffy behind).
CLOCK_SLOP_NS = 50_000_000
# Files kept open at once (``open_fd``), and how they are opened.
MAX_OPEN = 3
OPEN_FLAGS = {
    "r": os.O_RDONLY,
    "r+": os.O_RDWR,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "w+": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
    "creat": os.O_WRONLY | os.O_CREAT,
    "creat+": os.O_RDWR | os.O_CREAT,
    "excl": os.O_RDWR | os.O_CREAT | os.O_EXCL,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "a+": os.O_RDWR | os.O_APPEND,
}
create_modes = st.sampled_from((0o644, 0o600, 0o4755, 0o2770, 0))
FD_CALLS = ("write", "pwrite", "ftruncate", "read", "pread", "seek")


@dataclass(frozen=True)
class Payload:
    """``size`` bytes drawn from ``seed`` (printed as such in a failing example)."""

    size: int
    seed: int

    def make(self) -> bytes:
        return random.Random(self.seed).randbytes(self.size)


payloads = st.builds(
    Payload, st.one_of(st.integers(0, 300_000), st.sampled_from(EDGES)), st.integers(0, 255)
)
small_payloads = st.builds(
    Payload, st.one_of(st.integers(0, 2 * BLOCK), st.sampled_from(EDGES[:5])), st.integers(0, 255)
)

Outcome = tuple[str, Any]  # ("ok", result) or ("err", errno name)


def attempt(fn: Callable[[Any], Any], arg: Any) -> Outcome:
    try:
        return "ok", fn(arg)
    except OSError as e:
        return "err", errno.errorcode.get(e.errno or 0, e.errno)


@dataclass(frozen=True)
class Entry:
    """One name as lstat shows it, and what it holds (``snapshot``). ``ino`` and
    ``mtime_ns`` differ between the sides and are left out of ``==``."""

    kind: str  # "dir", "file", "symlink", "fifo" or "other"
    mode: int  # the permission bits, setuid, setgid and sticky
    uid: int
    gid: int
    nlink: int
    size: int | None  # None for a directory (ext4 gives its block size, the mount 0)
    content: bytes | str | None  # a file's bytes, a symlink's target
    same_as: str | None  # a non-directory's first name (sorted) of all it has: hard links
    ino: int = field(compare=False)
    mtime_ns: int = field(compare=False)

    def brief(self) -> Entry:
        """This without a file's bytes (their length instead), for assertion messages."""
        if isinstance(self.content, bytes):
            return replace(self, content=f"<{len(self.content)} bytes>")
        return self


def kind_of(mode: int) -> str:
    for kind, test in (
        ("dir", stat.S_ISDIR),
        ("file", stat.S_ISREG),
        ("symlink", stat.S_ISLNK),
        ("fifo", stat.S_ISFIFO),
    ):
        if test(mode):
            return kind
    return "other"


def _lstat_tree(root: Path, rel: str = "") -> Iterator[tuple[str, os.stat_result]]:
    for entry in os.scandir(root / rel):
        name = f"{rel}/{entry.name}" if rel else entry.name
        st_ = os.lstat(root / name)
        yield name, st_
        if stat.S_ISDIR(st_.st_mode):
            yield from _lstat_tree(root, name)


def snapshot(root: Path) -> dict[str, Entry]:
    """Every name below ``root``, and ``root`` itself as "." (never following a symlink,
    never opening a fifo)."""
    found = sorted([(".", os.lstat(root)), *_lstat_tree(root)], key=lambda t: t[0])
    first: dict[int, str] = {}
    out: dict[str, Entry] = {}
    for name, st_ in found:
        kind = kind_of(st_.st_mode)
        content: bytes | str | None = None
        if kind == "file":
            content = (root / name).read_bytes()
        elif kind == "symlink":
            content = os.readlink(root / name)
        same_as = None if kind == "dir" else first.setdefault(st_.st_ino, name)
        out[name] = Entry(
            kind,
            stat.S_IMODE(st_.st_mode),
            st_.st_uid,
            st_.st_gid,
            st_.st_nlink,
            None if kind == "dir" else st_.st_size,
            content,
            same_as,
            st_.st_ino,
            st_.st_mtime_ns,
        )
    return out


def kinds(root: Path) -> dict[str, str]:
    """Every name below ``root`` (a local directory): "dir", "file", "symlink" or "fifo"."""
    return {name: kind_of(st_.st_mode) for name, st_ in _lstat_tree(root)}


def attrs(st_: os.stat_result) -> tuple[str, int, int, int, int, int | None]:
    """What stat says of a name that both sides must agree on: kind, permission bits,
    owner, group, link count and, but of a directory, size."""
    kind = kind_of(st_.st_mode)
    size = None if kind == "dir" else st_.st_size
    return kind, stat.S_IMODE(st_.st_mode), st_.st_uid, st_.st_gid, st_.st_nlink, size


def parent_of(path: str) -> str:
    return path.rpartition("/")[0]


def below(path: str, top: str) -> bool:
    return path.startswith(top + "/")


def summary(snap: dict[str, Entry]) -> dict[str, Entry]:
    """A snapshot without the bytes, for assertion messages."""
    return {k: v.brief() for k, v in snap.items()}


@dataclass
class OpenPair:
    """A file kept open on both sides (``open_fd``): its two descriptors, how it was opened
    and the name it was opened by (it may have another by now, or none)."""

    mine: int
    theirs: int
    how: str
    path: str


@dataclass
class Sides:
    """The mount (of a cluster of its own) and the local directory it is compared with."""

    cluster: Path
    mnt: Path
    local: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    counter: Iterator[int] = field(default_factory=itertools.count)
    hung: bool = False

    def start(self) -> None:
        self.proc = start_mount(self.cluster, self.mnt, log=self.log)

    def stop(self) -> None:
        """Unmount and reap the mount process; never leaves a mount behind."""
        try:
            if is_mounted(self.mnt):
                unmount(self.mnt)
        except TectonicError:  # busy: a call still stuck in it
            unmount(self.mnt, lazy=True)
        finally:
            if self.proc is not None:
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        assert not is_mounted(self.mnt)

    def revive(self) -> None:
        """After a hang killed the mount: a fresh one, so hypothesis can replay and shrink."""
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.start()

    def _kill(self) -> None:
        self.hung = True
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)

    @contextlib.contextmanager
    def watched(self, limit: float = HANG) -> Iterator[None]:
        """Kill the mount if the block takes over ``limit`` s: the stuck call then fails
        (ECONNABORTED) and this reports the hang instead of blocking the test run."""
        self.hung = False
        timer = threading.Timer(limit, self._kill)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
        assert not self.hung, f"a call on the mount hung for over {limit:.0f} s"
        assert self.proc is not None and self.proc.poll() is None, "the mount process died"


class MountVsLocal(RuleBasedStateMachine):
    """Operations applied to ``mine`` (on the mount) and ``theirs`` (local), compared."""

    sides: Sides  # set on a subclass per test

    def __init__(self) -> None:
        super().__init__()
        self.sides.revive()
        name = f"ex{next(self.sides.counter)}"
        self.mine, self.theirs = self.sides.mnt / name, self.sides.local / name
        with self.sides.watched():
            self.mine.mkdir()
        self.theirs.mkdir()
        self.open: list[OpenPair] = []
        # Local inode -> the mtime ``utime`` set on it explicitly (``trees_match``).
        self.pinned: dict[int, int] = {}

    def teardown(self) -> None:
        """Close the files left open (on a mount still alive, watched for a hang)."""
        fds = [fd for o in self.open for fd in (o.mine, o.theirs)]
        self.open = []
        alive = self.sides.proc is not None and self.sides.proc.poll() is None
        with self.sides.watched() if alive else contextlib.nullcontext():
            _close_quietly(fds)

    def pair(
        self,
        op: str,
        fn: Callable[[Any], Any],
        args: tuple[Any, Any] | None = None,
        key: Callable[[Any], Any] | None = None,
    ) -> tuple[Outcome, Outcome]:
        """Run ``fn`` on each side's argument (by default its directory): the outcomes must
        agree (as ``key`` sees a result, if given). Returns both."""
        mine_arg, theirs_arg = (self.mine, self.theirs) if args is None else args
        with self.sides.watched():
            mine = attempt(fn, mine_arg)
        theirs = attempt(fn, theirs_arg)
        event(f"{op}: {theirs[1] if theirs[0] == 'err' else 'ok'}")
        seen = [(k, v if k == "err" or key is None else key(v)) for k, v in (mine, theirs)]
        assert seen[0] == seen[1], f"{op}: mount {_short(seen[0])} != local {_short(seen[1])}"
        return mine, theirs

    def both(self, op: str, fn: Callable[[Path], Any]) -> Outcome:
        """Run ``fn`` on each side; they must agree. Returns the outcome."""
        return self.pair(op, fn)[1]

    def pick(self, data: st.DataObject, *wanted: str) -> str:
        """A name of the universe; mostly one that exists (of a ``wanted`` kind, if any do)."""
        there = sorted(p for p, k in kinds(self.theirs).items() if not wanted or k in wanted)
        if there and data.draw(st.integers(0, 3), label="existing unless 0") != 0:
            return data.draw(st.sampled_from(there), label="path")
        return data.draw(paths, label="path")

    def free(self) -> list[str]:
        """The names of the universe that are not there and could be (their parent is)."""
        k = {**kinds(self.theirs), "": "dir"}
        return [p for p in PATHS if p not in k and k.get(parent_of(p)) == "dir"]

    def pick_free(self, data: st.DataObject) -> str:
        """A name to create: mostly one that can be, else any."""
        free = self.free()
        if free and data.draw(st.integers(0, 3), label="free unless 0") != 0:
            return data.draw(st.sampled_from(free), label="new path")
        return data.draw(paths, label="new path")

    def size_of(self, path: str) -> int:
        try:
            return (self.theirs / path).stat().st_size
        except OSError:
            return 0

    # -- libfuse's limits, steered around (a strict xfail test of each at the end) -------
    def kept_open(self, *, for_writing: bool = False) -> set[int]:
        """The (local) inodes of the files kept open (``for_writing``: and writable)."""
        return {os.fstat(o.theirs).st_ino for o in self.open if o.how != "r" or not for_writing}

    def leave_be(self, path: str) -> bool:
        """Whether a rule should not open ``path``: it leads to a fifo (through symlinks
        too), which would block."""
        try:
            st_ = os.stat(self.theirs / path)
        except OSError:
            return False
        if stat.S_ISFIFO(st_.st_mode):
            event("a fifo, not opened")
            return True
        return False

    def an_unlinked_file_kept_open(self) -> bool:
        """Whether a file kept open has no name left (where libfuse hid it, in which
        directory, is not tracked here). A limit of libfuse's API: once that directory is
        removed, fstat of the file fails (ESTALE) when the kernel asks again
        (``test_an_unlinked_open_file_in_a_removed_directory``)."""
        return any(os.fstat(o.theirs).st_nlink == 0 for o in self.open)

    def an_open_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory kept open (``open_fd`` "r"). A mount bug: once it
        is removed, fstat of it fails with ESTALE, a limit of libfuse's API
        (``test_fstat_of_an_open_directory_removed``); the rules leave it be."""
        st_ = _lstat_or_none(self.theirs / path)
        if st_ is None or not stat.S_ISDIR(st_.st_mode) or st_.st_ino not in self.kept_open():
            return False
        event("a directory kept open: not removed (a libfuse limit)")
        return True

    def over_its_own(self, src: str, dst: str) -> bool:
        """Whether renaming ``src`` over ``dst`` is over another name of the same file, kept
        open. A limit of libfuse's API: it hides ``dst`` first (as if unlinked), and the
        rename, which should do nothing, takes it away
        (``test_renaming_a_name_over_another_of_an_open_file``)."""
        a, b = _lstat_or_none(self.theirs / src), _lstat_or_none(self.theirs / dst)
        if a is None or b is None or a.st_ino != b.st_ino or stat.S_ISDIR(a.st_mode):
            return False
        if b.st_ino not in self.kept_open():
            return False
        event("a name over another of a file kept open: not renamed (a libfuse limit)")
        return True

    @initialize(
        dirs=st.sets(st.sampled_from(("a", "b", "a/x", "b/y"))),
        files=st.lists(st.tuples(paths, payloads), max_size=4),
        links=st.lists(st.tuples(paths, st.sampled_from(TARGETS)), max_size=2),
    )
    def populate(
        self, dirs: set[str], files: list[tuple[str, Payload]], links: list[tuple[str, str]]
    ) -> None:
        """Start from a small tree, so the rules meet files, directories and symlinks early."""
        for path in sorted(dirs):
            self.mkdir_at(path)
        for path, payload in files:
            self.write_whole(path, [payload.make()])
        for path, to in links:
            self.symlink_at(path, to)

    def write_whole(
        self,
        path: str,
        datas: list[bytes],
        patch: tuple[int, bytes] | None = None,
        read_back: bool = False,
        *,
        op: str = "write_file",
    ) -> None:
        """open(O_TRUNC | O_CREAT), write ``datas``, maybe ``patch`` (offset, bytes), maybe read
        the file back through the same descriptor, with an fstat while it is open (the size
        of a file open with O_TRUNC: ``test_size_while_a_longer_file_is_open_with_o_trunc``)."""
        flags = os.O_CREAT | os.O_TRUNC | (os.O_RDWR if read_back else os.O_WRONLY)

        def go(root: Path) -> Any:
            fd = os.open(root / path, flags, 0o644)
            try:
                for data in datas:
                    _write_all(fd, data)
                if patch is not None:
                    os.lseek(fd, patch[0], os.SEEK_SET)
                    _write_all(fd, patch[1])
                if not read_back:
                    return None
                size = os.fstat(fd).st_size
                os.lseek(fd, 0, os.SEEK_SET)
                got = _read_all(fd)
                assert size in (None, len(got)), (size, len(got))
                return got
            finally:
                os.close(fd)

        self.both(op, go)

    # -- writes --------------------------------------------------------------------------------
    @rule(
        data=st.data(),
        chunks=st.lists(payloads, min_size=1, max_size=3),
        patch=st.none() | st.tuples(st.integers(0, 1100), small_payloads),
        read_back=st.booleans(),
    )
    def write_file(
        self,
        data: st.DataObject,
        chunks: list[Payload],
        patch: tuple[int, Payload] | None,
        read_back: bool,
    ) -> None:
        """'wb' (a new file, or O_TRUNC over one), sequential writes, maybe a patch at an
        offset per mille of what was written (a header fixed at the end; past it too)."""
        path = self.pick(data)
        if self.leave_be(path):
            return
        datas = [c.make() for c in chunks]
        at = None if patch is None else (sum(map(len, datas)) * patch[0] // 1000, patch[1].make())
        self.write_whole(path, datas, at, read_back)

    @rule(data=st.data(), payload=payloads)
    def append(self, data: st.DataObject, payload: Payload) -> None:
        path = self.pick(data, "file", "symlink")
        if self.leave_be(path):
            return
        added = payload.make()

        def go(root: Path) -> None:
            with open(root / path, "ab") as f:
                f.write(added)

        self.both("append", go)

    @rule(
        data=st.data(),
        writes=st.lists(small_payloads, min_size=1, max_size=2),
        read_back=st.booleans(),
    )
    def write_at(self, data: st.DataObject, writes: list[Payload], read_back: bool) -> None:
        """open 'r+b' an existing file and write inside it, at its end, or past it."""
        path = self.pick(data, "file")
        if self.leave_be(path):
            return
        size = self.size_of(path)
        spots = []
        for _ in writes:
            if data.draw(st.booleans(), label="past the end"):
                spots.append(size + data.draw(st.sampled_from((0, 1, BLOCK, 100_000)), label="by"))
            else:
                spots.append(size * data.draw(st.integers(0, 1000), label="per mille") // 1000)

        def go(root: Path) -> Any:
            with open(root / path, "r+b") as f:
                for spot, w in zip(spots, writes, strict=True):
                    f.seek(spot)
                    f.write(w.make())
                return _read_back(f) if read_back else None

        self.both("write_at", go)

    @rule(data=st.data(), grow=st.booleans())
    def truncate(self, data: st.DataObject, grow: bool) -> None:
        path = self.pick(data, "file", "symlink")
        size = self.size_of(path)
        if grow:
            to = size + data.draw(st.sampled_from((1, BLOCK, 150_000)), label="by")
        else:
            to = size * data.draw(st.integers(0, 1000), label="per mille") // 1000
        self.both("truncate", lambda root: os.truncate(root / path, to))

    @rule(
        data=st.data(),
        by=st.sampled_from((1, BLOCK, 3 << 20)),
        before=st.none() | small_payloads,
        after=st.none() | small_payloads,
    )
    def ftruncate_grow(
        self, data: st.DataObject, by: int, before: Payload | None, after: Payload | None
    ) -> None:
        """Grow a file through an open handle (a hole on the mount, 3 MiB of it past the
        staging file's MIN_HOLE), perhaps after a write inside it (staged) and before one at
        the new end."""
        path = self.pick(data, "file")
        if self.leave_be(path):
            return
        size = self.size_of(path)
        inside = size * data.draw(st.integers(0, 1000), label="per mille") // 1000
        patch = None if before is None else before.make()
        tail = None if after is None else after.make()

        def go(root: Path) -> None:
            fd = os.open(root / path, os.O_RDWR)
            try:
                if patch is not None:
                    os.pwrite(fd, patch, inside)
                end = os.fstat(fd).st_size + by
                os.ftruncate(fd, end)
                if tail is not None:
                    os.pwrite(fd, tail, end)
            finally:
                os.close(fd)

        self.both("ftruncate_grow", go)

    # -- reads ---------------------------------------------------------------------------------
    @rule(data=st.data())
    def read_range(self, data: st.DataObject) -> None:
        path = self.pick(data, "file", "symlink")
        if self.leave_be(path):
            return
        size = self.size_of(path)
        offset = size * data.draw(st.integers(0, 1200), label="offset per mille") // 1000
        n = data.draw(st.sampled_from((-1, 1, BLOCK)) | st.integers(0, 200_000), label="n")

        def go(root: Path) -> bytes:
            with open(root / path, "rb") as f:
                f.seek(offset)
                return f.read(n)

        self.both("read_range", go)

    @rule(data=st.data())
    def listdir(self, data: st.DataObject) -> None:
        path = self.pick(data, "dir")
        self.both("listdir", lambda root: sorted(os.listdir(root / path)))

    @rule(data=st.data(), follow=st.booleans())
    def stat_path(self, data: st.DataObject, follow: bool) -> None:
        """stat (through symlinks) or lstat: ``attrs``."""
        path = self.pick(data)
        self.both(
            "stat" if follow else "lstat",
            lambda root: attrs(os.stat(root / path, follow_symlinks=follow)),
        )

    @rule(data=st.data())
    def readlink(self, data: st.DataObject) -> None:
        path = self.pick(data, "symlink")
        self.both("readlink", lambda root: os.readlink(root / path))

    # -- namespace -----------------------------------------------------------------------------
    @rule(data=st.data())
    def mkdir(self, data: st.DataObject) -> None:
        self.mkdir_at(self.pick(data, "dir"))

    def mkdir_at(self, path: str) -> None:
        self.both("mkdir", lambda root: os.mkdir(root / path))

    @rule(data=st.data())
    def rmdir(self, data: st.DataObject) -> None:
        path = self.pick(data, "dir")
        if self.an_open_dir(path):
            return
        if self.an_unlinked_file_kept_open():
            event("an unlinked file kept open: no directory removed (a libfuse limit)")
            return
        self.both("rmdir", lambda root: os.rmdir(root / path))

    @rule(data=st.data())
    def unlink(self, data: st.DataObject) -> None:
        path = self.pick(data, *NONDIRS)
        self.both("unlink", lambda root: os.unlink(root / path))

    @rule(data=st.data(), to=st.sampled_from(TARGETS))
    def symlink(self, data: st.DataObject, to: str) -> None:
        self.symlink_at(self.pick_free(data), to)

    def symlink_at(self, path: str, to: str) -> None:
        self.both("symlink", lambda root: os.symlink(to, root / path))

    @rule(data=st.data(), follow=st.booleans())
    def link(self, data: st.DataObject, follow: bool) -> None:
        """A hard link to a file, a fifo or a symlink (or, ``follow``ing one, to what it
        names): ``trees_match`` sees the names as one file, with one link count."""
        src, dst = self.pick(data, *NONDIRS), self.pick_free(data)
        self.both("link", lambda root: os.link(root / src, root / dst, follow_symlinks=follow))

    @rule(data=st.data(), mode=st.sampled_from((0o644, 0o600, 0o7777)))
    def mkfifo(self, data: st.DataObject, mode: int) -> None:
        path = self.pick_free(data)
        self.both("mkfifo", lambda root: os.mkfifo(root / path, mode))

    @rule(data=st.data())
    def rename(self, data: st.DataObject) -> None:
        """Any two names (missing, into themselves, over full directories...), or a move that
        should succeed: a file (or symlink, or fifo) or a directory to a free name, a file
        over a file, a directory over an empty one, a name over another of the same file
        (which does nothing)."""
        k = kinds(self.theirs)
        free = self.free()
        empty = [d for d, v in k.items() if v == "dir" and not any(below(p, d) for p in k)]
        files = sorted(p for p, v in k.items() if v != "dir")
        inode = {f: os.lstat(self.theirs / f).st_ino for f in files}
        moves = {
            "file to a free name": [(f, p) for f in files for p in free],
            "file over a file": [(f, g) for f in files for g in files if f != g],
            "dir to a free name": [
                (d, p) for d, v in k.items() if v == "dir" for p in free if not below(p, d)
            ],
            "dir over an empty dir": [
                (d, e) for d, v in k.items() if v == "dir" for e in empty if not below(e, d)
            ],
            "a name over the same file's": [
                (f, g) for f in files for g in files if f != g and inode[f] == inode[g]
            ],
        }
        shape = data.draw(st.sampled_from(["any", *sorted(m for m in moves if moves[m])]))
        if shape == "any":
            src, dst = self.pick(data), self.pick(data)
        else:
            src, dst = data.draw(st.sampled_from(sorted(moves[shape])), label="move")
        self.rename_at(f"rename ({shape})", src, dst)

    def rename_at(self, op: str, src: str, dst: str) -> None:
        if self.over_its_own(src, dst) or self.an_open_dir(dst):
            return
        self.both(op, lambda root: os.rename(root / src, root / dst))

    @rule(data=st.data(), length=st.sampled_from((255, 256)), op=st.sampled_from(LONG_OPS))
    def long_name(self, data: st.DataObject, length: int, op: str) -> None:
        """255 bytes is a name; 256 is ENAMETOOLONG, whatever the call."""
        parent = data.draw(st.just("") | st.sampled_from(PATHS[:3]), label="parent")
        name = f"{parent}/{'n' * length}" if parent else "n" * length
        if op == "create":
            if not self.leave_be(name):
                self.write_whole(name, [b"long"], op=f"long_name create {length}")
            return
        calls: dict[str, Callable[[Path], Any]] = {
            "mkdir": lambda root: os.mkdir(root / name),
            "stat": lambda root: stat.S_IFMT(os.stat(root / name).st_mode),
        }
        if op == "rename to":
            self.rename_at(f"long_name {op} {length}", "b", name)
        elif op == "rename from":
            self.rename_at(f"long_name {op} {length}", name, "c")
        else:
            self.both(f"long_name {op} {length}", calls[op])

    # -- attributes ----------------------------------------------------------------------------
    def change(
        self, op: str, path: str, call: Callable[[Path], None], follow: bool, ctime: bool = True
    ) -> tuple[os.stat_result, os.stat_result] | None:
        """``call`` on ``path`` on each side, then stat it (lstat unless ``follow``): the same
        outcome and ``attrs``, and (``ctime``) the ctime moved to now. Returns the two stats
        (the mount's, the local one's), or None when the call failed (alike)."""

        def go(root: Path) -> os.stat_result:
            call(root / path)
            return os.stat(root / path, follow_symlinks=follow)

        before = time.time_ns()
        mine, theirs = self.pair(op, go, key=attrs)
        after = time.time_ns()
        if theirs[0] == "err":
            return None
        for side, st_ in (("mount", mine[1]), ("local", theirs[1])):
            if ctime:
                _assert_now(f"{op}: the {side} ctime", st_.st_ctime_ns, before, after)
        return mine[1], theirs[1]

    @rule(data=st.data(), mode=st.integers(0, 0o7777))
    def chmod(self, data: st.DataObject, mode: int) -> None:
        """Any permission bits, setuid, setgid and sticky too (through a symlink)."""
        self.change("chmod", self.pick(data), lambda p: os.chmod(p, mode), follow=True)

    @rule(data=st.data(), uid=st.sampled_from(IDS), gid=st.sampled_from(IDS), follow=st.booleans())
    def chown(self, data: st.DataObject, uid: int, gid: int, follow: bool) -> None:
        """chown or lchown; it clears setuid (and setgid with group execute) of a file,
        even by root. POSIX lets chown(-1, -1) leave the ctime."""
        self.change(
            "chown" if follow else "lchown",
            self.pick(data),
            lambda p: os.chown(p, uid, gid, follow_symlinks=follow),
            follow,
            ctime=(uid, gid) != (-1, -1),
        )

    @rule(
        data=st.data(),
        times=st.none() | st.tuples(times_ns, times_ns),
        follow=st.booleans(),
    )
    def utime(self, data: st.DataObject, times: tuple[int, int] | None, follow: bool) -> None:
        """Set atime and mtime explicitly (nanoseconds), or to now (a touch), through a
        symlink or of the symlink itself. An explicit mtime is remembered for
        ``trees_match``."""
        path = self.pick(data)

        def call(p: Path) -> None:
            if times is None:
                os.utime(p, follow_symlinks=follow)
            else:
                os.utime(p, ns=times, follow_symlinks=follow)

        before = time.time_ns()
        stats = self.change("utime" if follow else "lutime", path, call, follow)
        after = time.time_ns()
        if stats is None:
            return
        for side, st_ in zip(("mount", "local"), stats, strict=True):
            got = st_.st_atime_ns, st_.st_mtime_ns
            if times is None:
                for what, ns in zip(("atime", "mtime"), got, strict=True):
                    _assert_now(f"utime now: the {side} {what}", ns, before, after)
            else:
                off = max(abs(g - t) for g, t in zip(got, times, strict=True))
                assert off <= TIME_SLOP_NS, f"utime: the {side} (atime, mtime) {got} != {times}"
        if times is not None:
            self.pinned[stats[1].st_ino] = stats[1].st_mtime_ns

    # -- files kept open -----------------------------------------------------------------------
    @precondition(lambda self: len(self.open) < MAX_OPEN)
    @rule(
        data=st.data(),
        how=st.sampled_from(sorted(OPEN_FLAGS)),
        mode=create_modes,
        new=st.booleans(),
    )
    def open_fd(self, data: st.DataObject, how: str, mode: int, new: bool) -> None:
        """Open a file on each side and keep it open across the steps that follow
        (``fd_io``, ``close_fd``, and renames, unlinks and links of its names)."""
        path = self.pick_free(data) if new else self.pick(data, "file", "symlink")
        if self.leave_be(path):
            return
        opened: list[int] = []

        def go(root: Path) -> int:
            fd = os.open(root / path, OPEN_FLAGS[how], mode)
            opened.append(fd)
            return fd

        try:
            mine, theirs = self.pair(f"open {how}", go, key=lambda fd: "an fd")
        except AssertionError:
            _close_quietly(opened)
            raise
        if theirs[0] == "ok":
            self.open.append(OpenPair(mine[1], theirs[1], how, path))

    @precondition(lambda self: bool(self.open))
    @rule(
        data=st.data(),
        calls=st.lists(
            st.tuples(st.sampled_from(FD_CALLS), small_payloads), min_size=1, max_size=3
        ),
    )
    def fd_io(self, data: st.DataObject, calls: list[tuple[str, Payload]]) -> None:
        """On a file kept open, wherever its names went, a few of: write at the file offset
        (at the end with O_APPEND), pwrite, ftruncate, read, pread or seek (inside, at the
        end, past it)."""
        o = data.draw(st.sampled_from(self.open), label="open file")
        for call, payload in calls:
            st_ = os.fstat(o.theirs)
            if data.draw(st.booleans(), label="past the end"):
                at = st_.st_size + data.draw(st.sampled_from((0, 1, BLOCK)), label="by")
            else:
                at = st_.st_size * data.draw(st.integers(0, 1000), label="per mille") // 1000
            n = data.draw(st.sampled_from((1, BLOCK, 200_000)), label="n")
            fn = _fd_call(call, payload.make(), at, n)
            self.pair(f"{call} ({o.how})", fn, (o.mine, o.theirs))

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def close_fd(self, data: st.DataObject) -> None:
        o = data.draw(st.sampled_from(self.open), label="open file")
        self.open.remove(o)
        self.pair(f"close ({o.how})", os.close, (o.mine, o.theirs))

    @rule(
        data=st.data(),
        how=st.sampled_from(("r+", "w+", "creat", "a")),
        first=small_payloads,
        then=small_payloads,
    )
    def write_while_moved(
        self, data: st.DataObject, how: str, first: Payload, then: Payload
    ) -> None:
        """In one step: open a file, write, take its name away (renamed, over another file
        too, unlinked, linked elsewhere and unlinked, another file renamed over it), write
        more, fstat, read it back, close. The bytes land in the file wherever it went, or go
        with it (``trees_match``)."""
        path = self.pick(data, "file")
        if self.leave_be(path):
            return
        # Not another name of the same file: libfuse hides the open file before a rename
        # over one (``test_renaming_a_name_over_another_of_an_open_file``).
        itself = _lstat_or_none(self.theirs / path)
        others = sorted(
            p
            for p, v in kinds(self.theirs).items()
            if v != "dir" and (itself is None or os.lstat(self.theirs / p).st_ino != itself.st_ino)
        )
        free = [p for p in self.free() if p != path]
        moves: dict[str, list[tuple[str, str]]] = {
            "rename to a free name": [(path, p) for p in free],
            "rename over another": [(path, p) for p in others],
            "another renamed over it": [(p, path) for p in others],
            "unlink": [(path, "")],
            "link elsewhere, unlink": [(path, p) for p in free],
        }
        shapes = sorted(m for m in moves if moves[m])
        if not shapes:
            return
        shape = data.draw(st.sampled_from(shapes), label="move")
        src, dst = data.draw(st.sampled_from(moves[shape]), label="names")
        a, b = first.make(), then.make()

        def move(root: Path) -> None:
            if shape == "link elsewhere, unlink":
                os.link(root / src, root / dst)
            if shape in ("unlink", "link elsewhere, unlink"):
                os.unlink(root / src)
            else:
                os.rename(root / src, root / dst)

        def go(root: Path) -> Any:
            fd = os.open(root / path, OPEN_FLAGS[how], 0o644)
            try:
                _write_all(fd, a)
                move(root)
                _write_all(fd, b)
                st_ = os.fstat(fd)
                got = os.pread(fd, st_.st_size, 0) if how in ("r+", "w+") else None
                return attrs(st_), got
            finally:
                os.close(fd)

        op = f"write_while_moved {how} ({shape})"
        self.pair(op, go)

    # -- failures ------------------------------------------------------------------------------
    @rule(data=st.data())
    def must_fail(self, data: st.DataObject) -> None:
        """A call that fails locally, picked from the tree as it is (so each kind of failure
        comes up in every run, not only when the random names line up)."""
        k = kinds(self.theirs)
        names = sorted(k)
        files = sorted(p for p, v in k.items() if v == "file")
        dirs = sorted(p for p, v in k.items() if v == "dir")
        links = sorted(p for p, v in k.items() if v == "symlink")
        fifos = sorted(p for p, v in k.items() if v == "fifo")
        full = [d for d in dirs if any(below(p, d) for p in k)]
        missing = [p for p in PATHS if not os.path.lexists(self.theirs / p)]
        unresolved = [s for s in links if not os.path.exists(self.theirs / s)]
        cases: list[tuple[str, list[Any], Callable[[Path, Any], Any]]] = [
            ("mkdir existing", names, lambda r, p: os.mkdir(r / p)),
            ("rmdir non-empty", full, lambda r, p: os.rmdir(r / p)),
            ("rmdir a file", files + fifos, lambda r, p: os.rmdir(r / p)),
            ("rmdir a symlink", links, lambda r, p: os.rmdir(r / p)),
            ("unlink a dir", dirs, lambda r, p: os.unlink(r / p)),
            ("open a missing file", missing, lambda r, p: open(r / p, "rb").close()),
            ("r+b a missing file", missing, lambda r, p: open(r / p, "r+b").close()),
            ("read a dir", dirs, lambda r, p: open(r / p, "rb").close()),
            ("write a dir", dirs, lambda r, p: os.close(os.open(r / p, os.O_WRONLY))),
            ("create under a file", files + fifos, lambda r, p: open(r / p / "z", "wb").close()),
            ("mkdir under a file", files, lambda r, p: os.mkdir(r / p / "z")),
            ("stat under a file", files + fifos, lambda r, p: os.stat(r / p / "z")),
            ("rename into itself", dirs, lambda r, p: os.rename(r / p, r / p / "z")),
            ("rename a missing file", missing, lambda r, p: os.rename(r / p, r / "c")),
            (
                "rename a file over a dir",
                [(f, d) for f in files + links + fifos for d in dirs],
                lambda r, fd: os.rename(r / fd[0], r / fd[1]),
            ),
            (
                "rename a dir over a file",
                [(d, f) for f in files + links + fifos for d in dirs if not below(f, d)],
                lambda r, df: os.rename(r / df[0], r / df[1]),
            ),
            (
                "rename a dir over a full one",
                [(d, e) for d in dirs for e in full if d != e and not below(e, d)],
                lambda r, de: os.rename(r / de[0], r / de[1]),
            ),
            ("link a dir", dirs, lambda r, p: os.link(r / p, r / "z")),
            ("link a missing file", missing, lambda r, p: os.link(r / p, r / "z")),
            (
                "link over a name",
                [(s, d) for s in files + links + fifos for d in names],
                lambda r, sd: os.link(r / sd[0], r / sd[1], follow_symlinks=False),
            ),
            ("symlink over a name", names, lambda r, p: os.symlink("a", r / p)),
            ("symlink to ''", missing, lambda r, p: os.symlink("", r / p)),
            ("mkfifo over a name", names, lambda r, p: os.mkfifo(r / p)),
            ("readlink a non-symlink", files + dirs + fifos, lambda r, p: os.readlink(r / p)),
            ("readlink a missing name", missing, lambda r, p: os.readlink(r / p)),
            ("stat a dangling or looping symlink", unresolved, lambda r, p: os.stat(r / p)),
            (
                "open a fifo to write, with no reader",
                fifos,
                lambda r, p: os.close(os.open(r / p, os.O_WRONLY | os.O_NONBLOCK)),
            ),
            ("chmod a missing name", missing, lambda r, p: os.chmod(r / p, 0o600)),
            ("chown a missing name", missing, lambda r, p: os.chown(r / p, 0, 0)),
            ("utime a missing name", missing, lambda r, p: os.utime(r / p, ns=(1, 1))),
        ]
        op, args, call = data.draw(st.sampled_from([c for c in cases if c[1]]), label="case")
        arg = data.draw(st.sampled_from(args), label="on")
        outcome = self.both(f"must_fail {op}", lambda root: call(root, arg))
        assert outcome[0] == "err", f"{op} {arg} succeeded locally: the case is wrong"

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def trees_match(self) -> None:
        """Every name the same on both sides (``Entry``), and explicit mtimes kept."""
        with self.sides.watched():
            mine = snapshot(self.mine)
        theirs = snapshot(self.theirs)
        if mine != theirs:
            a, b = summary(mine), summary(theirs)
            diff = {
                k: (a.get(k), b.get(k))
                for k in sorted(a.keys() | b.keys())
                if mine.get(k) != theirs.get(k)
            }
            raise AssertionError(f"trees differ (mount, local): {diff}")
        # An mtime utime set stays until the local one moves (a write, a name added or
        # removed in a directory...); then the mount's must have moved too.
        moved = set()
        for name, e in theirs.items():
            pinned = self.pinned.get(e.ino)
            if pinned is None:
                continue
            off = abs(mine[name].mtime_ns - pinned)
            if e.mtime_ns == pinned:
                assert off <= TIME_SLOP_NS, (
                    f"{name}: the mtime set explicitly, {pinned}, is {mine[name].mtime_ns}"
                    " on the mount"
                )
            else:
                assert off > TIME_SLOP_NS, (
                    f"{name}: the local mtime moved from the one set explicitly, {pinned},"
                    " and the mount's did not"
                )
                moved.add(e.ino)
        for ino in moved:
            del self.pinned[ino]

    @invariant()
    def open_files_match(self) -> None:
        """fstat of each file kept open agrees (``attrs``): an unlinked one has no link."""
        for o in self.open:
            op = f"fstat ({o.how})"
            self.pair(op, lambda fd: attrs(os.fstat(fd)), (o.mine, o.theirs))


def _read_back(f: Any) -> bytes:
    """What a handle open for writing reads of its own file (and its size as fstat sees it)."""
    f.flush()
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    data: bytes = f.read()
    assert len(data) == size, (len(data), size)
    return data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int) -> bytes:
    parts = []
    while part := os.read(fd, 1 << 20):
        parts.append(part)
    return b"".join(parts)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _close_quietly(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _assert_now(what: str, ns: int, before: int, after: int) -> None:
    """``ns`` is a time a call set to now, between the clock read ``before`` and ``after``."""
    assert before - CLOCK_SLOP_NS <= ns <= after + CLOCK_SLOP_NS, (
        f"{what} {ns} is not within the call, {before}..{after}"
    )


def _fd_call(call: str, data: bytes, at: int, n: int) -> Callable[[int], Any]:
    """One of ``FD_CALLS`` on a descriptor: ``data`` to write, ``at`` an offset (or the
    length for ftruncate), ``n`` bytes to read."""
    calls: dict[str, Callable[[int], Any]] = {
        "write": lambda fd: _write_all(fd, data),
        "pwrite": lambda fd: _pwrite_all(fd, data, at),
        "ftruncate": lambda fd: os.ftruncate(fd, at),
        "read": lambda fd: os.read(fd, n),
        "pread": lambda fd: os.pread(fd, n, at),
        "seek": lambda fd: os.lseek(fd, at, os.SEEK_SET),
    }
    return calls[call]


def _lstat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _brief(value: Any) -> Any:
    if isinstance(value, bytes) and len(value) > 32:
        return f"<{len(value)} bytes>"
    if isinstance(value, tuple):
        return tuple(_brief(v) for v in value)
    return value


def _short(outcome: Outcome) -> str:
    kind, value = outcome
    return f"{kind} {_brief(value)!r}"


def make_sides(tmp_path: Path, encoding: str) -> Sides:
    sides = Sides(tmp_path / "cluster", tmp_path / "mnt", tmp_path / "local", tmp_path / "log")
    Cluster.create(sides.cluster, nodes=6, encoding=encoding, block_size=BLOCK)
    sides.mnt.mkdir()
    sides.local.mkdir()
    return sides


@pytest.fixture(params=["r3", "rs-3-3"])
def sides(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sides]:
    sides = make_sides(tmp_path, request.param)
    sides.start()
    try:
        yield sides
    finally:
        sides.stop()


def test_mount_matches_local_directory(sides: Sides) -> None:
    machine = type("Machine", (MountVsLocal,), {"sides": sides})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=40,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Sides]:
    sides = make_sides(tmp_path, "r3")
    sides.start()
    try:
        yield sides
    finally:
        sides.stop()


def test_size_while_a_longer_file_is_open_with_o_trunc(mounted: Sides) -> None:
    f = mounted.mnt / "f"
    f.write_bytes(b"old contents")
    with mounted.watched(), open(f, "wb") as h:  # O_TRUNC: empty from here on
        during = os.fstat(h.fileno()).st_size
        h.write(b"new")
    with mounted.watched():
        after = os.stat(f).st_size  # within attr_timeout of the fstat above
    assert (during, after, f.read_bytes()) == (0, 3, b"new")


# Mount bugs the machine found, fixed; and (strict xfails) three limits of libfuse's
# high-level API, which gives each name a node of its own and passes paths, not nodes: the
# machine steers around those where a docstring names the test.
def test_two_handles_writing_one_file(mounted: Sides) -> None:
    """Each handle wrote a view of its own, and the one closed last replaced the other's
    writes; now the file's writers here share one (``TectonicFS._share``)."""
    f = mounted.mnt / "log"
    f.write_bytes(b"start\n")
    with mounted.watched():
        one = os.open(f, os.O_WRONLY | os.O_APPEND)
        two = os.open(f, os.O_WRONLY | os.O_APPEND)
        os.write(one, b"one\n")
        os.write(two, b"two\n")
        os.close(one)
        os.close(two)
    assert f.read_bytes() == b"start\none\ntwo\n"


def test_utime_of_a_file_open_for_writing(mounted: Sides) -> None:
    """What ``cp -p`` does: write, futimens, close (the close published the bytes, and the
    mtime moved again; now futimens publishes them first)."""
    f = mounted.mnt / "copy"
    with mounted.watched():
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"x")
        os.utime(fd, ns=(0, 10**9))
        during = os.fstat(fd).st_mtime_ns
        os.close(fd)
        after = os.stat(f).st_mtime_ns
    assert (during, after) == (10**9, 10**9)


def test_renaming_a_directory_keeps_its_mtime(mounted: Sides) -> None:
    """docs/fuse.md: "a rename moves the renamed entry's ctime"; ext4 keeps its mtime."""
    d = mounted.mnt / "d"
    with mounted.watched():
        d.mkdir()
        os.utime(d, ns=(0, 10**9))
        os.rename(d, mounted.mnt / "e")
        assert os.stat(mounted.mnt / "e").st_mtime_ns == 10**9


def test_fstat_of_an_open_file_unlinked_under_one_of_its_names(mounted: Sides) -> None:
    """libfuse hides the file under a .fuse_hidden name, and takes one off the count the
    mount gives that name (as if the name were a link still)."""
    a, b = mounted.mnt / "a", mounted.mnt / "b"
    a.write_bytes(b"x")
    with mounted.watched():
        os.link(a, b)
        fd = os.open(a, os.O_RDONLY)
        try:
            os.unlink(a)
            nlink = os.fstat(fd).st_nlink
        finally:
            os.close(fd)
    assert nlink == 1


@pytest.mark.xfail(strict=True, reason="libfuse limit: it hides the name renamed over")
def test_renaming_a_name_over_another_of_an_open_file(mounted: Sides) -> None:
    """rename(2) of a name over another of the same file does nothing; with the file open
    there, libfuse hides that name first, as an unlink would, and the rename that follows
    cannot tell the two apart."""
    a, b = mounted.mnt / "a", mounted.mnt / "b"
    a.write_bytes(b"x")
    with mounted.watched():
        os.link(a, b)
        fd = os.open(a, os.O_RDONLY)
        try:
            os.rename(b, a)
        finally:
            os.close(fd)
        names = sorted(os.listdir(mounted.mnt))
    assert names == ["a", "b"]


def test_unlinking_a_name_of_an_open_file_with_others(mounted: Sides) -> None:
    """libfuse hides a name of an open file instead of unlinking it; the mount tells the
    kernel that the file's other names have one fewer, as for an unlink (they showed the
    old count for attr_timeout, 1 s)."""
    a, c = mounted.mnt / "a", mounted.mnt / "c"
    a.write_bytes(b"x")
    with mounted.watched():
        os.link(a, c)
        assert os.stat(a).st_nlink == 2
        fd = os.open(c, os.O_RDONLY)
        try:
            os.unlink(c)
            nlink = os.stat(a).st_nlink
        finally:
            os.close(fd)
    assert nlink == 1


def test_a_write_seen_through_another_name(mounted: Sides) -> None:
    """A write through a descriptor is seen through the file's other names at once (the
    mount told the kernel at close only, so they showed the old size for attr_timeout)."""
    a, c = mounted.mnt / "a", mounted.mnt / "c"
    a.write_bytes(b"old")
    with mounted.watched():
        os.link(a, c)
        fd = os.open(a, os.O_WRONLY | os.O_APPEND)
        try:
            assert os.stat(c).st_size == 3
            os.write(fd, b"new")
            seen = c.read_bytes()
        finally:
            os.close(fd)
    assert seen == b"oldnew"


def test_a_write_moves_a_future_mtime(mounted: Sides) -> None:
    """A write makes the mtime now, even when it was later (``touch -d 2038-01-19``; the
    mount showed the later of the two while the file was open)."""
    f = mounted.mnt / "f"
    f.write_bytes(b"abc")
    future = 2**31 * 10**9  # 2038
    with mounted.watched():
        os.utime(f, ns=(0, future))
        fd = os.open(f, os.O_RDWR)
        try:
            os.pwrite(fd, b"x", 1)
            during = os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)
        after = os.stat(f).st_mtime_ns
    assert during < future and after < future


def test_a_link_count_seen_in_a_renamed_directory(mounted: Sides) -> None:
    """The mount tracks the names of hard-linked files by path (``LinkNames``), moved with
    a rename of a directory above them: a link made through another name is seen there."""
    d, g = mounted.mnt / "d", mounted.mnt / "g"
    with mounted.watched():
        d.mkdir()
        (d / "f").write_bytes(b"x")
        os.link(d / "f", g)
        os.stat(d / "f")
        os.rename(d, mounted.mnt / "e")
        os.stat(mounted.mnt / "e" / "f")
        os.link(g, mounted.mnt / "h")
        nlink = os.stat(mounted.mnt / "e" / "f").st_nlink
    assert nlink == 3


@pytest.mark.xfail(strict=True, reason="libfuse limit: a removed directory has no path")
def test_fstat_of_an_open_directory_removed(mounted: Sides) -> None:
    d = mounted.mnt / "d"
    with mounted.watched():
        d.mkdir()
        fd = os.open(d, os.O_RDONLY)
        try:
            os.rmdir(d)
            nlink = os.fstat(fd).st_nlink
        finally:
            os.close(fd)
    assert nlink == 0


def test_an_unlinked_open_file_in_a_renamed_directory(mounted: Sides) -> None:
    """The mount keeps libfuse's hidden name of an unlinked open file by its path, moved
    with a rename of its directory (it was lost: ENOENT)."""
    d = mounted.mnt / "d"
    with mounted.watched():
        d.mkdir()
        (d / "f").write_bytes(b"0123456789")
        fd = os.open(d / "f", os.O_RDWR)
        try:
            os.unlink(d / "f")
            os.rename(d, mounted.mnt / "e")
            os.ftruncate(fd, 4)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
    assert size == 4


def test_open_with_o_trunc_moves_the_mtime(mounted: Sides) -> None:
    """open(2): O_TRUNC on an existing file marks its mtime and ctime for update (the mount
    kept the old mtime while the file was open)."""
    f = mounted.mnt / "f"
    f.write_bytes(b"abc")
    with mounted.watched():
        os.utime(f, ns=(0, 10**9))
        fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
        try:
            during = os.stat(f).st_mtime_ns
        finally:
            os.close(fd)
        after = os.stat(f).st_mtime_ns
    assert during != 10**9 and after != 10**9


def test_o_trunc_seen_through_an_open_name_unlinked(mounted: Sides) -> None:
    """A file open under a name since unlinked (hidden by libfuse), truncated by an open
    with O_TRUNC through its other name: fstat of the first sees it (its cached size
    stayed for attr_timeout)."""
    a, b = mounted.mnt / "a", mounted.mnt / "b"
    a.write_bytes(b"0123456789")
    with mounted.watched():
        first = os.open(a, os.O_RDWR | os.O_APPEND)
        try:
            os.link(a, b)
            os.unlink(a)
            assert os.fstat(first).st_size == 10
            os.close(os.open(b, os.O_WRONLY | os.O_TRUNC))
            size, nlink = os.fstat(first).st_size, os.fstat(first).st_nlink
        finally:
            os.close(first)
    assert (size, nlink) == (0, 1)


def test_ftruncate_of_an_open_name_unlinked(mounted: Sides) -> None:
    """libfuse answers setattr (ftruncate, fchmod) with the mount's count for the hidden
    name as it is, not one fewer as for getattr: the file's one other name, not two."""
    a, b = mounted.mnt / "a", mounted.mnt / "b"
    a.write_bytes(b"0123456789")
    with mounted.watched():
        os.link(a, b)
        fd = os.open(a, os.O_RDWR)
        try:
            os.unlink(a)
            os.ftruncate(fd, 4)
            os.fchmod(fd, 0o600)
            nlink = os.fstat(fd).st_nlink
        finally:
            os.close(fd)
        st_ = os.stat(b)
    assert (nlink, st_.st_size, stat.S_IMODE(st_.st_mode)) == (1, 4, 0o600)


def test_truncate_of_a_file_open_for_writing_seen_through_another_name(mounted: Sides) -> None:
    """truncate(2) by path of a file a handle here writes: its other names see the size."""
    a, c = mounted.mnt / "a", mounted.mnt / "c"
    a.write_bytes(b"0123456789")
    with mounted.watched():
        os.link(a, c)
        fd = os.open(a, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"x")
            assert os.stat(c).st_size == 11
            os.truncate(a, 3)
            size = os.stat(c).st_size
        finally:
            os.close(fd)
    assert (size, c.read_bytes()) == (3, b"012")


def test_an_unlinked_open_file_in_a_removed_directory(mounted: Sides) -> None:
    """Its descriptor reads, writes and truncates by handle (libfuse has no path for it)."""
    d = mounted.mnt / "d"
    with mounted.watched():
        d.mkdir()
        (d / "f").write_bytes(b"0123456789")
        fd = os.open(d / "f", os.O_RDWR)
        try:
            os.unlink(d / "f")
            os.rmdir(d)
            os.ftruncate(fd, 4)
            os.pwrite(fd, b"ab", 0)
            got = os.pread(fd, 10, 0)
        finally:
            os.close(fd)
    assert got == b"ab23"


@pytest.mark.xfail(strict=True, reason="libfuse limit: its hidden name has no path")
def test_fstat_of_an_unlinked_open_file_in_a_removed_directory(mounted: Sides) -> None:
    """fstat asks by node, which libfuse names by path: once the attributes the kernel
    caches lapse (attr_timeout, 1 s), it fails with ESTALE. (ext4 refuses nothing here; a
    FUSE file system over a real one refuses the rmdir, ENOTEMPTY, as the hidden name is
    there.)"""
    d = mounted.mnt / "d"
    with mounted.watched():
        d.mkdir()
        (d / "f").write_bytes(b"0123456789")
        fd = os.open(d / "f", os.O_RDONLY)
        try:
            os.unlink(d / "f")
            os.rmdir(d)
            time.sleep(1.2)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
    assert size == 10
