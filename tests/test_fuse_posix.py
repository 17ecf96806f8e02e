"""The mount's POSIX attributes and other users (issue 21), mounted for real as root.

Other users are real processes (``subprocess.run(user=...)``): the kernel checks their
calls against the modes, owners and groups the mount reports (``default_permissions``).
The mount point sits in a directory of mode 0755 of its own, as pytest's temporary
directories are root's alone.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fuse_mount.mount import is_mounted, unmount
from tectonic_emu import Cluster

from .test_fuse import mount_for_test, watchdog  # noqa: F401  (watchdog: autouse)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs root (to act as other users), /dev/fuse and fusermount3",
)
NOBODY, OTHER = 65534, 65533


def _mount(**kw: object) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="tectonic-posix-"))
    base.chmod(0o755)  # other users reach the mount point
    cluster, mnt = base / "cluster", base / "mnt"
    Cluster.create(cluster, nodes=3, encoding="r1", block_size=64 << 10)
    mnt.mkdir()
    proc = mount_for_test(cluster, mnt, log=base / "mount.log", **kw)
    try:
        yield mnt
    finally:
        if is_mounted(mnt):
            unmount(mnt)
        proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def mnt() -> Iterator[Path]:
    yield from _mount()


@pytest.fixture
def d(mnt: Path, request: pytest.FixtureRequest) -> Path:
    path = mnt / request.node.name
    path.mkdir()
    path.chmod(0o1777)  # anyone may create here; only owners remove (sticky)
    return path


def as_user(uid: int, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by ``sh`` as ``uid`` (its group the same number), umask 022."""
    return subprocess.run(
        ["sh", "-c", f"umask 022; {script}"],
        user=uid,
        group=uid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_other_users_create_and_the_stored_modes_decide_who_may_do_what(d: Path) -> None:
    made = as_user(NOBODY, f"umask 077; echo secret > {d}/f && mkdir {d}/sub")
    assert made.returncode == 0, made.stderr
    f, sub = (d / "f").stat(), (d / "sub").stat()
    assert (f.st_uid, f.st_gid, stat.S_IMODE(f.st_mode)) == (NOBODY, NOBODY, 0o600)
    assert (sub.st_uid, stat.S_IMODE(sub.st_mode)) == (NOBODY, 0o700)
    assert "Permission denied" in as_user(OTHER, f"cat {d}/f").stderr
    assert as_user(NOBODY, f"cat {d}/f").stdout == "secret\n"
    assert "Permission denied" in as_user(OTHER, f"ls {d}/sub").stderr
    # the owner opens it up for reading, not writing
    assert as_user(NOBODY, f"chmod 644 {d}/f").returncode == 0
    assert as_user(OTHER, f"cat {d}/f").stdout == "secret\n"
    assert "Permission denied" in as_user(OTHER, f"echo x >> {d}/f").stderr
    # only the owner changes the mode; only root gives a file away; sticky: only owners remove
    assert "not permitted" in as_user(OTHER, f"chmod 666 {d}/f").stderr
    assert "not permitted" in as_user(NOBODY, f"chown {OTHER} {d}/f").stderr
    assert "not permitted" in as_user(OTHER, f"rm -f {d}/f").stderr
    assert (d / "f").read_text() == "secret\n"  # nothing of it changed
    os.chown(d / "f", OTHER, OTHER)  # root may
    assert as_user(OTHER, f"echo more >> {d}/f").returncode == 0
    assert (d / "f").read_text() == "secret\nmore\n"


def test_mode_owner_and_times_set_through_the_mount_are_kept(d: Path) -> None:
    (d / "f").write_bytes(b"x")
    os.chmod(d / "f", 0o4750)
    os.chown(d / "f", 1000, 2000)
    assert stat.S_IMODE((d / "f").stat().st_mode) == 0o750  # a chown clears setuid
    os.chown(d / "f", -1, 3000)  # -1: the owner stays
    os.chmod(d / "f", 0o4750)
    os.utime(d / "f", ns=(1_000_000_000_123_456_000, 1_100_000_000_500_000_000))
    got = (d / "f").stat()
    assert (stat.S_IMODE(got.st_mode), got.st_uid, got.st_gid) == (0o4750, 1000, 3000)
    assert abs(got.st_atime_ns - 1_000_000_000_123_456_000) < 1000  # kept to a microsecond
    assert got.st_mtime_ns == 1_100_000_000_500_000_000
    assert got.st_ctime > time.time() - 60
    # UTIME_OMIT leaves a time, UTIME_NOW sets it (touch -a touches only the atime)
    subprocess.run(["touch", "-a", str(d / "f")], check=True)
    again = (d / "f").stat()
    assert again.st_mtime_ns == got.st_mtime_ns and again.st_atime > time.time() - 60
    os.chmod(d, 0o2755)  # setgid: new entries take the directory's group
    os.chown(d, -1, 4000)
    (d / "g").write_bytes(b"")
    (d / "s").mkdir()
    assert (d / "g").stat().st_gid == 4000
    assert (d / "s").stat().st_gid == 4000 and (d / "s").stat().st_mode & stat.S_ISGID


def test_a_directorys_nlink_and_times_follow_its_entries(d: Path) -> None:
    for name in ("a", "b", "c"):
        (d / name).mkdir()
    (d / "f").write_bytes(b"")
    assert os.stat(d).st_nlink == 5  # ".", its entry and three subdirectories' ".."
    os.rename(d / "c", d / "a" / "c")
    os.rmdir(d / "b")
    assert (os.stat(d).st_nlink, os.stat(d / "a").st_nlink) == (3, 3)
    os.utime(d, (1000, 1000))
    (d / "new").write_bytes(b"")
    assert os.stat(d).st_mtime > time.time() - 60


def test_writes_and_ftruncate_move_the_mtime_at_once(d: Path) -> None:
    (d / "f").write_bytes(b"0123456789")
    os.utime(d / "f", (1000, 1000))
    fd = os.open(d / "f", os.O_RDWR)
    try:
        os.ftruncate(fd, 4)
        st = os.fstat(fd)
        assert st.st_size == 4 and st.st_mtime > 1000 and st.st_ctime > 1000
    finally:
        os.close(fd)
    assert (d / "f").read_bytes() == b"0123"
    os.utime(d / "f", (1000, 1000))  # after the close: kept, not overwritten by the handle
    assert (d / "f").stat().st_mtime == 1000


def test_a_mount_without_allow_other_is_roots_alone() -> None:
    gen = _mount(allow_other=False)
    mnt = next(gen)
    try:
        (mnt / "f").write_bytes(b"x")
        (mnt / "f").chmod(0o644)
        assert "Permission denied" in as_user(NOBODY, f"cat {mnt}/f").stderr
        assert (mnt / "f").read_bytes() == b"x"
    finally:
        gen.close()


def test_writes_through_a_descriptor_land_in_the_file_wherever_it_was_renamed(d: Path) -> None:
    """The data-loss bug of issue 21: writes of a descriptor renamed away (a rewrite, and
    a new file streaming) were published at the old name on close."""
    (d / "old").write_bytes(b"old bytes")
    ino = (d / "old").stat().st_ino
    fd = os.open(d / "old", os.O_RDWR)
    new = os.open(d / "stream", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"NEW", 0)  # a rewrite: staged
        os.write(new, b"streamed")
        os.rename(d / "old", d / "renamed")
        os.rename(d / "stream", d / "streamed")
        os.pwrite(fd, b"!", 9)
        os.write(new, b" on")
    finally:
        os.close(fd)
        os.close(new)
    assert sorted(os.listdir(d)) == ["renamed", "streamed"]
    assert (d / "renamed").read_bytes() == b"NEW bytes!"
    assert (d / "renamed").stat().st_ino == ino  # the same file, rewritten
    assert (d / "streamed").read_bytes() == b"streamed on"
    with open(d / "renamed", "wb") as f:  # O_TRUNC keeps the file too
        f.write(b"truncated")
    assert (d / "renamed").stat().st_ino == ino


def test_an_unlinked_open_file_stays_readable_and_writable_until_its_last_close(
    d: Path, mnt: Path
) -> None:
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    reader = None
    try:
        os.write(fd, b"Hello, World!")
        reader = os.open(d / "f", os.O_RDONLY)
        os.unlink(d / "f")
        assert os.listdir(d) == []
        assert os.pread(fd, 13, 0) == b"Hello, World!"  # pjdfstest unlink/14.t
        os.write(fd, b" More.")
        assert os.fstat(fd).st_size == 19 and os.fstat(fd).st_nlink >= 0
        assert os.pread(reader, 5, 0) == b"Hello"
        os.close(fd)
        fd = -1
        assert os.pread(reader, 100, 0).startswith(b"Hello, World!")
    finally:
        if fd >= 0:
            os.close(fd)
        if reader is not None:
            os.close(reader)
    assert os.listdir(d) == []  # it did not come back at its close
    (d / "f").write_bytes(b"")  # the name is free


def test_a_reader_reads_the_file_as_it_is_now(d: Path) -> None:
    """One file, as POSIX has it: a descriptor open for reading sees the new contents a
    rewrite published, and bytes written through another descriptor, at its next read."""
    (d / "f").write_bytes(b"first contents")
    with open(d / "f", "rb", buffering=0) as r:
        assert r.read(5) == b"first"
        with open(d / "f", "wb") as w:  # O_TRUNC, then new bytes, published at close
            w.write(b"second")
        assert os.pread(r.fileno(), 100, 0) == b"second"
        with open(d / "f", "ab") as w:
            w.write(b" and more")
            w.flush()
            assert os.pread(r.fileno(), 100, 0) == b"second and more"
    assert (d / "f").read_bytes() == b"second and more"
    with open(d / "f", "wb", buffering=0) as w, open(d / "f", "rb", buffering=0) as r:
        w.write(b"streamed")  # a new file's bytes, not yet flushed: seen by a reader
        assert r.read() == b"streamed"


def test_nothing_nameless_is_left_behind_by_open_files(tmp_path: Path) -> None:
    """Every kept file (an orphan, replaced contents) is purged at its last close: the
    metadata has no nameless file once the mount's handles are closed."""
    import asyncio

    gen = _mount()
    mnt = next(gen)
    cluster = mnt.parent / "cluster"
    try:
        (mnt / "f").write_bytes(b"x" * 100_000)
        r = os.open(mnt / "f", os.O_RDONLY)
        kept = os.open(mnt / "f", os.O_RDONLY)
        w = os.open(mnt / "g", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            assert os.pread(r, 3, 0) == os.pread(kept, 3, 0) == b"xxx"
            (mnt / "f").write_bytes(b"y")  # new contents, while both read the old
            os.write(w, b"z")
            os.unlink(mnt / "g")  # unlinked while written
            assert os.pread(r, 3, 0) == b"y"  # r moves on; kept still holds the old
        finally:
            os.close(w)
            os.close(r)
        os.close(kept)
        os.unlink(mnt / "f")
        unmount(mnt)

        async def nameless() -> list[object]:
            async with Cluster.open(cluster) as c:
                return [f async for f in c.meta.iter_files() if f.parent is None]

        assert asyncio.run(nameless()) == []
    finally:
        gen.close()


def test_symlinks_hard_links_and_special_files_through_the_mount(d: Path) -> None:
    (d / "f").write_bytes(b"bytes")
    os.symlink("f", d / "s")
    assert os.readlink(d / "s") == "f" and (d / "s").read_bytes() == b"bytes"
    assert os.lstat(d / "s").st_size == 1 and stat.S_ISLNK(os.lstat(d / "s").st_mode)
    os.link(d / "f", d / "h")
    # one file: one inode number, and every name's link count and mode at once (the
    # kernel caches each name's attributes apart: the mount drops the others' on a change)
    assert os.stat(d / "f").st_ino == os.stat(d / "h").st_ino
    assert os.stat(d / "f").st_nlink == 2
    os.chmod(d / "h", 0o600)
    assert stat.S_IMODE(os.stat(d / "f").st_mode) == 0o600
    os.unlink(d / "h")
    assert os.stat(d / "f").st_nlink == 1
    os.mkfifo(d / "p", 0o640)
    os.mknod(d / "c", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    assert stat.S_ISFIFO(os.stat(d / "p").st_mode)
    assert os.stat(d / "c").st_rdev == os.makedev(1, 3)
    assert sorted(os.listdir(d)) == ["c", "f", "p", "s"]
    tar = subprocess.run(["tar", "-C", str(d), "-cf", "-", "."], capture_output=True, check=True)
    copy = d / "copy"
    copy.mkdir()
    subprocess.run(["tar", "-C", str(copy), "-xf", "-"], input=tar.stdout, check=True)
    assert os.readlink(copy / "s") == "f" and (copy / "s").read_bytes() == b"bytes"


def test_a_users_write_clears_setuid_as_linux_does(d: Path) -> None:
    (d / "f").write_bytes(b"")
    os.chown(d / "f", NOBODY, NOBODY)
    os.chmod(d / "f", 0o6777)
    assert as_user(NOBODY, f"echo x >> {d}/f").returncode == 0
    assert stat.S_IMODE((d / "f").stat().st_mode) == 0o777
    os.chmod(d / "f", 0o4755)
    with open(d / "f", "ab") as f:  # root keeps them
        f.write(b"y")
    assert stat.S_IMODE((d / "f").stat().st_mode) == 0o4755


def test_user_xattrs_are_kept_and_other_namespaces_refused(d: Path) -> None:
    import errno

    (d / "f").write_bytes(b"x")
    os.setxattr(d / "f", "user.checksum", b"\x00\xffsha")
    os.setxattr(d, "user.owner", b"team")
    assert os.getxattr(d / "f", "user.checksum") == b"\x00\xffsha"
    assert "user.checksum" in os.listxattr(d / "f")
    assert "user.owner" in os.listxattr(d)
    with pytest.raises(OSError) as e:
        os.setxattr(d / "f", "user.checksum", b"", os.XATTR_CREATE)
    assert e.value.errno == errno.EEXIST
    os.removexattr(d / "f", "user.checksum")
    with pytest.raises(OSError) as e:
        os.getxattr(d / "f", "user.checksum")
    assert e.value.errno == errno.ENODATA
    with pytest.raises(OSError) as e:
        os.setxattr(d / "f", "trusted.x", b"1")
    assert e.value.errno == errno.EOPNOTSUPP
    # another user writes attributes only where the mode lets it write
    os.chmod(d / "f", 0o644)
    script = "import os, sys; os.setxattr(sys.argv[1], 'user.x', b'1')"
    got = subprocess.run(
        ["/usr/bin/python3", "-c", script, str(d / "f")], user=NOBODY, capture_output=True
    )
    assert b"Permission denied" in got.stderr


def test_paths_deeper_than_4096_bytes_work_relative_to_a_directory(d: Path) -> None:
    """Each name up to 255 bytes, and no cap on the whole path from the mount's root: a
    program reaches any depth through a working directory (issue 21; it was 4,096)."""
    name = "n" * 255
    fd = os.open(d, os.O_RDONLY)
    try:
        for _ in range(20):  # 20 levels of 256 bytes: over 5,000 bytes from the root
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        f = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(f, b"deep")
        os.close(f)
        f = os.open("f", os.O_RDONLY, dir_fd=fd)
        assert os.read(f, 10) == b"deep"
        os.close(f)
        with pytest.raises(OSError) as e:
            os.mkdir("m" * 256, dir_fd=fd)
        assert e.value.errno == 36  # ENAMETOOLONG
    finally:
        os.close(fd)
    shutil.rmtree(d / name)


def test_fallocate_grows_a_file_and_copy_file_range_copies(d: Path) -> None:
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"head")
        assert libc.fallocate(fd, 0, 0, 1 << 20) == 0  # mode 0: grown, zeros
        assert os.fstat(fd).st_size == 1 << 20
        assert libc.fallocate(fd, 1, 0, 4 << 20) == 0  # KEEP_SIZE: a hint
        assert os.fstat(fd).st_size == 1 << 20
        assert libc.fallocate(fd, 3, 0, 4096) == -1  # punching a hole: not supported
        assert ctypes.get_errno() == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    assert (d / "f").read_bytes() == b"head" + bytes((1 << 20) - 4)
    data = os.urandom(3 << 20)
    (d / "src").write_bytes(data)
    src, dst = os.open(d / "src", os.O_RDONLY), os.open(d / "dst", os.O_WRONLY | os.O_CREAT)
    try:
        copied = 0
        while copied < len(data):  # the kernel splices it through the mount
            copied += os.copy_file_range(src, dst, len(data) - copied)
    finally:
        os.close(src)
        os.close(dst)
    assert (d / "dst").read_bytes() == data
