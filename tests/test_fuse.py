"""The FUSE mount, mounted for real (CI runs as root; /dev/fuse exists).

One cluster and one mount process per module; each test works in a directory of its own.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import random
import shutil
import signal
import subprocess
import tarfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fuse_mount.mount import FSTYPE, is_mounted, mounts_at, start_mount, unmount
from tectonic_emu import Cluster
from tectonic_emu.chunkstore import PAYLOAD_OFFSET
from tectonic_emu.errors import (
    AlreadyExistsError,
    ClusterNotFoundError,
    InvalidArgumentError,
    NotADirectoryError_,
    NotFoundError,
    TectonicError,
)

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)


# A deadlocked mount leaves its callers in uninterruptible sleep, out of reach of any test
# timeout: a watchdog SIGKILLs the mount processes of a test that runs this long, which fails
# the test (ENOTCONN) instead of hanging CI.
WATCHDOG_SECONDS = 120
_mounts: list[subprocess.Popen[bytes]] = []


def _kill_mounts() -> None:
    for proc in _mounts:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    timer = threading.Timer(WATCHDOG_SECONDS, _kill_mounts)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


def mount_for_test(cluster: Path, mnt: Path, **kw: object) -> subprocess.Popen[bytes]:
    proc = start_mount(cluster, mnt, **kw)  # type: ignore[arg-type]
    _mounts.append(proc)
    return proc


@contextlib.contextmanager
def _mounted(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    *,
    nodes: int = 9,
    encoding: str = "rs-6-3",
    prepare: Callable[[Path], object] | None = None,
    **kw: object,
) -> Iterator[tuple[Path, Path]]:
    """A fresh cluster of 64 KiB blocks (rs-6-3 on 9 nodes unless told), made ready by
    ``prepare(cluster)``, mounted (``kw`` go to ``start_mount``)."""
    base = tmp_path_factory.mktemp(name)
    cluster, mnt = base / "cluster", base / "mnt"
    Cluster.create(cluster, nodes=nodes, encoding=encoding, block_size=64 << 10)
    if prepare is not None:
        prepare(cluster)
    mnt.mkdir()
    proc = mount_for_test(cluster, mnt, log=base / "mount.log", **kw)
    try:
        yield cluster, mnt
    finally:
        if is_mounted(mnt):
            unmount(mnt)
        proc.wait(30)


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    with _mounted(tmp_path_factory, "fuse") as both:
        yield both


@pytest.fixture(scope="module")
def mounted_direct(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The same kind of cluster, mounted with --direct-io (no kernel page cache)."""
    with _mounted(tmp_path_factory, "fuse-direct", direct_io=True) as both:
        yield both


def _test_dir(mnt: Path, request: pytest.FixtureRequest) -> Path:
    path = mnt / request.node.name.replace("[", "-").replace("]", "")
    path.mkdir()
    return path


@pytest.fixture
def d(mounted: tuple[Path, Path], request: pytest.FixtureRequest) -> Path:
    return _test_dir(mounted[1], request)


@pytest.fixture(params=["page-cache", "direct-io"])
def dm(request: pytest.FixtureRequest) -> Path:
    """A test directory on each of the two mounts (the test runs once per mode)."""
    name = "mounted" if request.param == "page-cache" else "mounted_direct"
    return _test_dir(request.getfixturevalue(name)[1], request)


