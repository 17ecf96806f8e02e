"""Links and special files in the Name layer (issue 21): symlinks, hard links, fifos,
device nodes and sockets, through the native client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tectonic_emu import Cluster
from tectonic_emu.attrs import Perms
from tectonic_emu.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NameTooLongError,
    NotFoundError,
    NotPermittedError,
)
from tectonic_emu.metadata.records import FileRecord

from .conftest import make_cluster, run_with


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_cluster(tmp_path / "cluster", nodes=3, encoding="r1")


def test_symlinks_keep_their_target_and_are_never_followed_here(root: Path) -> None:
    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.mkdir("/d")
        await cl.symlink("../elsewhere/ü", "/d/s", perms=Perms(0o600, 7, 8))
        s = await cl.stat("/d/s")
        assert (s.kind, s.target, s.size, s.mode, s.uid, s.gid) == (
            "symlink", "../elsewhere/ü", len("../elsewhere/ü".encode()), 0o777, 7, 8
        )  # fmt: skip
        assert await cl.readlink("/d/s") == "../elsewhere/ü"
        assert await cl.listdir("/d") == ["s"]
        await cl.rename("/d/s", "/t")  # a name like any other
        assert await cl.readlink("/t") == "../elsewhere/ü"
        await cl.write_file("/f", b"x")
        with pytest.raises(InvalidArgumentError):
            await cl.readlink("/f")
        with pytest.raises(AlreadyExistsError):
            await cl.symlink("x", "/f")
        with pytest.raises(NameTooLongError):
            await cl.symlink("x" * 4096, "/long")
        with pytest.raises(InvalidArgumentError):
            await cl.symlink("", "/empty")
        with pytest.raises(NotFoundError):
            await cl.symlink("x", "/missing/s")
        await cl.delete("/t")
        assert sorted(await cl.listdir("/")) == ["d", "f"]

    run_with(root, go)


def test_fifos_device_nodes_and_sockets_are_names_with_attributes(root: Path) -> None:
    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.mknod("/p", "fifo", perms=Perms(0o640, 1, 2))
        await cl.mknod("/c", "chardev", rdev=0x0103)
        await cl.mknod("/b", "blockdev", rdev=0x0801)
        await cl.mknod("/s", "socket")
        got = {p: await cl.stat(p) for p in ("/p", "/c", "/b", "/s")}
        assert [(s.kind, s.rdev, s.size) for s in got.values()] == [
            ("fifo", 0, 0), ("chardev", 0x0103, 0), ("blockdev", 0x0801, 0), ("socket", 0, 0)
        ]  # fmt: skip
        assert (got["/p"].mode, got["/p"].uid, got["/p"].gid) == (0o640, 1, 2)
        with pytest.raises(InvalidArgumentError):
            await cl.mknod("/x", "symlink")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await cl.mknod("/x", "fifo", rdev=-1)
        for p in got:
            await cl.delete(p)
        assert await cl.listdir("/") == []

    run_with(root, go)


def test_hard_links_are_one_file_with_several_names(root: Path) -> None:
    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.mkdir("/a")
        await cl.mkdir("/b")
        await cl.write_file("/a/f", b"shared bytes")
        await cl.link("/a/f", "/b/g")
        await cl.link("/b/g", "/h")
        f, g = await cl.stat("/a/f"), await cl.stat("/b/g")
        assert f.id == g.id and f.nlink == g.nlink == 3
        assert await cl.read_file("/h") == b"shared bytes"
        await cl.chmod("/h", 0o600)  # one file: every name sees it
        assert (await cl.stat("/a/f")).mode == 0o600
        await cl.delete("/a/f")
        assert (await cl.stat("/b/g")).nlink == 2
        await cl.delete("/a", recursive=True)  # nothing of it in there any more
        await cl.mkdir("/t")
        await cl.link("/h", "/t/in-tree")
        await cl.delete("/t", recursive=True)  # a tree's link goes, the file stays
        assert (await cl.stat("/h")).nlink == 2
        await cl.write_file("/x", b"over")
        await cl.rename("/x", "/h")  # a rename over one name leaves the others
        assert await cl.read_file("/b/g") == b"shared bytes"
        assert (await cl.stat("/b/g")).nlink == 1
        with pytest.raises(NotPermittedError):
            await cl.link("/b", "/dirlink")
        with pytest.raises(AlreadyExistsError):
            await cl.link("/b/g", "/h")
        with pytest.raises(NotFoundError):
            await cl.link("/nope", "/n")
        await cl.delete("/b/g")  # its last name: the file goes
        assert [f async for f in c.meta.iter_files() if f.file_id == g.id] == []

    run_with(root, go)


kinds = st.sampled_from(["file", "symlink", "fifo", "chardev", "blockdev", "socket"])


@given(kind=kinds, nlink=st.integers(1, 2**31), rdev=st.integers(0, 2**32))
def test_file_records_keep_kind_links_target_and_rdev(kind: str, nlink: int, rdev: int) -> None:
    target = "t" if kind == "symlink" else None
    f = FileRecord(9, "r1", 0, 0, True, None, 1, "f", 1.0, 1.0, 0, 0o644, 0, 0, None,
                   nlink, kind, target, rdev)  # type: ignore[arg-type]  # fmt: skip
    assert FileRecord.decode(9, f.encode()) == f
    plain = FileRecord(9, "r1", 0, 0, True, None, 1, "f", 1.0, 1.0)
    assert not {"l", "k", "tg", "rd"} & set(json.loads(plain.encode()))  # as before
