"""Metadata that survives (issue 19): a lost, emptied, damaged or foreign metadata store is
refused loudly; dumps and backups bring the namespace back; nothing but the writes after the
last backup is lost.

Faults are real: metadata.db is deleted, truncated, overwritten with another cluster's; chunk
files of a backup are corrupted on disk. The commands run as real processes.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tectonic_emu import Cluster
from tectonic_emu.client import Client
from tectonic_emu.config import METADATA_FILE, ClusterConfig
from tectonic_emu.errors import AlreadyExistsError, InvalidArgumentError, MetadataLostError
from tectonic_emu.metadata import KVStore, MemoryKV, SQLiteKV
from tectonic_emu.metadata.snapshot import CLUSTER_KEY, dump, load, verify
from tectonic_emu.services.backup import PREFIX, list_backups, take_backup

from .conftest import SMALL_BLOCK, make_cluster, run_with
from .test_cli import fails, ok, ok_json

FIX = "meta restore --latest"


def chunk_files(root: Path) -> list[str]:
    """Every chunk file under the nodes' directories (nodes/nNNN/dD/xx/ID; backups too)."""
    return sorted(
        str(p.relative_to(root)) for p in (root / "nodes").glob("n*/d*/*/*") if p.is_file()
    )


def data_chunks(root: Path) -> list[str]:
    return [c for c in chunk_files(root) if not Path(c).name.startswith(PREFIX)]


def drop_metadata(root: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(root / METADATA_FILE) + suffix).unlink(missing_ok=True)


