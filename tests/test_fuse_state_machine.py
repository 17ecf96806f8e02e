"""Random operations on a real mount and on a local directory, compared after every step.

The JuiceFS pattern: each operation runs on both sides and must give the same result, or fail
with the same errno; after every step both trees must hold the same names, kinds, sizes and
bytes. The local directory is the model, so nothing here predicts POSIX by hand.

One cluster and one mount per test function; each hypothesis example works in a fresh
directory of its own on both sides. Names come from a small universe (three at the top, two
below each), so a name is often a file on one step and a directory the next, and calls that
must fail (mkdir over a name, rmdir of a full directory or of a file, unlink of a directory, a
path under a file, a missing file, a 256-byte name) come up by themselves; ``must_fail`` also
picks them on purpose from the tree as it is, and ``rename`` the moves that succeed.

Modes and times are not compared: the mount keeps neither (``docs/fuse.md``); directory sizes
and link counts are not either (the mount reports 0 and 2, ext4 its block size and
subdirectory count). Errnos are compared exactly: no call here has a reason to fail
differently on the store than on ext4, and none does.

A bug the machine found (the size of a file open with O_TRUNC) has a test of its own at the
end.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
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


def attempt(fn: Callable[[Path], Any], root: Path) -> Outcome:
    try:
        return "ok", fn(root)
    except OSError as e:
        return "err", errno.errorcode.get(e.errno or 0, e.errno)


def snapshot(root: Path, rel: str = "") -> dict[str, Any]:
    """Every name below ``root``: "dir", or a file's (size from stat, bytes)."""
    out: dict[str, Any] = {}
    for entry in sorted(os.scandir(root / rel), key=lambda e: e.name):
        name = f"{rel}/{entry.name}" if rel else entry.name
        st_ = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st_.st_mode):
            out[name] = "dir"
            out.update(snapshot(root, name))
        else:
            out[name] = (st_.st_size, (root / name).read_bytes())
    return out


def kinds(root: Path, rel: str = "") -> dict[str, str]:
    """Every name below ``root`` (a local directory): "dir" or "file"."""
    out: dict[str, str] = {}
    for entry in os.scandir(root / rel):
        name = f"{rel}/{entry.name}" if rel else entry.name
        out[name] = "dir" if entry.is_dir(follow_symlinks=False) else "file"
        if out[name] == "dir":
            out.update(kinds(root, name))
    return out


def parent_of(path: str) -> str:
    return path.rpartition("/")[0]


def below(path: str, top: str) -> bool:
    return path.startswith(top + "/")


