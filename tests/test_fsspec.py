"""The fsspec filesystem (``clients/fsspec.py``): pandas, pyarrow and torch DCP round trips
through ``tectonic://`` URLs, fsspec's own implementer suites, the write semantics (atomic
``wb``, append-only ``ab``), the error types, async use, and copies in other processes."""

from __future__ import annotations

import asyncio
import errno
import multiprocessing
import os
import pickle
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import fsspec.tests.abstract as abstract  # type: ignore[import-untyped]
import pytest

from clients.fsspec import TectonicFile, TectonicFileSystem, cluster_url, split_url
from tectonic_emu import Cluster, InvalidArgumentError

from .conftest import run_with

REPO = Path(__file__).resolve().parents[1]
BLOCK = 64 << 10  # store block of an r3 file: writes of a few hundred KiB span blocks


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsspec") / "cluster"
    Cluster.create(root, nodes=4, encoding="r3", block_size=BLOCK)
    return root


@pytest.fixture(scope="module")
def tfs(cluster_dir: Path) -> Iterator[TectonicFileSystem]:
    fs = fsspec.filesystem("tectonic", cluster=str(cluster_dir))
    yield fs
    fs.close()
    TectonicFileSystem.clear_instance_cache()


@pytest.fixture
def root(tfs: TectonicFileSystem) -> str:
    """A fresh directory of the store for one test."""
    path = f"/t-{uuid.uuid4().hex[:12]}"
    tfs.mkdir(path)
    return path


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 131 + seed) % 251 for i in range(n))


# -- entry point and URLs --------------------------------------------------------------------------
def test_entry_point_finds_the_class(tfs: TectonicFileSystem, cluster_dir: Path) -> None:
    assert fsspec.get_filesystem_class("tectonic") is TectonicFileSystem
    assert isinstance(tfs, TectonicFileSystem)
    assert fsspec.filesystem("tectonic", cluster=str(cluster_dir)) is tfs  # cached per args


def test_cluster_in_the_url(tfs: TectonicFileSystem, cluster_dir: Path, root: str) -> None:
    tfs.pipe_file(root + "/x", b"hello")
    url = cluster_url(str(cluster_dir), root + "/x")
    assert url == "tectonic://" + str(cluster_dir).replace("/", "%2F") + root + "/x"
    fs, path = fsspec.core.url_to_fs(url)
    assert fs is tfs and path == root + "/x"
    assert tfs.unstrip_protocol(path) == url
    with fsspec.open(url, "rb") as f:
        assert f.read() == b"hello"
    with fsspec.open("tectonic://" + root + "/x", "rt", cluster=str(cluster_dir)) as f:
        assert f.read() == "hello"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("tectonic:///a/b", (None, "/a/b")),
        ("tectonic://%2Ftmp%2Fc1/a//b/", ("/tmp/c1", "/a/b")),
        ("tectonic://%2Ftmp%2Fc%25d", ("/tmp/c%d", "/")),
        ("tectonic://", (None, "/")),
        ("/a/b/", (None, "/a/b")),
        ("a/b", (None, "/a/b")),
    ],
)
def test_split_url(url: str, expected: tuple[str | None, str]) -> None:
    assert split_url(url) == expected


def test_ambiguous_host_and_missing_cluster_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="percent-encoded") as e:
        fsspec.core.url_to_fs("tectonic://data/x")
    assert isinstance(e.value, ValueError) and e.value.errno == errno.EINVAL
    with pytest.raises(ValueError, match="no cluster"):
        fsspec.filesystem("tectonic")
    fs = TectonicFileSystem(cluster=tmp_path / "nothing", skip_instance_cache=True)
    with pytest.raises(FileNotFoundError, match="no cluster here"):
        fs.ls("/")


# -- pandas and pyarrow ----------------------------------------------------------------------------
def test_pandas_round_trips(cluster_dir: Path, root: str) -> None:
    pd = pytest.importorskip("pandas")
    np = pytest.importorskip("numpy")
    n = 30_000
    df = pd.DataFrame(
        {"k": np.arange(n) % 3, "v": np.arange(n) * 7, "s": [f"r{i}" for i in range(n)]}
    )
    opts = {"cluster": str(cluster_dir)}
    url = "tectonic://" + root + "/df.parquet"
    df.to_parquet(url, storage_options=opts)
    pd.testing.assert_frame_equal(pd.read_parquet(url, storage_options=opts), df)
    pd.testing.assert_frame_equal(pd.read_parquet(cluster_url(str(cluster_dir), url)), df)

    df.to_parquet("tectonic://" + root + "/parts", partition_cols=["k"], storage_options=opts)
    back = pd.read_parquet("tectonic://" + root + "/parts", storage_options=opts)
    back["k"] = back["k"].astype("int64")
    back = back.sort_values("v").reset_index(drop=True)
    pd.testing.assert_frame_equal(back[list(df.columns)], df)