def test_copy_round_trip_and_listing(dm: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = os.urandom(3 * (384 << 10) + 12345)  # several rs-6-3 blocks and a partial one
    src.write_bytes(data)
    shutil.copyfile(src, dm / "copy")
    assert (dm / "copy").read_bytes() == data
    assert (dm / "copy").stat().st_size == len(data)
    assert sorted(os.listdir(dm)) == ["copy"]


def test_errnos(d: Path) -> None:
    (d / "f").write_bytes(b"x")
    (d / "sub").mkdir()
    (d / "sub" / "inner").write_bytes(b"y")
    cases = [
        (lambda: os.mkdir(d / "sub"), errno.EEXIST),
        (lambda: os.rmdir(d / "sub"), errno.ENOTEMPTY),
        (lambda: os.rmdir(d / "f"), errno.ENOTDIR),
        (lambda: os.unlink(d / "sub"), errno.EISDIR),
        (lambda: os.stat(d / "nope"), errno.ENOENT),
        (lambda: (d / "f" / "x").write_bytes(b""), errno.ENOTDIR),
        (lambda: os.mkdir(d / ("n" * 256)), errno.ENAMETOOLONG),
        (lambda: os.symlink("f", d / "f"), errno.EEXIST),
        (lambda: os.link(d / "f", d / "sub"), errno.EEXIST),
        (lambda: os.link(d / "sub", d / "hard"), errno.EPERM),  # a directory
        (lambda: os.readlink(d / "f"), errno.EINVAL),
    ]
    for fn, code in cases:
        with pytest.raises(OSError) as info:
            fn()
        assert info.value.errno == code, (fn, info.value)
    assert (d / "f").read_bytes() == b"x" and (d / "sub" / "inner").read_bytes() == b"y"


def test_rename_replaces_atomically(d: Path) -> None:
    (d / "a").write_bytes(b"new")
    (d / "b").write_bytes(b"old")
    os.rename(d / "a", d / "b")
    assert (d / "b").read_bytes() == b"new" and not (d / "a").exists()


def test_writes_back_inside_the_file(dm: Path) -> None:
    with open(dm / "p", "wb") as f:
        f.write(b"x" * 100_000)
        f.seek(10)
        f.write(b"HEAD")
        f.seek(0, os.SEEK_END)
        f.write(b"tail")
    want = bytearray(b"x" * 100_000 + b"tail")
    want[10:14] = b"HEAD"
    assert (dm / "p").read_bytes() == bytes(want)
    with open(dm / "p", "r+b") as f:  # an existing file, kept: copy-on-write
        f.seek(5)
        f.write(b"!")
    want[5:6] = b"!"
    assert (dm / "p").read_bytes() == bytes(want)
    os.truncate(dm / "p", 7)
    assert (dm / "p").read_bytes() == bytes(want[:7])


def test_o_trunc_replaces_the_old_version(dm: Path) -> None:
    (dm / "v").write_bytes(b"first version, long")
    with open(dm / "v", "wb") as f:
        f.write(b"second")
    assert (dm / "v").read_bytes() == b"second"


def test_real_programs(dm: Path, tmp_path: Path) -> None:
    payload = tmp_path / "payload"
    payload.write_bytes(os.urandom(1 << 20))
    with zipfile.ZipFile(dm / "z.zip", "w") as z:  # patches each member's header after it
        z.write(payload, "payload")
        z.writestr("small.txt", "hello" * 1000)
    with zipfile.ZipFile(dm / "z.zip") as z:
        assert z.testzip() is None and z.read("payload") == payload.read_bytes()
    with tarfile.open(dm / "t.tar", "w") as t:
        t.add(payload, "payload")
    with tarfile.open(dm / "t.tar") as t:
        member = t.extractfile("payload")
        assert member is not None and member.read() == payload.read_bytes()
    np = pytest.importorskip("numpy")
    a = np.arange(300_000, dtype=np.float32)
    np.save(dm / "a.npy", a)
    assert (np.load(dm / "a.npy") == a).all()
    subprocess.run(["dd", f"if={payload}", f"of={dm / 'dd'}", "bs=1M", "status=none"], check=True)
    assert (dm / "dd").read_bytes() == payload.read_bytes()


def test_torch_save_and_load_a_large_state_dict(dm: Path) -> None:
    """torch.save writes a zip archive; torch.load reads it back, also memory-mapped."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(7)
    state = {f"layer{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(12)}
    state["step"] = torch.tensor(1234)
    torch.save(state, dm / "model.pt")  # 48 MiB of float32, in 64 KiB blocks here
    for mmap_load in (False, True):
        back = torch.load(dm / "model.pt", weights_only=True, mmap=mmap_load)
        assert back.keys() == state.keys()
        assert all(torch.equal(back[k], state[k]) for k in state)


def test_concurrent_reads_of_one_descriptor(dm: Path) -> None:
    """Threads read random ranges, across segment boundaries, through one open file: no
    segment buffer is recycled while another read still copies out of it."""
    data = os.urandom(3 << 20)  # 48 segments of 64 KiB
    (dm / "f").write_bytes(data)
    fd = os.open(dm / "f", os.O_RDONLY)
    errors: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            off = rng.randrange(len(data))
            n = rng.choice([1, 4096, 65536, 200_000, 1 << 20])
            if os.pread(fd, n, off) != data[off : off + n]:
                errors.append(f"pread({n}, {off})")

    try:
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
    assert not errors, errors[:5]


def test_writes_through_write_only_descriptors_are_seen_by_cached_readers(dm: Path) -> None:
    """Write-only opens skip the page cache: readers that cached the old bytes must still
    see the new ones (patched in place, truncated, appended)."""
    f = dm / "c"
    old = os.urandom(200_000)
    f.write_bytes(old)
    with open(f, "rb") as reader:  # fills the page cache (in page-cache mode)
        assert reader.read() == old
        fd = os.open(f, os.O_WRONLY)
        try:
            os.pwrite(fd, b"PATCH", 1000)
        finally:
            os.close(fd)
        new = old[:1000] + b"PATCH" + old[1005:]
        assert f.read_bytes() == new
    fd = os.open(f, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"more")
    finally:
        os.close(fd)
    assert f.read_bytes() == new + b"more"
    fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"short")
    finally:
        os.close(fd)
    assert f.read_bytes() == b"short"


def test_mmap_through_each_mode(dm: Path) -> None:
    """Private maps work in both modes; shared maps, also writable ones, only through the
    page cache (the kernel refuses them on a direct-I/O file: ENODEV)."""
    data = os.urandom(300_000)
    (dm / "m").write_bytes(data)
    with open(dm / "m", "rb") as f:
        private = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        with private:
            assert private[:] == data
        if "direct-io" in dm.name:
            with pytest.raises(OSError) as info:
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert info.value.errno == errno.ENODEV
        else:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as shared:
                assert shared[:] == data
    if "direct-io" not in dm.name:  # a shared writable map writes back through staging
        with open(dm / "m", "r+b") as f, mmap.mmap(f.fileno(), 0) as shared:
            shared[100:105] = b"HELLO"
            shared.flush()
        assert (dm / "m").read_bytes() == data[:100] + b"HELLO" + data[105:]


def test_an_unreadable_block_reads_as_eio_never_wrong_bytes(dm: Path) -> None:
    """Four of a block's nine rs-6-3 chunks corrupt in every 8 KiB piece (one more than it
    can lose): reading it fails with EIO, the other blocks still read, and once the chunks
    are good again the same descriptor reads the block (a failed segment is not cached)."""
    block = 6 * (64 << 10)
    data = os.urandom(3 * block)
    (dm / "e").write_bytes(data)
    layout = json.loads(os.getxattr(dm / "e", "user.tectonic.layout"))
    originals = {}
    for path in layout[1]["chunk_paths"][:4]:
        originals[path] = Path(path).read_bytes()
        broken = bytearray(originals[path])
        for at in range(PAYLOAD_OFFSET, len(broken), 4096):  # every piece's bytes
            broken[at] ^= 0xFF
        Path(path).write_bytes(broken)
    fd = os.open(dm / "e", os.O_RDONLY)
    try:
        assert os.pread(fd, block, 0) == data[:block]
        assert os.pread(fd, block, 2 * block) == data[2 * block :]
        for offset, size in ((block, block), (block + 1000, 10)):
            with pytest.raises(OSError) as info:
                os.pread(fd, size, offset)
            assert info.value.errno == errno.EIO
        try:  # from a good block into the bad one: EIO, or a short read of good bytes
            got = os.pread(fd, len(data), 0)
        except OSError as e:
            assert e.errno == errno.EIO
        else:
            assert len(got) <= block and got == data[: len(got)]
        for path, raw in originals.items():
            Path(path).write_bytes(raw)
        assert os.pread(fd, block, block) == data[block : 2 * block]
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root)")
def test_a_full_cluster_gives_enospc_and_keeps_what_it_stored(tmp_path: Path) -> None:
    disk, mnt = tmp_path / "disk", tmp_path / "mnt"
    disk.mkdir()
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], check=True)
    try:
        Cluster.create(disk / "c", nodes=4, encoding="r3", block_size=1 << 20)
        proc = mount_for_test(disk / "c", mnt, log=tmp_path / "mount.log")
        try:
            kept = os.urandom(3 << 20)
            (mnt / "kept").write_bytes(kept)
            with pytest.raises(OSError) as info:
                for i in range(100):  # 100 x 4 MiB x 3 replicas: far more than 40 MiB
                    with open(mnt / f"f{i}", "wb") as f:
                        for _ in range(4):
                            f.write(os.urandom(1 << 20))
            assert info.value.errno == errno.ENOSPC
            assert (mnt / "kept").read_bytes() == kept
            for j in range(i):  # the files written before it filled up are whole
                assert os.path.getsize(mnt / f"f{j}") == 4 << 20
        finally:
            unmount(mnt)
            proc.wait(30)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_mount_of_a_served_cluster_reads_through_a_killed_node(tmp_path: Path) -> None:
    """The mount on a served cluster (node processes over TCP): files written through it
    read back whole, also after one node is SIGKILLed."""
    from tectonic_emu.served import Serving, signal_node

    cluster, mnt, src = tmp_path / "cluster", tmp_path / "mnt", tmp_path / "src"
    Cluster.create(cluster, nodes=9, encoding="rs-6-3", block_size=64 << 10)
    mnt.mkdir()
    data = os.urandom(5 << 20)
    src.write_bytes(data)
    with Serving(cluster, repair_interval=0):
        proc = mount_for_test(cluster, mnt, log=tmp_path / "mount.log")
        try:
            subprocess.run(["cp", str(src), str(mnt / "f")], check=True)
            assert (mnt / "f").read_bytes() == data
            signal_node(cluster, 4, signal.SIGKILL)
            assert (mnt / "f").read_bytes() == data
            (mnt / "g").write_bytes(data[:100_000])  # writes go around the dead node
            assert (mnt / "g").read_bytes() == data[:100_000]
        finally:
            unmount(mnt)
            proc.wait(30)


def test_xattrs(d: Path) -> None:
    (d / "f").write_bytes(os.urandom(200_000))
    layout = json.loads(os.getxattr(d / "f", "user.tectonic.layout"))
    assert sum(b["length"] for b in layout) == 200_000
    assert os.getxattr(d / "f", "user.tectonic.encoding") == b"rs-6-3"
    assert "user.tectonic.layout" in os.listxattr(d / "f")
    with pytest.raises(OSError) as info:
        os.setxattr(d / "f", "user.tectonic.layout", b"{}")
    assert info.value.errno == errno.EPERM


def test_statfs_reports_real_capacity(mounted: tuple[Path, Path]) -> None:
    cluster, mnt = mounted
    mine, local = os.statvfs(mnt), os.statvfs(cluster)
    assert mine.f_blocks * mine.f_frsize == local.f_blocks * local.f_frsize


def test_remount_keeps_closed_files_and_a_killed_mount_is_cleared(tmp_path: Path) -> None:
    cluster, mnt = tmp_path / "c", tmp_path / "m"
    Cluster.create(cluster, nodes=5, encoding="r3", block_size=64 << 10)
    mnt.mkdir()
    proc = mount_for_test(cluster, mnt, log=tmp_path / "mount.log")
    data = os.urandom(500_000)
    (mnt / "kept").write_bytes(data)
    fd = os.open(mnt / "synced", os.O_WRONLY | os.O_CREAT)
    os.write(fd, data[:1000])
    os.fsync(fd)
    os.write(fd, data[1000:2000])  # not synced: may or may not survive
    os.kill(proc.pid, signal.SIGKILL)  # mid-stream, with the file still open
    proc.wait(10)
    with contextlib.suppress(OSError):  # closing on a dead mount fails: ENOTCONN
        os.close(fd)
    with pytest.raises(OSError):
        os.listdir(mnt)  # a dead mount: "Transport endpoint is not connected"
    unmount(mnt)
    assert not is_mounted(mnt)
    proc = mount_for_test(cluster, mnt)
    try:
        assert (mnt / "kept").read_bytes() == data
        synced = (mnt / "synced").read_bytes()
        assert synced in (data[:1000], data[:2000])  # the fsync'd prefix, never less
    finally:
        unmount(mnt)
        proc.wait(30)


def test_start_mount_raises_the_typed_error_whichever_process_found_it(tmp_path: Path) -> None:
    """The checks made before the mount process starts, and an error only the mount process
    meets (its metadata store), raise their own class and errno; a mount point with a mount
    already is refused and nothing is stacked on it; unmount refuses what is not mounted."""
    cluster, mnt, broken = tmp_path / "c", tmp_path / "m", tmp_path / "broken"
    Cluster.create(cluster, nodes=5, encoding="r3", block_size=64 << 10)
    shutil.copytree(cluster, broken)
    (broken / "metadata.db").write_bytes(b"not a database" * 1000)
    mnt.mkdir()
    (tmp_path / "file").write_bytes(b"")
    cases: list[tuple[Path, Path, type[OSError], int]] = [
        (tmp_path / "none", mnt, ClusterNotFoundError, errno.ENOENT),
        (cluster, tmp_path / "file", NotADirectoryError_, errno.ENOTDIR),
        (cluster, tmp_path / "missing", NotFoundError, errno.ENOENT),
        (broken, mnt, OSError, errno.EIO),  # raised in the mount process, pickled back
    ]
    for cluster_dir, point, cls, code in cases:
        with pytest.raises(cls) as info:
            mount_for_test(cluster_dir, point)
        assert info.value.errno == code, info.value
        assert not is_mounted(point)
    assert "not a database" in str(info.value)
    with pytest.raises(InvalidArgumentError):
        unmount(mnt)
    proc = mount_for_test(cluster, mnt)
    try:
        with pytest.raises(AlreadyExistsError) as exists:
            mount_for_test(cluster, mnt)
        assert exists.value.errno == errno.EEXIST
        assert mounts_at(mnt) == [FSTYPE]
    finally:
        unmount(mnt)
        proc.wait(30)
    assert mounts_at(mnt) == []
    before = _children()
    with pytest.raises(TectonicError, match=r"not mounted after 0\.05 s"):
        start_mount(cluster, mnt, wait=0.05)  # the child is still starting: ended and reaped
    assert mounts_at(mnt) == [] and _children() <= before


def _children() -> set[int]:
    """This process's children, zombies included (from /proc/PID/stat's ppid field)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                found.add(int(stat.parent.name))
    return found