def summary(snap: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without the bytes, for assertion messages."""
    return {k: v if v == "dir" else v[0] for k, v in snap.items()}


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

    def both(self, op: str, fn: Callable[[Path], Any]) -> Outcome:
        """Run ``fn`` on each side; they must agree. Returns the outcome."""
        with self.sides.watched():
            mine = attempt(fn, self.mine)
        theirs = attempt(fn, self.theirs)
        event(f"{op}: {theirs[1] if theirs[0] == 'err' else 'ok'}")
        assert mine == theirs, f"{op}: mount {_short(mine)} != local {_short(theirs)}"
        return theirs

    def pick(self, data: st.DataObject, kind: str | None = None) -> str:
        """A name of the universe; mostly one that exists (of ``kind``, if any do)."""
        there = sorted(p for p, k in kinds(self.theirs).items() if kind in (None, k))
        if there and data.draw(st.integers(0, 3), label="existing unless 0") != 0:
            return data.draw(st.sampled_from(there), label="path")
        return data.draw(paths, label="path")

    def size_of(self, path: str) -> int:
        try:
            return (self.theirs / path).stat().st_size
        except OSError:
            return 0

    @initialize(
        dirs=st.sets(st.sampled_from(("a", "b", "a/x", "b/y"))),
        files=st.lists(st.tuples(paths, payloads), max_size=4),
    )
    def populate(self, dirs: set[str], files: list[tuple[str, Payload]]) -> None:
        """Start from a small tree, so the rules meet files and directories early."""
        for path in sorted(dirs):
            self.mkdir_at(path)
        for path, payload in files:
            self.write_whole(path, [payload.make()])

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

    def kind(self, path: str) -> str | None:
        return kinds(self.theirs).get(path)

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
        datas = [c.make() for c in chunks]
        at = None if patch is None else (sum(map(len, datas)) * patch[0] // 1000, patch[1].make())
        self.write_whole(self.pick(data), datas, at, read_back)

    @rule(data=st.data(), payload=payloads)
    def append(self, data: st.DataObject, payload: Payload) -> None:
        path = self.pick(data, "file")
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
        path = self.pick(data, "file")
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
        path = self.pick(data, "file")
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

    @rule(data=st.data())
    def stat_path(self, data: st.DataObject) -> None:
        path = self.pick(data, None)

        def go(root: Path) -> tuple[int, int | None]:
            st_ = os.stat(root / path)
            return stat.S_IFMT(st_.st_mode), None if stat.S_ISDIR(st_.st_mode) else st_.st_size

        self.both("stat", go)

    # -- namespace -----------------------------------------------------------------------------
    @rule(data=st.data())
    def mkdir(self, data: st.DataObject) -> None:
        self.mkdir_at(self.pick(data, "dir"))

    def mkdir_at(self, path: str) -> None:
        self.both("mkdir", lambda root: os.mkdir(root / path))

    @rule(data=st.data())
    def rmdir(self, data: st.DataObject) -> None:
        path = self.pick(data, "dir")
        self.both("rmdir", lambda root: os.rmdir(root / path))

    @rule(data=st.data())
    def unlink(self, data: st.DataObject) -> None:
        path = self.pick(data, "file")
        self.both("unlink", lambda root: os.unlink(root / path))

    @rule(data=st.data())
    def rename(self, data: st.DataObject) -> None:
        """Any two names (missing, into themselves, over full directories...), or a move that
        should succeed: a file or a directory to a free name, a file over a file, a directory
        over an empty one."""
        k = kinds(self.theirs)
        free = [p for p in PATHS if p not in k and {**k, "": "dir"}.get(parent_of(p)) == "dir"]
        empty = [d for d, v in k.items() if v == "dir" and not any(below(p, d) for p in k)]
        files = sorted(p for p, v in k.items() if v == "file")
        moves = {
            "file to a free name": [(f, p) for f in files for p in free],
            "file over a file": [(f, g) for f in files for g in files if f != g],
            "dir to a free name": [
                (d, p) for d, v in k.items() if v == "dir" for p in free if not below(p, d)
            ],
            "dir over an empty dir": [
                (d, e) for d, v in k.items() if v == "dir" for e in empty if not below(e, d)
            ],
        }
        shape = data.draw(st.sampled_from(["any", *sorted(m for m in moves if moves[m])]))
        if shape == "any":
            src, dst = self.pick(data), self.pick(data)
        else:
            src, dst = data.draw(st.sampled_from(sorted(moves[shape])), label="move")
        self.both(f"rename ({shape})", lambda root: os.rename(root / src, root / dst))

    @rule(data=st.data(), length=st.sampled_from((255, 256)), op=st.sampled_from(LONG_OPS))
    def long_name(self, data: st.DataObject, length: int, op: str) -> None:
        """255 bytes is a name; 256 is ENAMETOOLONG, whatever the call."""
        parent = data.draw(st.just("") | st.sampled_from(PATHS[:3]), label="parent")
        name = f"{parent}/{'n' * length}" if parent else "n" * length
        if op == "create":
            self.write_whole(name, [b"long"], op=f"long_name create {length}")
            return
        calls: dict[str, Callable[[Path], Any]] = {
            "mkdir": lambda root: os.mkdir(root / name),
            "stat": lambda root: stat.S_IFMT(os.stat(root / name).st_mode),
            "rename to": lambda root: os.rename(root / "b", root / name),
            "rename from": lambda root: os.rename(root / name, root / "c"),
        }
        self.both(f"long_name {op} {length}", calls[op])

    @rule(data=st.data())
    def must_fail(self, data: st.DataObject) -> None:
        """A call that fails locally, picked from the tree as it is (so each kind of failure
        comes up in every run, not only when the random names line up)."""
        k = kinds(self.theirs)
        files = sorted(p for p, v in k.items() if v == "file")
        dirs = sorted(p for p, v in k.items() if v == "dir")
        full = [d for d in dirs if any(below(p, d) for p in k)]
        missing = [p for p in PATHS if p not in k]
        cases: list[tuple[str, list[Any], Callable[[Path, Any], Any]]] = [
            ("mkdir existing", files + dirs, lambda r, p: os.mkdir(r / p)),
            ("rmdir non-empty", full, lambda r, p: os.rmdir(r / p)),
            ("rmdir a file", files, lambda r, p: os.rmdir(r / p)),
            ("unlink a dir", dirs, lambda r, p: os.unlink(r / p)),
            ("open a missing file", missing, lambda r, p: open(r / p, "rb").close()),
            ("r+b a missing file", missing, lambda r, p: open(r / p, "r+b").close()),
            ("read a dir", dirs, lambda r, p: open(r / p, "rb").close()),
            ("write a dir", dirs, lambda r, p: os.close(os.open(r / p, os.O_WRONLY))),
            ("create under a file", files, lambda r, p: open(r / p / "z", "wb").close()),
            ("mkdir under a file", files, lambda r, p: os.mkdir(r / p / "z")),
            ("stat under a file", files, lambda r, p: os.stat(r / p / "z")),
            ("rename into itself", dirs, lambda r, p: os.rename(r / p, r / p / "z")),
            ("rename a missing file", missing, lambda r, p: os.rename(r / p, r / "c")),
            (
                "rename a file over a dir",
                [(f, d) for f in files for d in dirs],
                lambda r, fd: os.rename(r / fd[0], r / fd[1]),
            ),
            (
                "rename a dir over a file",
                [(d, f) for f in files for d in dirs if not below(f, d)],
                lambda r, df: os.rename(r / df[0], r / df[1]),
            ),
            (
                "rename a dir over a full one",
                [(d, e) for d in dirs for e in full if d != e and not below(e, d)],
                lambda r, de: os.rename(r / de[0], r / de[1]),
            ),
        ]
        op, args, call = data.draw(st.sampled_from([c for c in cases if c[1]]), label="case")
        arg = data.draw(st.sampled_from(args), label="on")
        outcome = self.both(f"must_fail {op}", lambda root: call(root, arg))
        assert outcome[0] == "err", f"{op} {arg} succeeded locally: the case is wrong"

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def trees_match(self) -> None:
        with self.sides.watched():
            mine = snapshot(self.mine)
        theirs = snapshot(self.theirs)
        if mine != theirs:
            diff = {
                k: (summary(mine).get(k), summary(theirs).get(k))
                for k in sorted(mine.keys() | theirs.keys())
                if mine.get(k) != theirs.get(k)
            }
            raise AssertionError(f"trees differ (mount, local): {diff}")


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


def _short(outcome: Outcome) -> str:
    kind, value = outcome
    if isinstance(value, bytes) and len(value) > 32:
        return f"{kind} <{len(value)} bytes>"
    return f"{kind} {value!r}"


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
            stateful_step_count=25,
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
