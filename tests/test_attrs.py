"""POSIX attributes kept in metadata (tectonic_emu/attrs.py): chmod, chown, utime, stat."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tectonic_emu import Cluster
from tectonic_emu.attrs import MAX_ID, Perms
from tectonic_emu.errors import ArgumentTypeError, InvalidArgumentError, NotFoundError
from tectonic_emu.metadata.records import DIR_MODE, FILE_MODE, DirRecord, Entry, FileRecord

from .conftest import make_cluster, run_with


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_cluster(tmp_path / "cluster", nodes=3, encoding="r1")


def test_mode_owner_and_times_are_kept_and_each_change_moves_the_ctime(root: Path) -> None:
    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.mkdir("/d")
        await cl.write_file("/d/f", b"abc")
        f0, d0, r0 = await cl.stat("/d/f"), await cl.stat("/d"), await cl.stat("/")
        assert (f0.mode, f0.uid, f0.gid, f0.atime) == (FILE_MODE, 0, 0, f0.mtime)
        assert (d0.mode, r0.mode) == (DIR_MODE, DIR_MODE)
        before = time.time()
        await cl.chmod("/d/f", 0o4750)
        f1 = await cl.stat("/d/f")
        assert f1.mode == 0o4750 and f1.ctime >= before and f1.mtime == f0.mtime
        await cl.chown("/d/f", 65534, -1)  # -1: the group stays
        await cl.chown("/d/f", -1, 123)
        f2 = await cl.stat("/d/f")
        assert (f2.uid, f2.gid, f2.mode) == (65534, 123, 0o4750) and f2.ctime >= f1.ctime
        await cl.utime("/d/f", 1_900_000_000.5, "omit")  # the mtime stays
        f3 = await cl.stat("/d/f")
        assert (f3.atime, f3.mtime) == (1_900_000_000.5, f0.mtime) and f3.ctime >= f2.ctime
        await cl.utime("/d/f", "omit", 1_000.0)
        f4 = await cl.stat("/d/f")
        assert (f4.atime, f4.mtime) == (1_900_000_000.5, 1_000.0)
        await cl.utime("/d/f")  # both now
        f5 = await cl.stat("/d/f")
        assert f5.atime == f5.mtime >= before
        # directories and the root alike
        await cl.chmod("/d", 0o1777)
        await cl.chown("/", 7, 8)
        d1, r1 = await cl.stat("/d"), await cl.stat("/")
        assert d1.mode == 0o1777 and (r1.uid, r1.gid, r1.mode) == (7, 8, DIR_MODE)
        assert d1.ctime >= before and r1.ctime >= before

    run_with(root, go)


def test_a_new_version_keeps_the_files_mode_and_owner_and_a_rename_keeps_all(
    root: Path,
) -> None:
    """Overwriting (``write_file``, the mount's O_TRUNC: a new version swapped in) changes
    the bytes of a file, not who owns it or its mode; a rename changes neither."""

    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.write_file("/f", b"one")
        await cl.chmod("/f", 0o600)
        await cl.chown("/f", 1000, 1000)
        await cl.write_file("/f", b"two, longer")
        s = await cl.stat("/f")
        assert (s.mode, s.uid, s.gid, s.size) == (0o600, 1000, 1000, 11)
        await cl.rename("/f", "/g")
        s = await cl.stat("/g")
        assert (s.mode, s.uid, s.gid) == (0o600, 1000, 1000)
        await cl.write_file("/new", b"x")  # a new file: the defaults
        s = await cl.stat("/new")
        assert (s.mode, s.uid, s.gid) == (FILE_MODE, 0, 0)

    run_with(root, go)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda cl: cl.chmod("/f", 0o10000), InvalidArgumentError),
        (lambda cl: cl.chmod("/f", -1), InvalidArgumentError),
        (lambda cl: cl.chmod("/f", True), ArgumentTypeError),
        (lambda cl: cl.chmod("/f", "644"), ArgumentTypeError),
        (lambda cl: cl.chown("/f", -2, 0), InvalidArgumentError),
        (lambda cl: cl.chown("/f", 0, MAX_ID + 1), InvalidArgumentError),
        (lambda cl: cl.utime("/f", math.nan), InvalidArgumentError),
        (lambda cl: cl.utime("/f", "yesterday"), InvalidArgumentError),
        (lambda cl: cl.chmod("/missing", 0o644), NotFoundError),
        (lambda cl: cl.chown("/missing/f", 1, 1), NotFoundError),
        (lambda cl: cl.utime("/missing"), NotFoundError),
    ],
)
def test_bad_attributes_are_refused_and_nothing_changes(root: Path, call, error) -> None:  # type: ignore[no-untyped-def]
    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.write_file("/f", b"x")
        before = await cl.stat("/f")
        with pytest.raises(error):
            await call(cl)
        assert await cl.stat("/f") == before

    run_with(root, go)


modes = st.integers(0, 0o7777)
ids = st.integers(0, MAX_ID)
times = st.none() | st.floats(-1e12, 1e12, allow_nan=False)


@given(mode=modes, uid=ids, gid=ids, atime=times)
def test_records_keep_attributes_and_old_records_read_as_the_defaults(
    mode: int, uid: int, gid: int, atime: float | None
) -> None:
    f = FileRecord(7, "r1", 3, 1, True, None, 1, "f", 1.0, 2.0, 0, mode, uid, gid, atime)
    assert FileRecord.decode(7, f.encode()) == f
    d = DirRecord(8, 1, "d", None, 1.0, 2.0, mode, uid, gid, atime, uid % 5)
    assert DirRecord.decode(8, d.encode()) == d
    # a record written before attributes were kept: no such keys, the defaults
    old = {"e": "r1", "s": 3, "b": 1, "sealed": True, "t": None, "p": 1, "n": "f"}
    got = FileRecord.decode(7, json.dumps(old | {"c": 1.0, "m": 2.0}).encode())
    assert (got.mode, got.uid, got.gid, got.atime) == (FILE_MODE, 0, 0, None)
    got_dir = DirRecord.decode(8, b'{"p":1,"n":"d","e":null,"c":1.0,"m":2.0}')
    assert (got_dir.mode, got_dir.uid, got_dir.gid, got_dir.atime) == (DIR_MODE, 0, 0, None)
    assert got_dir.subdirs is None  # not counted yet
    # and the defaults are not written: such records encode as they did
    assert FileRecord.decode(7, json.dumps(old | {"c": 1.0, "m": 2.0}).encode()).encode() == (
        json.dumps(old | {"c": 1.0, "m": 2.0}, separators=(",", ":")).encode()
    )


def test_new_files_and_directories_take_the_creators_mode_and_owners(root: Path) -> None:
    """``perms`` at creation (the mount passes the caller's uid, gid and umasked mode); in a
    setgid directory the group is the directory's and a new subdirectory keeps setgid."""

    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.mkdir("/d", perms=Perms(0o750, 1000, 100))
        async with cl.open_writer("/d/f", perms=Perms(0o600, 1000, 100)) as w:
            await w.append(b"x")
        v = await cl.new_version("/d/g", perms=Perms(0o640, 1001, 101))
        await v.append(b"y")
        await v.close()
        got = [await cl.stat(p) for p in ("/d", "/d/f", "/d/g")]
        assert [(s.mode, s.uid, s.gid) for s in got] == [
            (0o750, 1000, 100), (0o600, 1000, 100), (0o640, 1001, 101)
        ]  # fmt: skip
        # an existing file's new version keeps its own, whatever perms it was asked with
        v = await cl.new_version("/d/g", perms=Perms(0o777, 5, 5))
        await v.close()
        s = await cl.stat("/d/g")
        assert (s.mode, s.uid, s.gid) == (0o640, 1001, 101)
        # setgid: the directory's group, and setgid kept by subdirectories only
        await cl.chmod("/d", 0o2775)
        await cl.mkdir("/d/sub", perms=Perms(0o755, 7, 7))
        async with cl.open_writer("/d/h", perms=Perms(0o644, 7, 7)) as w:
            pass
        sub, h = await cl.stat("/d/sub"), await cl.stat("/d/h")
        assert (sub.mode, sub.uid, sub.gid) == (0o2755, 7, 100)
        assert (h.mode, h.uid, h.gid) == (0o644, 7, 100)
        # mkdir -p: ancestors 0755 with the creator's owners, the last one as asked
        await cl.mkdir("/p/q/r", parents=True, perms=Perms(0o700, 9, 9))
        p, r = await cl.stat("/p"), await cl.stat("/p/q/r")
        assert (p.mode, p.uid, r.mode, r.uid) == (DIR_MODE, 9, 0o700, 9)
        with pytest.raises(InvalidArgumentError):
            Perms(0o644, -1, 0)

    run_with(root, go)


def test_a_directorys_nlink_counts_its_subdirectories(root: Path) -> None:
    async def go(c: Cluster) -> None:
        cl = c.client()

        async def nlink(p: str) -> int:
            return (await cl.stat(p)).nlink

        await cl.mkdir("/a/b/c", parents=True)
        await cl.mkdir("/a/d")
        await cl.write_file("/a/f", b"")  # files do not count
        assert [await nlink(p) for p in ("/", "/a", "/a/b", "/a/b/c")] == [3, 4, 3, 2]
        assert await nlink("/a/f") == 1
        await cl.rename("/a/b", "/b")  # to another parent
        assert [await nlink(p) for p in ("/", "/a")] == [4, 3]
        await cl.rename("/a/d", "/a/e")  # within one
        assert await nlink("/a") == 3
        await cl.mkdir("/x")
        await cl.rename("/a/e", "/x")  # over an empty directory
        assert [await nlink(p) for p in ("/", "/a")] == [5, 2]
        await cl.delete("/b", recursive=True)
        await cl.delete("/x")
        assert await nlink("/") == 3

    run_with(root, go)


def test_a_directory_record_written_before_nlink_was_kept_is_counted(root: Path) -> None:
    """Records of older clusters have no count: stat counts, the next change keeps it."""

    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.mkdir("/a/b", parents=True)
        await cl.mkdir("/a/c")
        a = (await cl.stat("/a")).id
        async with c.meta.transaction() as m:  # as an older version wrote it
            d = await m.names.get_dir(a)
            assert d is not None and d.subdirs == 2
            await m.names.put_dir(replace(d, subdirs=None))
        assert (await cl.stat("/a")).nlink == 4
        await cl.mkdir("/a/e")
        assert (await cl.stat("/a")).nlink == 5
        async with c.meta.transaction() as m:
            d = await m.names.get_dir(a)
            assert d is not None and d.subdirs == 3

    run_with(root, go)


def test_a_directorys_times_move_when_names_in_it_come_and_go(root: Path) -> None:
    """create, mkdir, unlink, rmdir and rename move their directories' mtime and ctime
    (set back an hour first: changes within ``DIR_TIME_GRAIN`` of the last are not
    rewritten); a rename moves the renamed entry's ctime, never its mtime."""

    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.mkdir("/a")
        await cl.mkdir("/b")
        await cl.write_file("/a/f", b"x")
        old = time.time() - 3600
        ids = [(await cl.stat(p)).id for p in ("/a", "/b")]
        changes = [
            lambda: cl.write_file("/a/new", b""),
            lambda: cl.mkdir("/a/sub"),
            lambda: cl.delete("/a/new"),
            lambda: cl.delete("/a/sub"),
            lambda: cl.rename("/a/f", "/b/f"),
        ]
        for change in changes:
            async with c.meta.transaction() as m:  # both directories an hour old
                for dir_id in ids:
                    d = await m.names.get_dir(dir_id)
                    assert d is not None
                    await m.names.put_dir(replace(d, mtime=old, ctime=old))
            await change()
            a = await cl.stat("/a")
            assert a.mtime > old + 60 and a.ctime > old + 60
        b, f = await cl.stat("/b"), await cl.stat("/b/f")
        assert b.mtime > old + 60 and b.ctime > old + 60
        assert f.ctime > f.mtime  # renamed: its ctime moved, its mtime did not

    run_with(root, go)


def test_only_bytes_move_a_files_mtime(root: Path) -> None:
    """A directory renamed keeps its mtime (ext4 does); sealing a file changes no byte, nor
    does unlinking one kept open (``keep``): their mtimes stay, their ctimes move.
    ``change_id`` sets what chmod, chown and utime set, by file id."""

    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.mkdir("/d")
        await cl.utime("/d", 5.0, 7.0)
        await cl.rename("/d", "/e")
        e = await cl.stat("/e")
        assert e.mtime == 7.0 and e.ctime > 7.0
        async with cl.open_writer("/e/f") as w:
            await w.append(b"abc")
            await w.flush()
            await cl.utime("/e/f", 5.0, 7.0)  # what cp -p sets before its close
        f = await cl.stat("/e/f")
        assert (f.mtime, f.sealed) == (7.0, True)
        await cl.delete("/e/f", keep=True)
        kept = await cl.stat_id(f.id)
        assert (kept.mtime, kept.nlink) == (7.0, 0) and kept.ctime >= f.ctime
        await cl.change_id(f.id, mode=0o600, uid=7, gid=8, atime=1.0, mtime="omit")
        kept = await cl.stat_id(f.id)
        assert (kept.mode, kept.uid, kept.gid, kept.atime, kept.mtime) == (0o600, 7, 8, 1.0, 7.0)
        with pytest.raises(NotFoundError):
            await cl.change_id(12345, mode=0o600)
        with pytest.raises(InvalidArgumentError):
            await cl.change_id(f.id, mode=0o10000)

    run_with(root, go)


@given(
    kind=st.sampled_from(["file", "dir"]),
    ident=st.integers(min_value=0, max_value=(1 << 63) - 1),
    extra=st.dictionaries(st.sampled_from(["x", "mo", "zz"]), st.integers(0, 9), max_size=2),
)
def test_entries_decode_as_json_reads_them(kind: str, ident: int, extra: dict[str, int]) -> None:
    """``Entry.decode`` reads what ``encode`` writes without the JSON decoder, and anything
    else (keys in another order, keys it does not know) as the JSON decoder does."""
    entry = Entry("n", kind, ident)  # type: ignore[arg-type]
    assert Entry.decode("n", entry.encode()) == entry
    other = json.dumps({**extra, "id": ident, "k": kind[0]}, separators=(",", ":")).encode()
    assert Entry.decode("n", other) == entry
    with pytest.raises((ValueError, KeyError)):
        Entry.decode("n", b'{"k":"d","id":12x}')