def test_pyarrow_dataset_round_trips(tfs: TectonicFileSystem, cluster_dir: Path, root: str) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ds = pytest.importorskip("pyarrow.dataset")
    parts = [pa.table({"k": [i % 2] * 20_000, "v": list(range(i, i + 20_000))}) for i in range(3)]
    for i, t in enumerate(parts):
        pq.write_table(t, f"{root}/plain/part-{i}.parquet", filesystem=tfs)
    assert tfs.info(f"{root}/plain/part-0.parquet")["size"] > BLOCK  # more than one store block
    dataset = ds.dataset(f"{root}/plain", filesystem=tfs, format="parquet")
    got = dataset.to_table().sort_by([("v", "ascending"), ("k", "ascending")])
    assert got.equals(pa.concat_tables(parts).sort_by([("v", "ascending"), ("k", "ascending")]))

    whole = pa.concat_tables(parts)
    pq.write_to_dataset(whole, f"{root}/hive", partition_cols=["k"], filesystem=tfs)
    assert sorted(tfs.ls(f"{root}/hive", detail=False)) == [f"{root}/hive/k=0", f"{root}/hive/k=1"]
    # The cluster in the URL: fsspec resolves it, pyarrow gets the filesystem and the path.
    fs, path = fsspec.core.url_to_fs(cluster_url(str(cluster_dir), f"{root}/hive"))
    hive = ds.dataset(path, filesystem=fs, partitioning="hive")
    assert hive.count_rows() == whole.num_rows
    assert hive.to_table(filter=ds.field("k") == 1).num_rows == 20_000


# -- fsspec's implementer suites -------------------------------------------------------------------
class TectonicFixtures(abstract.AbstractFixtures):  # type: ignore[misc]
    """Every case of fsspec's Copy, Get, Put, Pipe and Open suites applies: they write whole
    files only (nothing in place), and the store has real, possibly empty, directories."""

    @pytest.fixture
    def fs(self, tfs: TectonicFileSystem) -> TectonicFileSystem:
        return tfs

    @pytest.fixture
    def fs_path(self) -> str:
        return f"/abstract-{uuid.uuid4().hex[:12]}"


class TestTectonicCopy(abstract.AbstractCopyTests, TectonicFixtures):  # type: ignore[misc]
    pass


class TestTectonicGet(abstract.AbstractGetTests, TectonicFixtures):  # type: ignore[misc]
    pass


class TestTectonicPut(abstract.AbstractPutTests, TectonicFixtures):  # type: ignore[misc]
    pass


class TestTectonicPipe(abstract.AbstractPipeTests, TectonicFixtures):  # type: ignore[misc]
    pass


class TestTectonicOpen(abstract.AbstractOpenTests, TectonicFixtures):  # type: ignore[misc]
    pass


# -- write semantics -------------------------------------------------------------------------------
def test_wb_replaces_atomically_on_close(tfs: TectonicFileSystem, root: str) -> None:
    p = root + "/f"
    tfs.pipe_file(p, b"old")
    new = payload(5 * BLOCK + 17)
    f = tfs.open(p, "wb")
    f.write(new)  # past a block: bytes are in the store, in a nameless version
    assert tfs.cat_file(p) == b"old"
    assert tfs.ls(root, detail=False) == [p]
    f.close()
    assert tfs.cat_file(p) == new
    assert tfs.info(p)["sealed"] is True


def test_wb_failing_inside_with_leaves_nothing(tfs: TectonicFileSystem, root: str) -> None:
    tfs.pipe_file(root + "/kept", b"old")
    for name in ("kept", "new"):
        with pytest.raises(RuntimeError), tfs.open(f"{root}/{name}", "wb") as f:
            f.write(payload(3 * BLOCK))
            raise RuntimeError("the writer fails half way")
    assert tfs.cat_file(root + "/kept") == b"old"
    assert not tfs.exists(root + "/new")