def test_readers_keep_the_version_they_opened(d: Path, mounted: tuple[Path, Path]) -> None:
    old, new = os.urandom(300_000), os.urandom(1000)
    (d / "v").write_bytes(old)
    (d / "gone").write_bytes(old)
    with open(d / "v", "rb") as reader, open(d / "gone", "rb") as reader2:
        assert reader.read(10) == old[:10]
        with open(d / "v", "wb") as f:  # O_TRUNC: a new version, swapped in at close
            f.write(new)
        os.unlink(d / "gone")
        assert (d / "v").read_bytes() == new  # new opens see the new version
        assert reader.read() == old[10:]  # the open one keeps reading the old bytes
        assert reader2.read() == old
    assert not (d / "gone").exists()


def test_a_file_over_2_gib_written_with_dd(tmp_path: Path) -> None:
    """dd streams 2 GiB + 3 MiB through the mount; sha256 of what reads back matches."""
    cluster, mnt = tmp_path / "c", tmp_path / "m"
    Cluster.create(cluster, nodes=9, encoding="rs-6-3")  # real 8 MiB chunks
    mnt.mkdir()
    src = tmp_path / "src"
    src.write_bytes(os.urandom(64 << 20))
    copies = 32  # 2 GiB ...
    tail = tmp_path / "tail"
    tail.write_bytes(os.urandom(3 << 20))  # ... and 3 MiB more, past the 2^31 boundary
    feed = f"cat {' '.join([str(src)] * copies)} {tail}"
    want = subprocess.run(f"{feed} | sha256sum", shell=True, check=True, capture_output=True)
    proc = mount_for_test(cluster, mnt)
    try:
        subprocess.run(
            f"{feed} | dd of={mnt / 'big'} bs=1M iflag=fullblock status=none",
            shell=True,
            check=True,
        )
        assert (mnt / "big").stat().st_size == copies * (64 << 20) + (3 << 20)
        got = subprocess.run(["sha256sum", str(mnt / "big")], check=True, capture_output=True)
        assert got.stdout.split()[0] == want.stdout.split()[0]
    finally:
        unmount(mnt)
        proc.wait(30)


@pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio (scripts/bootstrap.sh)")
@pytest.mark.parametrize(
    "job",
    [
        ["--rw=write", "--bs=1M", "--size=48M"],  # sequential: streams into the store
        ["--rw=randwrite", "--bs=4k", "--size=4M", "--number_ios=600"],  # through staging
    ],
)
def test_fio_writes_verify(d: Path, job: list[str]) -> None:
    r = subprocess.run(
        [
            "fio",
            "--name=t",
            f"--directory={d}",
            "--ioengine=psync",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",  # else fio leaves a state file in the working directory
            "--end_fsync=1",
            *job,
        ],
        capture_output=True,
        text=True,
        cwd=d,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "verify" not in r.stderr.lower(), r.stderr


def test_bench_fuse_runs_every_path(tmp_path: Path) -> None:
    """A small ``bench fuse`` run: both mounts, the native client and the local disk each
    move the bytes and read them back (the benchmark checks the bytes)."""
    import asyncio

    from bench.fuse import run_fuse_bench

    result = asyncio.run(
        run_fuse_bench(size=3 << 20, encoding="rs-6-3", directory=tmp_path, runs=1)
    )
    fields = result.to_dict()
    for key in ("native", "mount", "direct"):
        assert fields[f"{key}_write_mb_s"] > 0 and fields[f"{key}_read_mb_s"] > 0
    assert not any(tmp_path.iterdir()), "the benchmark leaves nothing behind"