@pytest.fixture
def populated(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """A cluster with two files and a directory, backed up, then a third file written after
    the backup. Returns (root, bytes of /keep/a.bin, bytes of /late.bin)."""
    root = make_cluster(tmp_path / "c", nodes=5, encoding="r3", disks_per_node=2)
    early = os.urandom(3 * SMALL_BLOCK + 17)
    late = os.urandom(2 * SMALL_BLOCK + 5)
    (tmp_path / "early").write_bytes(early)
    (tmp_path / "late").write_bytes(late)
    ok("mkdir", "/keep", cluster=root)
    ok("put", str(tmp_path / "early"), "/keep/a.bin", cluster=root)
    ok("put", str(tmp_path / "early"), "/b.bin", cluster=root)
    ok("meta", "backup", cluster=root)
    ok("put", str(tmp_path / "late"), "/late.bin", cluster=root)
    return root, early, late


# -- opening refuses lost metadata -----------------------------------------------------------
def _lose(root: Path, how: str, tmp_path: Path) -> None:
    if how == "deleted":
        drop_metadata(root)
    elif how == "emptied":
        drop_metadata(root)
        (root / METADATA_FILE).write_bytes(b"")
    elif how == "truncated":
        db = root / METADATA_FILE
        size = db.stat().st_size
        with open(db, "r+b") as f:
            f.truncate(size // 2)
    elif how == "foreign":
        other = make_cluster(tmp_path / "other", nodes=5, encoding="r3")
        drop_metadata(root)
        shutil.copy(other / METADATA_FILE, root / METADATA_FILE)


@pytest.mark.parametrize("how", ["deleted", "emptied", "truncated", "foreign"])
def test_lost_metadata_fails_loudly_and_repair_deletes_nothing(
    populated: tuple[Path, bytes, bytes], how: str, tmp_path: Path
) -> None:
    root, early, _ = populated
    before = chunk_files(root)
    _lose(root, how, tmp_path)
    line = fails("ls", "/", cluster=root, mentions=FIX)
    assert "meta load" in line
    fails("repair", "--gc-grace", "0", cluster=root, mentions=FIX)
    fails("serve", cluster=root, mentions=FIX)
    assert chunk_files(root) == before  # not one chunk collected

    out = ok("meta", "restore", "--latest", cluster=root).decode()
    assert "restored backup" in out
    assert ok("ls", "/", cluster=root).decode().split() == ["b.bin", "keep/"]
    ok("get", "/keep/a.bin", str(tmp_path / "a.out"), cluster=root)
    assert (tmp_path / "a.out").read_bytes() == early


def test_restore_loses_only_the_writes_after_the_backup(
    populated: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    root, early, late = populated
    late_chunks = set(data_chunks(root)) - set(_chunks_of(root, ["/keep/a.bin", "/b.bin"]))
    drop_metadata(root)
    report = ok_json("meta", "restore", "--latest", cluster=root)
    # Exactly the late file's chunks are reported lost, nothing else.
    assert report["lost_chunks"] == len(late_chunks) == 3 * 3  # 3 blocks x 3 replicas
    assert report["lost_bytes"] == 3 * len(late)
    assert report["unreadable_blocks"] == report["older_unreferenced_chunks"] == 0
    fails("stat", "/late.bin", cluster=root, mentions="late.bin")
    for n, path in enumerate(("/keep/a.bin", "/b.bin")):
        ok("get", path, str(tmp_path / f"out{n}"), cluster=root)
        assert (tmp_path / f"out{n}").read_bytes() == early


def _chunks_of(root: Path, paths: list[str]) -> list[str]:
    async def go(c: Cluster) -> list[str]:
        found = []
        for p in paths:
            for b in await c.client().layout(p):
                for ch in b.chunks:
                    path = c.nodes[ch.node].chunk_path(ch.disk, ch.chunk_id)
                    assert path is not None
                    found.append(str(Path(path).relative_to(root)))
        return found

    return run_with(root, go)


def test_restore_refuses_intact_metadata_without_force(
    populated: tuple[Path, bytes, bytes],
) -> None:
    root, _, _ = populated
    fails("meta", "restore", "--latest", cluster=root, mentions="--force")
    assert "late.bin" in ok("ls", "/", cluster=root).decode()
    ok("meta", "restore", "--latest", "--force", cluster=root)
    assert "late.bin" not in ok("ls", "/", cluster=root).decode()


def test_restore_skips_a_damaged_newest_backup(
    populated: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    root, _, _ = populated
    ok("meta", "backup", cluster=root)  # the newest, with /late.bin
    backups = ok_json("meta", "backups", cluster=root)
    assert len(backups) == 2 and all(b["complete"] for b in backups)
    newest = backups[0]["id"]
    for path in (root / "nodes").rglob(f"{PREFIX}{newest}-p00000*"):
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF  # every copy of its first part fails its CRC
        path.write_bytes(bytes(raw))
    drop_metadata(root)
    report = ok_json("meta", "restore", "--latest", cluster=root)
    assert report["backup"]["id"] == backups[1]["id"]
    assert len(report["skipped"]) == 1 and newest in report["skipped"][0]
    assert "late.bin" not in ok("ls", "/", cluster=root).decode()


def test_restore_without_a_backup_says_so_and_changes_nothing(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=3, encoding="r3")
    drop_metadata(root)
    assert ok_json("meta", "backups", cluster=root) == []  # listing needs no metadata
    fails("meta", "restore", "--latest", cluster=root, mentions="no complete backup")
    fails("meta", "restore", "--id", "20260101t000000000z-0000", cluster=root, mentions="no backup")
    fails("ls", "/", cluster=root, mentions=FIX)  # still lost, not emptied into a namespace


def test_a_damaged_sqlite_file_is_set_aside(populated: tuple[Path, bytes, bytes]) -> None:
    root, _, _ = populated
    db = root / METADATA_FILE
    db.write_bytes(b"this is not a database file" * 200)
    fails("ls", "/", cluster=root, mentions="damaged")
    report = ok_json("meta", "restore", "--latest", cluster=root)
    assert report["set_aside"] and Path(report["set_aside"]).exists()
    assert "b.bin" in ok("ls", "/", cluster=root).decode()


# -- dump and load ---------------------------------------------------------------------------
def test_dump_and_load_round_trip_through_the_command(
    populated: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    root, _, late = populated
    listing = ok("ls", "-l", "/", cluster=root)
    ok("meta", "dump", str(tmp_path / "m.dump"), cluster=root)
    drop_metadata(root)
    ok("meta", "load", str(tmp_path / "m.dump"), cluster=root)
    assert ok("ls", "-l", "/", cluster=root) == listing
    ok("get", "/late.bin", str(tmp_path / "late.out"), cluster=root)
    assert (tmp_path / "late.out").read_bytes() == late
    fails("meta", "load", str(tmp_path / "m.dump"), cluster=root, mentions="--force")


def test_dump_refuses_symlinks_and_special_files(
    populated: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    root, _, _ = populated
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    (tmp_path / "link").symlink_to(target)
    fails("meta", "dump", str(tmp_path / "link"), cluster=root, mentions="symlink")
    assert target.read_bytes() == b"keep me"
    os.mkfifo(tmp_path / "fifo")
    fails("meta", "dump", str(tmp_path / "fifo"), cluster=root, mentions="is a FIFO")
    ok("meta", "dump", "--force", str(tmp_path / "link"), cluster=root)
    assert target.read_bytes() == b"keep me"  # the link was replaced, not followed
    assert not (tmp_path / "link").is_symlink()


def test_a_dump_of_another_cluster_is_refused(tmp_path: Path) -> None:
    a = make_cluster(tmp_path / "a", nodes=3, encoding="r3")
    b = make_cluster(tmp_path / "b", nodes=3, encoding="r3")
    ok("meta", "dump", str(tmp_path / "a.dump"), cluster=a)
    drop_metadata(b)
    fails("meta", "load", str(tmp_path / "a.dump"), cluster=b, mentions="the dump is of cluster")


keys = st.binary(min_size=1, max_size=40).filter(lambda k: not k.startswith(b"M\x00"))
stores = st.dictionaries(keys, st.binary(max_size=300), max_size=60)


async def _fill(kv: KVStore, pairs: dict[bytes, bytes]) -> None:
    async with kv.transaction() as txn:
        await txn.put(CLUSTER_KEY, b'{"cluster_id": "c0ffee"}')
        for k, v in pairs.items():
            await txn.put(k, v)


async def _everything(kv: KVStore) -> list[tuple[bytes, bytes]]:
    return await kv.scan(b"")


@given(pairs=stores, batch=st.integers(1, 7))
def test_dump_load_round_trips_any_store_on_memorykv(pairs: dict[bytes, bytes], batch: int) -> None:
    async def go() -> None:
        src, dst = MemoryKV(), MemoryKV()
        await _fill(src, pairs)
        buf = io.BytesIO()
        info = await dump(src, buf, created=1.0, batch=batch)
        assert info.keys == len(pairs) + 1 and info.cluster_id == "c0ffee"
        buf.seek(0)
        await load(dst, buf, cluster_id="c0ffee", batch=batch)
        assert await _everything(dst) == await _everything(src)

    asyncio.run(go())


@given(pairs=stores)
def test_dump_load_round_trips_sqlite_into_memorykv_and_back(
    tmp_path_factory: pytest.TempPathFactory, pairs: dict[bytes, bytes]
) -> None:
    path = tmp_path_factory.mktemp("kv") / "m.db"

    async def go() -> None:
        sq = SQLiteKV(path, synchronous="off")
        mem = MemoryKV()
        try:
            await _fill(sq, pairs)
            first = io.BytesIO()
            await dump(sq, first, created=2.0, batch=5)
            first.seek(0)
            await load(mem, first)
            again = io.BytesIO()
            await dump(mem, again, created=2.0, batch=5)
            assert again.getvalue() == first.getvalue()  # byte for byte
            again.seek(0)
            await load(sq, again, replace=True)
            assert await _everything(sq) == await _everything(mem)
        finally:
            await sq.close()

    asyncio.run(go())


@given(pairs=stores, cut=st.integers(0, 10_000), flip=st.integers(0, 10_000))
def test_damaged_dumps_are_refused_before_anything_is_written(
    pairs: dict[bytes, bytes], cut: int, flip: int
) -> None:
    async def go() -> None:
        src = MemoryKV()
        await _fill(src, pairs)
        buf = io.BytesIO()
        await dump(src, buf, created=3.0)
        raw = buf.getvalue()
        for bad in (raw[: cut % len(raw)], _flipped(raw, flip % len(raw)), raw + b"x"):
            dst = MemoryKV()
            with pytest.raises(InvalidArgumentError):
                await load(dst, io.BytesIO(bad))
            assert await _everything(dst) == []

    asyncio.run(go())


def _flipped(raw: bytes, at: int) -> bytes:
    b = bytearray(raw)
    b[at] ^= 0x01
    return bytes(b)


def test_load_refuses_a_store_in_use_without_replace() -> None:
    async def go() -> None:
        src, dst = MemoryKV(), MemoryKV()
        await _fill(src, {b"a": b"1"})
        await _fill(dst, {b"b": b"2"})
        buf = io.BytesIO()
        await dump(src, buf, created=0.0)
        buf.seek(0)
        with pytest.raises(AlreadyExistsError):
            await load(dst, buf)
        assert verify(io.BytesIO(buf.getvalue())).keys == 2

    asyncio.run(go())


# -- backups: when, where, how many ----------------------------------------------------------
def test_an_embedded_owner_backs_up_on_close_when_due_and_keeps_the_newest(
    tmp_path: Path,
) -> None:
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r3", backup_interval=1e-6, backup_keep=2)
    for n in range(4):
        ok("mkdir", f"/d{n}", cluster=root)  # each command's close takes a backup
    found = ok_json("meta", "backups", cluster=root)
    assert len(found) == 2 and all(b["complete"] and b["copies"] == 3 for b in found)
    # Each backup's chunks sit on 3 distinct nodes.
    nodes = {p.parts[-4] for p in (root / "nodes").rglob(f"{PREFIX}{found[0]['id']}-m")}
    assert len(nodes) == 3


def test_backups_off_and_not_yet_due_take_none(tmp_path: Path) -> None:
    off = make_cluster(tmp_path / "off", nodes=3, encoding="r3", backup_interval=0)
    later = make_cluster(tmp_path / "later", nodes=3, encoding="r3")  # 1 h: not due yet
    for root in (off, later):
        ok("mkdir", "/x", cluster=root)
        assert ok_json("meta", "backups", cluster=root) == []


def test_a_served_cluster_is_backed_up_by_its_supervisor(tmp_path: Path) -> None:
    from tectonic_emu.served import Serving

    root = make_cluster(tmp_path / "c", nodes=4, encoding="r3", backup_interval=0)
    with Serving(root, repair_interval=0, backup_interval=0.2):
        ok("mkdir", "/served", cluster=root)
        after = time.time()

        async def go(c: Cluster) -> bool:
            for _ in range(300):  # a safety net: the loop checks every 0.2 s
                if any(b.created > after for b in await list_backups(c.nodes)):
                    return True
                await asyncio.sleep(0.1)
            return False

        assert run_with(root, go)
    drop_metadata(root)
    ok("meta", "restore", "--latest", cluster=root)
    assert ok("ls", "/", cluster=root).decode().split() == ["served/"]


def test_the_api_refuses_lost_metadata_too(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=3, encoding="r3")
    drop_metadata(root)

    async def go() -> None:
        async with Cluster.open(root):
            pass

    with pytest.raises(MetadataLostError, match="meta restore --latest"):
        asyncio.run(go())
    assert not (root / METADATA_FILE).exists()  # nothing created in its place


def test_a_backup_needs_its_copies_on_live_nodes(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r3")
    ok("node", "stop", "1", cluster=root)
    ok("node", "stop", "2", cluster=root)
    fails("meta", "backup", cluster=root, mentions="needs 3 live nodes")
    assert not [c for c in chunk_files(root) if Path(c).name.startswith(PREFIX)]

    async def go(c: Cluster) -> None:
        c.start_node(1)
        info = await take_backup(c.nodes, c.meta.kv, part_size=SMALL_BLOCK)
        assert [b.id for b in await list_backups(c.nodes)] == [info.id]

    run_with(root, go)


# -- a namespace, through the client, dumped and loaded on MemoryKV ----------------------------
names = st.text(alphabet="abcxyz019_.-", min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..")
)
trees = st.recursive(
    st.binary(max_size=3 * 4096),
    lambda sub: st.dictionaries(names, sub, min_size=1, max_size=4),
    max_leaves=12,
)


async def _build(client: Client, path: str, tree: object) -> None:
    if isinstance(tree, bytes):
        await client.write_file(path, tree)
        return
    assert isinstance(tree, dict)
    if path != "/":
        await client.mkdir(path)
    for name, sub in tree.items():
        await _build(client, path.rstrip("/") + "/" + name, sub)


async def _walk(client: Client, path: str = "/") -> dict[str, object]:
    out: dict[str, object] = {}
    for e in await client.scandir(path):
        child = path.rstrip("/") + "/" + e.name
        st_ = await client.stat(child)
        if e.kind == "dir":
            out[e.name] = (e.id, await _walk(client, child))
        else:
            out[e.name] = (e.id, st_.size, await client.read_file(child))
    return out


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_cluster(
        tmp_path_factory.mktemp("ns") / "c", nodes=3, encoding="r3", block_size=4096
    )


@given(tree=st.dictionaries(names, trees, max_size=5))
def test_a_namespace_round_trips_exactly_through_dump_and_load(
    small_cluster: Path, tree: dict[str, object]
) -> None:
    async def go() -> None:
        async with Cluster.open(small_cluster, kv=MemoryKV()) as c:
            await _build(c.client(), "/", tree)
            before = await _walk(c.client())
            buf = io.BytesIO()
            await dump(c.meta.kv, buf, created=0.0)
        buf.seek(0)
        fresh = MemoryKV()
        await load(fresh, buf)
        async with Cluster.open(small_cluster, kv=fresh) as c:
            assert await _walk(c.client()) == before

    asyncio.run(go())


class _CutOff(io.BytesIO):
    """A dump stream whose reads fail after ``budget`` of them once it is read a second time
    (the writing pass of ``load``): a disk error, or the process dying, mid-load."""

    def __init__(self, data: bytes, budget: int) -> None:
        super().__init__(data)
        self.passes = 0
        self.budget = budget

    def seek(self, pos: int, whence: int = 0) -> int:
        self.passes += 1
        return super().seek(pos, whence)

    def read(self, n: int | None = -1) -> bytes:
        if self.passes >= 1:
            self.budget -= 1
            if self.budget < 0:
                raise OSError(5, "Input/output error")
        return super().read(n)


@given(pairs=stores, budget=st.integers(0, 200))
def test_a_load_cut_short_leaves_a_store_that_opening_refuses(
    pairs: dict[bytes, bytes], budget: int
) -> None:
    from tectonic_emu.identity import check_metadata

    async def go() -> None:
        src = MemoryKV()
        await _fill(src, pairs)
        buf = io.BytesIO()
        await dump(src, buf, created=4.0, batch=3)
        dst = MemoryKV()
        await _fill(dst, {b"old": b"namespace"})
        stream = _CutOff(buf.getvalue(), budget)
        try:
            await load(dst, stream, replace=True, batch=3)
        except OSError:
            config = ClusterConfig(nodes=3, encoding="r3", cluster_id="c0ffee")
            with pytest.raises(MetadataLostError, match="incomplete"):
                await check_metadata(Path("."), config, dst)
            return
        assert await _everything(dst) == await _everything(src)  # the budget sufficed

    asyncio.run(go())