def test_transaction_publishes_at_its_end(tfs: TectonicFileSystem, root: str) -> None:
    with tfs.transaction:
        with tfs.open(root + "/a", "wb") as f:
            f.write(b"data")
        assert not tfs.exists(root + "/a")
    assert tfs.cat_file(root + "/a") == b"data"


def test_reader_keeps_its_version_or_fails(tfs: TectonicFileSystem, root: str) -> None:
    p = root + "/f"
    old = payload(4 * BLOCK)
    tfs.pipe_file(p, old)
    with tfs.open(p, "rb", cache_type="none") as f:
        assert isinstance(f, TectonicFile)
        f.seek(BLOCK + 3)
        assert f.read(100) == old[BLOCK + 3 : BLOCK + 103]
        tfs.pipe_file(p, payload(4 * BLOCK, seed=1))  # replaced: the old version is gone
        with pytest.raises(FileNotFoundError):
            f.read(100)


def test_append_is_visible_while_written_then_sealed(tfs: TectonicFileSystem, root: str) -> None:
    p = root + "/log"
    first = payload(3 * BLOCK + 5)
    f = tfs.open(p, "ab")
    f.write(first)
    f.flush()  # durable and visible
    info = tfs.info(p)
    assert (info["size"], info["sealed"]) == (len(first), False)
    assert tfs.cat_file(p) == first
    f.write(b"lost")
    with pytest.raises(RuntimeError), f:
        raise RuntimeError("crash before the next flush")
    # The file stays unsealed with its durable bytes; the next writer appends after them.
    with tfs.open(p, "ab") as g:
        assert g.tell() == len(first)
        g.write(b"tail")
    assert tfs.cat_file(p) == first + b"tail"
    assert tfs.info(p)["sealed"] is True
    with pytest.raises(PermissionError, match="sealed"):
        tfs.open(p, "ab")
    with tfs.open(root + "/text", "a") as t:  # text append creates the file
        t.write("line\n")
    assert tfs.cat_file(root + "/text") == b"line\n"


@pytest.mark.parametrize("mode", ["r+b", "w+b", "a+b", "rb+"])
def test_modes_writing_in_place_are_refused(tfs: TectonicFileSystem, root: str, mode: str) -> None:
    tfs.pipe_file(root + "/f", b"x")
    with pytest.raises(InvalidArgumentError, match="append-only") as e:
        tfs.open(root + "/f", mode)
    assert isinstance(e.value, ValueError) and e.value.errno == errno.EINVAL


# -- names, bytes and errors -----------------------------------------------------------------------
def test_errors_are_builtin_oserrors(tfs: TectonicFileSystem, root: str) -> None:
    tfs.pipe_file(root + "/file", b"x")
    tfs.pipe_file(root + "/dir/inner", b"y")
    cases: list[tuple[type[OSError], int, Callable[[], object]]] = [
        (FileNotFoundError, errno.ENOENT, lambda: tfs.cat_file(root + "/missing")),
        (FileNotFoundError, errno.ENOENT, lambda: tfs.open(root + "/missing", "rb")),
        (FileNotFoundError, errno.ENOENT, lambda: tfs.mkdir(root + "/a/b", create_parents=False)),
        (FileNotFoundError, errno.ENOENT, lambda: tfs.rm(root + "/missing")),
        (IsADirectoryError, errno.EISDIR, lambda: tfs.open(root + "/dir", "rb")),
        (IsADirectoryError, errno.EISDIR, lambda: tfs.open(root + "/dir", "wb")),
        (IsADirectoryError, errno.EISDIR, lambda: tfs.cat_file(root + "/dir")),
        (IsADirectoryError, errno.EISDIR, lambda: tfs.rm(root + "/dir")),
        (NotADirectoryError, errno.ENOTDIR, lambda: tfs.info(root + "/file/x")),
        (NotADirectoryError, errno.ENOTDIR, lambda: tfs.rmdir(root + "/file")),
        (FileExistsError, errno.EEXIST, lambda: tfs.mkdir(root + "/dir")),
        (FileExistsError, errno.EEXIST, lambda: tfs.makedirs(root + "/dir")),
        (FileExistsError, errno.EEXIST, lambda: tfs.open(root + "/file", "xb")),
        (OSError, errno.ENOTEMPTY, lambda: tfs.rmdir(root + "/dir")),
    ]
    for kind, code, call in cases:
        with pytest.raises(kind) as e:
            call()
        assert e.value.errno == code, (kind, e.value)
    assert not tfs.exists(root + "/file/x") and not tfs.isdir(root + "/file/x")
    tfs.makedirs(root + "/dir", exist_ok=True)


