"""POSIX attributes kept in metadata (tectonic_emu/attrs.py): chmod, chown, utime, stat."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tectonic_emu import Cluster
from tectonic_emu.attrs import MAX_ID
from tectonic_emu.errors import ArgumentTypeError, InvalidArgumentError, NotFoundError
from tectonic_emu.metadata.records import DIR_MODE, FILE_MODE, DirRecord, FileRecord

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
    d = DirRecord(8, 1, "d", None, 1.0, 2.0, mode, uid, gid, atime)
    assert DirRecord.decode(8, d.encode()) == d
    # a record written before attributes were kept: no such keys, the defaults
    old = {"e": "r1", "s": 3, "b": 1, "sealed": True, "t": None, "p": 1, "n": "f"}
    got = FileRecord.decode(7, json.dumps(old | {"c": 1.0, "m": 2.0}).encode())
    assert (got.mode, got.uid, got.gid, got.atime) == (FILE_MODE, 0, 0, None)
    got_dir = DirRecord.decode(8, b'{"p":1,"n":"d","e":null,"c":1.0,"m":2.0}')
    assert (got_dir.mode, got_dir.uid, got_dir.gid, got_dir.atime) == (DIR_MODE, 0, 0, None)
    # and the defaults are not written: such records encode as they did
    assert FileRecord.decode(7, json.dumps(old | {"c": 1.0, "m": 2.0}).encode()).encode() == (
        json.dumps(old | {"c": 1.0, "m": 2.0}, separators=(",", ":")).encode()
    )
