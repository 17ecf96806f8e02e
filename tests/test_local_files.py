"""Safe local files (issue 19): ``get`` and ``atomic_output`` never write through a symlink
or replace a device, FIFO or socket unless forced, even as root with links planted by
another user; nodes refuse chunk files that are not regular files, as corruption, and never
hang on a FIFO; chunk and metadata files are private."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from clients.fsspec import TectonicFileSystem
from tectonic_emu import Cluster
from tectonic_emu.errors import (
    ChunkCorruptError,
    DataUnavailableError,
    IsADirectoryError_,
    NotFoundError,
    UnsafeTargetError,
)
from tectonic_emu.localfile import atomic_output, open_temp
from tectonic_emu.served import Serving
from tectonic_emu.services import repair, scrub

from .conftest import make_cluster, run_with

AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="plants files as another user")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory anyone may write to (0777, no sticky bit, so the kernel's
    protected_symlinks does not step in): where a planted link does the most harm."""
    d = Path(tempfile.mkdtemp(prefix="h4-shared-"))
    d.chmod(0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def as_nobody(*argv: str) -> None:
    subprocess.run(argv, check=True, user="nobody", timeout=30)


def victim(d: Path) -> Path:
    """A root-owned file that a planted link points at; it must never change."""
    v = d / "victim"
    v.write_bytes(b"precious")
    v.chmod(0o600)
    return v


# -- atomic_output -------------------------------------------------------------------------------
def test_writes_replace_a_regular_file_keeping_its_mode(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    with atomic_output(out) as f:
        f.write(b"one")
    assert out.read_bytes() == b"one"
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    out.chmod(0o640)
    with atomic_output(out) as f:
        f.write(b"two")
    assert out.read_bytes() == b"two" and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_an_error_leaves_the_target_and_no_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    out.write_bytes(b"before")
    with pytest.raises(RuntimeError), atomic_output(out) as f:
        f.write(b"half")
        raise RuntimeError("the copy failed")
    assert out.read_bytes() == b"before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_the_temporary_file_is_private_while_written(tmp_path: Path) -> None:
    with atomic_output(tmp_path / "out.bin") as f:
        assert stat.S_IMODE(os.fstat(f.fileno()).st_mode) == 0o600


def test_symlink_target_is_refused_and_force_replaces_the_link_itself(tmp_path: Path) -> None:
    v = victim(tmp_path)
    link = tmp_path / "out.bin"
    link.symlink_to(v)
    with pytest.raises(UnsafeTargetError, match="symlink"), atomic_output(link) as f:
        f.write(b"PWNED")
    assert v.read_bytes() == b"precious" and link.is_symlink()
    with atomic_output(link, force=True) as f:
        f.write(b"mine")
    assert not link.is_symlink() and link.read_bytes() == b"mine"
    assert v.read_bytes() == b"precious"


@needs_root
def test_a_device_is_refused_and_force_replaces_the_node_only(tmp_path: Path) -> None:
    dev = tmp_path / "full"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # what /dev/full is
    with pytest.raises(UnsafeTargetError, match="device"), atomic_output(dev) as f:
        f.write(b"x")
    assert stat.S_ISCHR(dev.lstat().st_mode)
    with atomic_output(dev, force=True) as f:
        f.write(b"x")
    assert stat.S_ISREG(dev.lstat().st_mode) and dev.read_bytes() == b"x"


def test_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # Opening a FIFO with no reader would block forever; refusing must not open it.
    with pytest.raises(UnsafeTargetError, match="FIFO"), atomic_output(fifo) as f:
        f.write(b"x")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_directory_and_a_missing_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError_), atomic_output(tmp_path, force=True) as f:
        f.write(b"x")
    missing = tmp_path / "nowhere" / "out.bin"
    with pytest.raises(NotFoundError, match="no such local directory"), atomic_output(missing) as f:
        f.write(b"x")


@needs_root
def test_a_link_planted_at_the_temporary_name_is_skipped(shared_dir: Path) -> None:
    v = victim(shared_dir)
    as_nobody("ln", "-s", str(v), str(shared_dir / ".out.bin.planted.part"))
    dfd = os.open(shared_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd, name = open_temp(dfd, [".out.bin.planted.part", ".out.bin.next.part"])
        os.write(fd, b"PWNED")
        os.close(fd)
    finally:
        os.close(dfd)
    assert name == ".out.bin.next.part"
    assert v.read_bytes() == b"precious"
    with pytest.raises(FileExistsError):
        dfd = os.open(shared_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            open_temp(dfd, [".out.bin.planted.part"])
        finally:
            os.close(dfd)


# -- get ----------------------------------------------------------------------------------------
def tecto(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "tectonic_emu", *args], capture_output=True, cwd=cwd, timeout=120
    )


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, bytes]:
    """A small embedded cluster holding /f."""
    root = make_cluster(tmp_path / "c", nodes=3, encoding="r3")
    data = os.urandom(200_000)

    async def fill(c: Cluster) -> None:
        await c.client().write_file("/f", data)

    run_with(root, fill)
    return root, data


def one_error_line(r: subprocess.CompletedProcess[bytes], mentions: str) -> None:
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and mentions in lines[0], r.stderr.decode()


@needs_root
def test_get_as_root_never_follows_links_planted_by_nobody(
    stored: tuple[Path, bytes], shared_dir: Path
) -> None:
    root, data = stored
    v = victim(shared_dir)
    out = shared_dir / "out.bin"
    as_nobody("ln", "-s", str(v), str(out))
    # the name the old get wrote through
    as_nobody("ln", "-s", str(v), str(shared_dir / "out.bin.part"))
    r = tecto("get", "--cluster", str(root), "/f", str(out), cwd=shared_dir)
    one_error_line(r, "symlink")
    assert v.read_bytes() == b"precious" and out.is_symlink()

    r = tecto("get", "--cluster", str(root), "/f", str(out), "--force", cwd=shared_dir)
    assert r.returncode == 0, r.stderr.decode()
    assert out.read_bytes() == data and not out.is_symlink()
    assert v.read_bytes() == b"precious"
    assert (shared_dir / "out.bin.part").is_symlink()  # untouched, never used
    assert sorted(p.name for p in shared_dir.iterdir()) == ["out.bin", "out.bin.part", "victim"]


@needs_root
def test_get_as_root_does_not_replace_a_device(stored: tuple[Path, bytes], tmp_path: Path) -> None:
    root, _ = stored
    dev = tmp_path / "full"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    r = tecto("get", "--cluster", str(root), "/f", str(dev), cwd=tmp_path)
    one_error_line(r, "device")
    assert stat.S_ISCHR(dev.lstat().st_mode)
    # /dev/full itself is refused the same way
    r = tecto("get", "--cluster", str(root), "/f", "/dev/full", cwd=tmp_path)
    one_error_line(r, "device")
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


def test_get_writes_a_regular_file(stored: tuple[Path, bytes], tmp_path: Path) -> None:
    root, data = stored
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    r = tecto("get", "--cluster", str(root), "/f", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    assert out.read_bytes() == data
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


# -- chunk files -------------------------------------------------------------------------------
def chunk_paths(root: Path, path: str) -> list[str]:
    async def go(c: Cluster) -> list[str]:
        return [p for b in await c.client().layout(path) for p in b.chunk_paths]

    return run_with(root, go)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dir"])
def test_a_chunk_that_is_not_a_regular_file_is_corrupt_and_never_hangs(
    tmp_path: Path, kind: str
) -> None:
    root = make_cluster(tmp_path / "c", nodes=3, encoding="r1")
    data = os.urandom(1000)

    async def fill(c: Cluster) -> None:
        await c.client().write_file("/f", data)

    run_with(root, fill)
    [path] = chunk_paths(root, "/f")
    saved = tmp_path / "saved"
    os.rename(path, saved)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        os.symlink(saved, path)  # even a link to the right bytes is refused
    else:
        os.mkdir(path)

    async def read(c: Cluster) -> BaseException | None:
        [b] = await c.client().layout("/f")
        ch = b.chunks[0]
        node = c.nodes[ch.node]
        with pytest.raises(ChunkCorruptError, match="not a regular file"):
            await asyncio.wait_for(node.read_chunk(ch.disk, ch.chunk_id), 30)
        with pytest.raises(ChunkCorruptError):
            await asyncio.wait_for(node.stat_chunk(ch.disk, ch.chunk_id), 30)
        try:
            await asyncio.wait_for(c.client().read_file("/f"), 30)
        except DataUnavailableError as e:
            return e
        return None

    err = run_with(root, read)
    assert isinstance(err, DataUnavailableError) and "not a regular file" in str(err)


def test_chunk_and_metadata_files_are_private(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=3, encoding="r3")

    async def fill(c: Cluster) -> None:
        await c.client().write_file("/f", os.urandom(1000))

    run_with(root, fill)
    for p in chunk_paths(root, "/f"):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
        d = Path(p).parent
        while d != root / "nodes":
            assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
            d = d.parent
    meta = [p for p in root.iterdir() if p.name.startswith("metadata.db")]
    assert meta
    for p in meta:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_fsspec_get_file_never_writes_through_a_symlink(
    stored: tuple[Path, bytes], tmp_path: Path
) -> None:
    root, data = stored
    v = victim(tmp_path)
    link = tmp_path / "out.bin"
    link.symlink_to(v)
    fs = fsspec.filesystem("tectonic", cluster=str(root), skip_instance_cache=True)
    try:
        with pytest.raises(UnsafeTargetError, match="symlink"):
            fs.get_file("/f", str(link))
        assert v.read_bytes() == b"precious" and link.is_symlink()
        fs.get_file("/f", str(tmp_path / "plain.bin"))
        assert (tmp_path / "plain.bin").read_bytes() == data
    finally:
        fs.close()
        TectonicFileSystem.clear_instance_cache()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == []


# -- a FIFO chunk on a served node --------------------------------------------------------------
def test_a_fifo_chunk_leaves_a_served_node_serving(tmp_path: Path) -> None:
    """A chunk file replaced by a FIFO hung ``get`` forever and stalled scrub and repair for
    120 s per chunk. Now the node answers at once that the chunk is corrupt: the r3 read comes
    from another replica, the r1 read fails naming the FIFO, the node serves other reads
    meanwhile, and scrub and repair see and replace it."""
    root = make_cluster(tmp_path / "c", nodes=3, encoding="r3")
    r3, r1, other = os.urandom(100_000), os.urandom(5000), os.urandom(7000)

    async def fill(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/r3", r3)
        await client.write_file("/r1", r1, encoding="r1")
        await client.write_file("/other", other, encoding="r1")

    run_with(root, fill)
    fifo_paths = [chunk_paths(root, "/r3")[0], chunk_paths(root, "/r1")[0]]
    for p in fifo_paths:
        os.unlink(p)
        os.mkfifo(p)
    with Serving(root, repair_interval=0):

        async def go(c: Cluster) -> None:
            client = c.client()
            assert await asyncio.wait_for(client.read_file("/r3"), 30) == r3
            with pytest.raises(DataUnavailableError, match="FIFO"):
                await asyncio.wait_for(client.read_file("/r1"), 30)
            # the node of the FIFO chunks serves the rest, and is not marked down
            assert await asyncio.wait_for(client.read_file("/other"), 30) == other
            assert all(n.available for n in c.nodes)
            found = await asyncio.wait_for(scrub(c), 60)
            assert len(found.corrupt) == 2, found
            await asyncio.wait_for(repair(c), 60)
            assert await asyncio.wait_for(client.read_file("/r3"), 30) == r3

        run_with(root, go)