def test_without_auto_mkdir_parents_must_exist(cluster_dir: Path, root: str) -> None:
    fs = TectonicFileSystem(cluster=cluster_dir, auto_mkdir=False, skip_instance_cache=True)
    try:
        with pytest.raises(FileNotFoundError):
            fs.pipe_file(root + "/no/such/dir/f", b"x")
        fs.makedirs(root + "/no/such/dir")
        fs.pipe_file(root + "/no/such/dir/f", b"x")
    finally:
        fs.close()


def test_listing_and_info(tfs: TectonicFileSystem, root: str) -> None:
    tfs.pipe_file(root + "/b", payload(100))
    tfs.mkdir(root + "/a")
    listing = tfs.ls(root, detail=True)
    assert [i["name"] for i in listing] == [root + "/a", root + "/b"]
    a, b = listing
    assert (a["type"], a["size"]) == ("directory", 0)
    assert (b["type"], b["size"], b["sealed"], b["encoding"]) == ("file", 100, True, "r3")
    assert tfs.ls(root + "/b", detail=False) == [root + "/b"]  # a file lists as itself
    assert tfs.info("/")["type"] == "directory"
    assert tfs.info("tectonic://" + root)["name"] == root
    assert tfs.modified(root + "/b").timestamp() == pytest.approx(b["mtime"])
    assert tfs.isfile(root + "/b") and tfs.isdir(root + "/a") and not tfs.isfile(root + "/a")
    assert tfs.find(root, withdirs=True) == [root, root + "/a", root + "/b"]
    assert tfs.du(root) == 100


def test_links_modes_owners_and_times_as_the_local_filesystem_has_them(
    tfs: TectonicFileSystem, cluster_dir: Path, root: str
) -> None:
    """info and ls(detail=True) carry what the native client keeps, under LocalFileSystem's
    names: ``mode`` with the type bits, ``islink`` and a symlink's ``destination``. A
    symlink is never followed: its type is "link", and reading it is the store's EINVAL."""
    when = 1_700_000_000.0
    tfs.pipe_file(root + "/f", b"abc")

    async def attributes(c: Cluster) -> None:
        cl = c.client()
        await cl.chmod(root + "/f", 0o640)
        await cl.chown(root + "/f", 1000, 1001)
        await cl.utime(root + "/f", atime=when - 60, mtime=when)
        await cl.mknod(root + "/fifo", "fifo")

    run_with(cluster_dir, attributes)
    tfs.link(root + "/f", root + "/hard")
    tfs.symlink("f", root + "/s")
    local = {"name", "size", "type", "created", "islink", "mode", "uid", "gid", "mtime", "nlink"}
    infos = {i["name"].rsplit("/", 1)[-1]: i for i in tfs.ls(root, detail=True)}
    assert sorted(infos) == ["f", "fifo", "hard", "s"]
    f = infos["f"]
    assert local <= f.keys() and "destination" not in f
    assert (f["type"], f["mode"], f["uid"], f["gid"], f["nlink"], f["islink"]) == (
        "file", stat.S_IFREG | 0o640, 1000, 1001, 2, False
    )  # fmt: skip
    assert (f["mtime"], f["atime"]) == (when, when - 60) and f["ctime"] > when
    assert infos["hard"] == f | {"name": root + "/hard"}
    s = infos["s"]
    assert (s["type"], s["mode"], s["islink"], s["destination"], s["size"]) == (
        "link", stat.S_IFLNK | 0o777, True, "f", 1
    )  # fmt: skip
    assert tfs.info(root + "/s") == s
    assert (infos["fifo"]["type"], infos["fifo"]["mode"]) == ("other", stat.S_IFIFO | 0o644)
    assert tfs.info(root)["mode"] == stat.S_IFDIR | 0o755
    assert tfs.islink(root + "/s") and not tfs.islink(root + "/f")
    assert not tfs.islink(root + "/nothing") and not tfs.isfile(root + "/s")
    for read in (tfs.cat_file, tfs.open, lambda p: tfs.get_file(p, os.devnull)):
        with pytest.raises(InvalidArgumentError, match="not a regular file") as e:
            read(root + "/s")
        assert e.value.errno == errno.EINVAL
    with pytest.raises(InvalidArgumentError):
        tfs.cp_file(root + "/s", root + "/copy")
    assert not tfs.exists(root + "/copy")
    with pytest.raises(FileExistsError):
        tfs.symlink("g", root + "/s")
    with pytest.raises(FileNotFoundError):
        tfs.link(root + "/nothing", root + "/new/dir/link")
    assert not tfs.exists(root + "/new")  # a missing source makes no parents
    tfs.touch(root + "/f", truncate=False)  # times now, the bytes as they were
    assert tfs.info(root + "/f")["mtime"] > when and tfs.cat_file(root + "/f") == b"abc"


def test_cat_ranges(tfs: TectonicFileSystem, root: str) -> None:
    data = payload(3 * BLOCK + 11)
    tfs.pipe_file(root + "/f", data)
    p = root + "/f"
    assert tfs.cat_file(p, start=BLOCK - 5, end=BLOCK + 5) == data[BLOCK - 5 : BLOCK + 5]
    assert tfs.cat_file(p, start=-7) == data[-7:]
    assert tfs.cat_file(p, start=10, end=-10) == data[10:-10]
    assert tfs.cat_file(p, start=len(data) + 5) == b""
    assert tfs.cat_ranges([p, p], [0, 2 * BLOCK], [3, 2 * BLOCK + 3]) == [
        data[:3],
        data[2 * BLOCK : 2 * BLOCK + 3],
    ]
    assert tfs.head(p, 4) == data[:4] and tfs.tail(p, 4) == data[-4:]


def test_directory_encoding_is_inherited(tfs: TectonicFileSystem, root: str) -> None:
    tfs.mkdir(root + "/ec", encoding="rs-2-1")
    tfs.pipe_file(root + "/ec/f", payload(5 * BLOCK))
    assert tfs.info(root + "/ec/f")["encoding"] == "rs-2-1"
    assert tfs.cat_file(root + "/ec/f") == payload(5 * BLOCK)


def test_mv_is_one_atomic_rename(tfs: TectonicFileSystem, root: str) -> None:
    tfs.pipe_file(root + "/d/f", b"x")
    moved_id = tfs.info(root + "/d")["id"]
    tfs.mv(root + "/d", root + "/e")
    assert tfs.info(root + "/e")["id"] == moved_id and not tfs.exists(root + "/d")
    tfs.mkdir(root + "/into")
    tfs.mv(root + "/e", root + "/into")  # an existing directory: moved inside, as mv(1) does
    assert tfs.cat_file(root + "/into/e/f") == b"x"
    tfs.pipe_file(root + "/g", b"new")
    tfs.rename(root + "/g", root + "/into/e/f")  # replaces the file there
    assert tfs.cat_file(root + "/into/e/f") == b"new"


def test_rm_trees_globs_and_depths(tfs: TectonicFileSystem, root: str) -> None:
    for p in ("a/1", "a/2", "a/sub/3", "b/4", "c"):
        tfs.pipe_file(f"{root}/{p}", b"x")
    tfs.rm(root + "/a", recursive=True)
    assert tfs.ls(root, detail=False) == [root + "/b", root + "/c"]
    tfs.rm(root + "/[bc]*", recursive=True)
    assert tfs.ls(root, detail=False) == []
    tfs.pipe_file(root + "/x/y/z", b"x")
    with pytest.raises(OSError) as e:
        tfs.rm(root + "/x", recursive=True, maxdepth=1)  # /x/y is left non-empty
    assert e.value.errno == errno.ENOTEMPTY


def test_put_get_and_cp_stream_in_pieces(
    tfs: TectonicFileSystem, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("clients.fsspec.TRANSFER_CHUNK", BLOCK // 3)
    data = payload(7 * BLOCK + 1)
    (tmp_path / "in").write_bytes(data)
    tfs.put_file(str(tmp_path / "in"), root + "/f")
    tfs.cp_file(root + "/f", root + "/copy")
    tfs.get_file(root + "/copy", str(tmp_path / "out"))
    assert (tmp_path / "out").read_bytes() == data
    assert tfs.cat_file(root + "/copy") == data
    with pytest.raises(FileExistsError):
        tfs.put_file(str(tmp_path / "in"), root + "/f", mode="create")


# -- async use, pickling and other processes -------------------------------------------------------
def test_async_mode(cluster_dir: Path, root: str) -> None:
    fs = TectonicFileSystem(cluster=cluster_dir, asynchronous=True, skip_instance_cache=True)

    async def use(name: str) -> None:
        await fs._pipe_file(f"{root}/{name}", b"async")
        assert await fs._cat_file(f"{root}/{name}") == b"async"
        assert f"{root}/{name}" in await fs._ls(root, detail=False)

    asyncio.run(use("one"))  # left open: its loop is gone when the next run starts
    asyncio.run(use("two"))  # so the cluster is opened again on the new loop
    with pytest.raises(ValueError, match="synchronous"):
        fs.open(root + "/one", "rb")

    async def close() -> None:
        await fs._close()

    asyncio.run(close())


def test_pickled_copy_in_the_same_process(tfs: TectonicFileSystem, root: str) -> None:
    assert pickle.loads(pickle.dumps(tfs)) is tfs  # fsspec's instance cache
    tfs.pipe_file(root + "/f", b"x")
    with tfs.open(root + "/f", "rb") as f:
        assert pickle.loads(pickle.dumps(f)).read() == b"x"


CHILD = """
import pickle, sys
fs = pickle.loads(open(sys.argv[1], "rb").read())
sys.stdout.write(fs.cat_file(sys.argv[2]).decode())
fs.pipe_file(sys.argv[3], b"from the child")
fs.close()
"""


def test_pickled_copy_in_another_process(
    tfs: TectonicFileSystem, root: str, tmp_path: Path
) -> None:
    tfs.pipe_file(root + "/in", b"from the parent")
    blob = tmp_path / "fs.pickle"
    blob.write_bytes(pickle.dumps(tfs))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [str(blob), root + "/in", root + "/out"]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from the parent"
    assert tfs.cat_file(root + "/out") == b"from the child"


LEAVER = """
import sys
import fsspec
fs = fsspec.filesystem("tectonic", cluster=sys.argv[1])
appended = fs.open(sys.argv[2] + "/log", "ab")
appended.write(b"a" * 1000)
appended.flush()
appended.write(b"unflushed")
new = fs.open(sys.argv[2] + "/new", "wb")  # kept: a file collected mid-run is closed
new.write(b"never closed")
"""


def test_exit_with_files_left_open(tfs: TectonicFileSystem, cluster_dir: Path, root: str) -> None:
    """The interpreter exits (no hang on fsspec's vanished IO thread); what was left open is
    as after a crash: the new version never appears, the append keeps its flushed bytes."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-c", LEAVER, str(cluster_dir), root]
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not tfs.exists(root + "/new")
    info = tfs.info(root + "/log")
    assert (info["size"], info["sealed"]) == (1000, False)


def _forked_child(fs: TectonicFileSystem, root: str) -> None:
    assert fs.cat_file(root + "/in") == b"before the fork"
    fs.pipe_file(root + "/out", b"from the forked child")
    fs.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_inherited_by_a_forked_child(tfs: TectonicFileSystem, root: str) -> None:
    tfs.pipe_file(root + "/in", b"before the fork")  # the parent's cluster is open
    child = multiprocessing.get_context("fork").Process(target=_forked_child, args=(tfs, root))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert tfs.cat_file(root + "/out") == b"from the forked child"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_torch_dcp_fsspec_writer_and_reader(
    tfs: TectonicFileSystem, cluster_dir: Path, root: str
) -> None:
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    state = {"w": torch.arange(40_000, dtype=torch.float32).reshape(200, 200), "step": 7}
    url = "tectonic://" + root + "/ckpt/step-7"
    # sync_files=False: close() already makes every byte durable; torch would add os.sync().
    writer = FsspecWriter(url, sync_files=False, cluster=str(cluster_dir))
    dcp_save(state, storage_writer=writer, no_dist=True)
    assert root + "/ckpt/step-7/.metadata" in tfs.ls(root + "/ckpt/step-7", detail=False)
    out = {"w": torch.zeros(200, 200), "step": 0}
    dcp_load(out, storage_reader=FsspecReader(url, cluster=str(cluster_dir)), no_dist=True)
    assert torch.equal(out["w"], state["w"]) and out["step"] == 7
