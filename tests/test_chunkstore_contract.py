"""The storage-node contract, run on every backend, plus LocalNode's on-disk failure cases and
the fault-injecting wrapper."""

from __future__ import annotations

import array
import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import itertools
import mmap
import os
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import google_crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tectonic_emu.chunkstore import (
    HEADER_SIZE,
    PAYLOAD_OFFSET,
    ChunkInfo,
    FaultyNode,
    LocalNode,
    MemoryNode,
    StorageNode,
    decode_chunk,
    encode_chunk,
)
from tectonic_emu.chunkstore._format import (
    FLAG_ZSTD,
    MAGIC,
    PIECE_SIZE,
    id_crc32c,
    pack_header,
    payload_offset,
)
from tectonic_emu.chunkstore._opencache import OpenChunks
from tectonic_emu.chunkstore.remote import RemoteNode, fixed_address
from tectonic_emu.coding.synthetic import Synthetic
from tectonic_emu.errors import (
    AlreadyExistsError,
    ChunkCorruptError,
    ChunkNotFoundError,
    InvalidArgumentError,
    NodeUnavailableError,
)
from tectonic_emu.qos import NodeQos
from tectonic_emu.sim.devices import FLASH, Disk
from tectonic_emu.sim.fabric import Fabric, FabricModel
from tectonic_emu.sim.node import ModelNode, ModelServer
from tests.node_thread import SECRET, ThreadedNodeServer

run = asyncio.run
T = TypeVar("T")
DISKS = 3


def crc(data: bytes | bytearray | memoryview) -> int:
    return int(google_crc32c.value(bytes(data)))


_servers: dict[int, ThreadedNodeServer] = {}


def make_node(kind: str, root: Path) -> StorageNode:
    if kind == "remote":
        server = ThreadedNodeServer(root, node_id=7, disks=DISKS)
        remote = RemoteNode(7, DISKS, fixed_address(*server.address), secret=SECRET)
        _servers[id(remote)] = server
        return remote
    if kind == "local":
        return LocalNode(root, node_id=7, disks=DISKS)
    if kind == "memory":
        return MemoryNode(7, DISKS)
    if kind == "model":  # a projection's node, on a real loop here: its charges are sleeps
        fabric = Fabric(FabricModel(nic_gbps=100.0, rtt=1e-4))
        client, host = fabric.add_rack(2)
        disks = [Disk(FLASH) for _ in range(DISKS)]
        scheduled = NodeQos(DISKS, costs=FLASH.costs())  # as a projection with --qos fair
        return ModelNode(ModelServer(7, host, disks, qos=scheduled), client, fabric)
    return FaultyNode(LocalNode(root, node_id=7, disks=DISKS, sync=False))


@pytest.fixture(params=["local", "memory", "faulty-local", "remote", "model"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorageNode]:
    n = make_node(request.param, tmp_path / "node")
    yield n
    run(n.close())
    server = _servers.pop(id(n), None)
    if server is not None:
        server.stop()


async def write(node: StorageNode, disk: int, chunk_id: str, data: bytes, flags: int = 0) -> None:
    await node.write_chunk(disk, chunk_id, data, crc32c=crc(data), flags=flags)


# -- the contract ------------------------------------------------------------------------------
def test_write_read_stat_list_delete(node: StorageNode) -> None:
    data = os.urandom(100_000)
    cid = "00c0ffee12345678.3.a1b2c3d4"

    async def go() -> None:
        t0 = time.time()
        await write(node, 1, cid, data, flags=FLAG_ZSTD)
        got, info = await node.read_chunk(1, cid)
        assert bytes(got) == data
        assert info == ChunkInfo(cid, 1, len(data), crc(data), FLAG_ZSTD, info.mtime)
        assert t0 - 2 <= info.mtime <= time.time() + 2
        assert await node.stat_chunk(1, cid) == info
        assert await node.list_chunks(1) == [info]
        assert await node.list_chunks(0) == []
        usage = await node.usage()
        assert [u.disk for u in usage] == list(range(DISKS))
        assert [u.chunks for u in usage] == [0, 1, 0]
        assert usage[1].bytes_used == PAYLOAD_OFFSET + len(data)
        assert all(u.bytes_free > 0 for u in usage)
        # the same id on another disk is another chunk
        await write(node, 2, cid, b"other")
        assert bytes((await node.read_chunk(2, cid))[0]) == b"other"

        await node.delete_chunk(1, cid)
        with pytest.raises(ChunkNotFoundError):
            await node.read_chunk(1, cid)
        with pytest.raises(ChunkNotFoundError):
            await node.stat_chunk(1, cid)
        await node.delete_chunk(1, cid)  # absent: no error
        assert await node.list_chunks(1) == []
        assert [u.chunks for u in await node.usage()] == [0, 0, 1]

    run(go())


def test_chunk_ids_are_written_once(node: StorageNode) -> None:
    async def go() -> None:
        await write(node, 0, "abc", b"first")
        with pytest.raises(AlreadyExistsError):
            await write(node, 0, "abc", b"second")
        assert bytes((await node.read_chunk(0, "abc"))[0]) == b"first"
        # concurrent writers of one id: exactly one wins, and its chunk is whole
        results = await asyncio.gather(
            *(write(node, 1, "race", bytes([i]) * 50_000) for i in range(4)),
            return_exceptions=True,
        )
        assert sum(r is None for r in results) == 1
        assert all(isinstance(r, AlreadyExistsError) for r in results if r is not None)
        got = bytes((await node.read_chunk(1, "race"))[0])
        assert got == got[:1] * 50_000

    run(go())


def test_unsynced_writes_read_back_and_sync_once_per_disk(node: StorageNode) -> None:
    """A chunk written with ``sync=False`` is a chunk like any other (read, listed, refused
    a second time); ``sync_disk`` covers it, shares
    one flush among concurrent callers, and is a no-op with nothing to cover."""

    async def go() -> None:
        data = [os.urandom(20_000 + i) for i in range(6)]
        await asyncio.gather(
            *(
                node.write_chunk(i % 2, f"u{i}", d, crc32c=crc(d), sync=False)
                for i, d in enumerate(data)
            )
        )
        with pytest.raises(AlreadyExistsError):
            await node.write_chunk(0, "u0", b"x", crc32c=crc(b"x"), sync=False)
        await asyncio.gather(*(node.sync_disk(d) for d in (0, 1, 0, 1, 2)))
        await node.sync_disk(0)
        for i, d in enumerate(data):
            assert bytes((await node.read_chunk(i % 2, f"u{i}"))[0]) == d
        assert sorted(c.chunk_id for c in await node.list_chunks(0)) == ["u0", "u2", "u4"]

    run(go())


@pytest.mark.parametrize("disk", [-1, DISKS, 100])
def test_bad_disk(node: StorageNode, disk: int) -> None:
    async def go() -> None:
        with pytest.raises(InvalidArgumentError):
            await write(node, disk, "abc", b"x")
        with pytest.raises(InvalidArgumentError):
            await node.read_chunk(disk, "abc")
        with pytest.raises(InvalidArgumentError):
            await node.stat_chunk(disk, "abc")
        with pytest.raises(InvalidArgumentError):
            await node.delete_chunk(disk, "abc")
        with pytest.raises(InvalidArgumentError):
            await node.list_chunks(disk)
        with pytest.raises(InvalidArgumentError):
            await node.sync_disk(disk)

    run(go())


@pytest.mark.parametrize("cid", ["", "ABC", "a/b", "../x", ".hidden", "a b", "x" * 65, "é"])
def test_bad_chunk_id(node: StorageNode, cid: str) -> None:
    async def go() -> None:
        with pytest.raises(InvalidArgumentError):
            await write(node, 0, cid, b"x")
        with pytest.raises(InvalidArgumentError):
            await node.read_chunk(0, cid)
        with pytest.raises(InvalidArgumentError):
            await node.stat_chunk(0, cid)
        with pytest.raises(InvalidArgumentError):
            await node.delete_chunk(0, cid)

    run(go())


def test_bad_crc_and_flags(node: StorageNode) -> None:
    async def go() -> None:
        for kw in ({"crc32c": -1}, {"crc32c": 1 << 32}, {"crc32c": 0, "flags": 1 << 16}):
            with pytest.raises(InvalidArgumentError):
                await node.write_chunk(0, "abc", b"", **kw)
        with pytest.raises(InvalidArgumentError):
            await node.write_chunk(0, "abc", memoryview(b"abcdef")[::2], crc32c=0)
        assert await node.list_chunks(0) == []

    run(go())


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    size=st.sampled_from([0, 1, PIECE_SIZE - 1, PIECE_SIZE, 3 * PIECE_SIZE + 7, 200_003]),
    data=st.data(),
)
def test_a_range_reads_what_the_whole_holds(node: StorageNode, size: int, data: Any) -> None:
    """``read_chunk_range`` gives exactly the bytes of the range, at any offset and length
    (piece boundaries, the short last piece, empty), and refuses one past the payload."""
    payload = os.urandom(size)
    cid = f"r{size}-{data.draw(st.integers(0, 10**9))}"
    ranges = data.draw(
        st.lists(
            st.integers(0, size).flatmap(lambda a: st.tuples(st.just(a), st.integers(a, size))),
            min_size=1,
            max_size=4,
        )
    )

    async def go() -> None:
        await write(node, 0, cid, payload)
        for a, b in ranges:
            got, info = await node.read_chunk_range(0, cid, a, b - a)
            assert bytes(got) == payload[a:b] and info.stored_len == size
        for a, n in [(-1, 1), (size, 1), (0, size + 1), (0, -1)]:
            with pytest.raises(InvalidArgumentError):
                await node.read_chunk_range(0, cid, a, n)
        await node.delete_chunk(0, cid)

    run(go())


def test_a_range_checks_only_its_pieces(local: LocalNode) -> None:
    """A flipped byte fails the ranges that cover its piece and no other; a whole read
    fails. The node reads only the pieces it needs (the rest may be anything)."""
    data = os.urandom(10 * PIECE_SIZE + 100)
    run(write(local, 0, "c", data))
    _flip(local.chunk_path(0, "c"), PAYLOAD_OFFSET + 4 * PIECE_SIZE + 17)  # in piece 4
    for a, b in [
        (0, 4 * PIECE_SIZE),
        (5 * PIECE_SIZE, len(data)),
        (4 * PIECE_SIZE - 3, 4 * PIECE_SIZE),
    ]:
        got, _ = run(local.read_chunk_range(0, "c", a, b - a))
        assert bytes(got) == data[a:b]
    for a, b in [(4 * PIECE_SIZE, 4 * PIECE_SIZE + 1), (3 * PIECE_SIZE, 6 * PIECE_SIZE)]:
        with pytest.raises(ChunkCorruptError, match="piece at payload offset 32768"):
            run(local.read_chunk_range(0, "c", a, b - a))
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk(0, "c"))
    # a bad checksum in the table fails its piece alone, too
    _flip(local.chunk_path(0, "c"), PAYLOAD_OFFSET + 4 * PIECE_SIZE + 17)  # the byte back
    _flip(local.chunk_path(0, "c"), HEADER_SIZE + 4 * 7)  # piece 7's checksum
    run(local.read_chunk_range(0, "c", 0, 7 * PIECE_SIZE))
    with pytest.raises(ChunkCorruptError, match="piece at payload offset 57344"):
        run(local.read_chunk_range(0, "c", 7 * PIECE_SIZE, 5))


def test_wrong_checksum_from_writer_reads_as_corrupt(node: StorageNode) -> None:
    """A node on disks (and a served one, on arrival) checks the payload against its
    checksum before it computes the piece checksums from it, and refuses it, writing
    nothing; the memory and model nodes store what they are given and catch it on read."""

    async def go() -> None:
        try:
            await node.write_chunk(0, "abc", b"payload", crc32c=crc(b"payload") ^ 1)
        except ChunkCorruptError:
            assert not isinstance(node, (MemoryNode, ModelNode))
            assert await node.list_chunks(0) == []
            return
        with pytest.raises(ChunkCorruptError):
            await node.read_chunk(0, "abc")

    run(go())


def test_unavailable_node_answers_nothing(node: StorageNode) -> None:
    async def go() -> None:
        await write(node, 0, "abc", b"data")
        node.available = False
        calls = [
            write(node, 0, "def", b"x"),
            node.read_chunk(0, "abc"),
            node.stat_chunk(0, "abc"),
            node.delete_chunk(0, "abc"),
            node.list_chunks(0),
            node.usage(),
            node.sync_disk(0),
        ]
        for call in calls:
            with pytest.raises(NodeUnavailableError):
                await call
        node.available = True
        assert bytes((await node.read_chunk(0, "abc"))[0]) == b"data"
        assert [c.chunk_id for c in await node.list_chunks(0)] == ["abc"]

    run(go())


def test_payload_kinds(node: StorageNode) -> None:
    big = bytearray(os.urandom(10_000))
    ints = array.array("I", range(1000))
    payloads: dict[str, bytes | bytearray | memoryview] = {
        "empty": b"",
        "bytes": bytes(big),
        "bytearray": big,
        "slice": memoryview(big)[1234:5678],
        "ints": memoryview(ints),
    }

    async def go() -> None:
        for name, payload in payloads.items():
            expected = bytes(memoryview(payload).cast("B"))
            await node.write_chunk(0, name, payload, crc32c=crc(expected))
        big[:] = bytes(len(big))  # the node must not keep references to callers' buffers
        for name, payload in payloads.items():
            got, info = await node.read_chunk(0, name)
            if name in ("bytes", "ints", "empty"):
                expected = bytes(memoryview(payload).cast("B"))
                assert bytes(got) == expected
            assert info.stored_len == len(got) == memoryview(payload).nbytes
            assert crc(got) == info.crc32c

    run(go())


def test_closed_node_is_unavailable(node: StorageNode) -> None:
    run(node.close())
    with pytest.raises(NodeUnavailableError):
        run(node.read_chunk(0, "abc"))
    run(node.close())  # idempotent


_counter = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payload=st.binary(max_size=70_000),
    disk=st.integers(0, DISKS - 1),
    flags=st.integers(0, 0xFFFF),
)
def test_random_payloads_round_trip(
    node: StorageNode, payload: bytes, disk: int, flags: int
) -> None:
    cid = f"{next(_counter):x}.0.{flags:x}"

    async def go() -> None:
        await write(node, disk, cid, payload, flags)
        got, info = await node.read_chunk(disk, cid)
        assert bytes(got) == payload
        assert (info.stored_len, info.flags, info.crc32c) == (len(payload), flags, crc(payload))

    run(go())


@pytest.mark.parametrize("kind", ["memory", "model"])
def test_nodes_that_keep_descriptions_round_trip_synthetic_payloads(
    kind: str, tmp_path: Path
) -> None:
    """The payload-free variant of the contract: nodes that keep descriptions (a
    projection's) store a ``Synthetic`` payload as it is, return it equal, report its
    length, and refuse it when the writer's checksum is not its own."""
    node = make_node(kind, tmp_path / "node")
    data = Synthetic.join([b"head", Synthetic.random(11, 5 << 20)])

    async def go() -> None:
        await node.write_chunk(1, "syn.0", data, crc32c=data.crc32c())
        got, info = await node.read_chunk(1, "syn.0")
        assert (
            got == data
            and info.stored_len == len(data) == (await node.stat_chunk(1, "syn.0")).stored_len
        )
        assert [c.chunk_id for c in await node.list_chunks(1)] == ["syn.0"]
        await node.write_chunk(2, "bad.0", data, crc32c=data.crc32c() ^ 1)
        with pytest.raises(ChunkCorruptError):
            await node.read_chunk(2, "bad.0")
        await node.delete_chunk(1, "syn.0")
        with pytest.raises(ChunkNotFoundError):
            await node.read_chunk(1, "syn.0")
        await node.close()

    run(go())


class NodeModel(RuleBasedStateMachine):
    """Random writes, deletes and reads on a LocalNode and a MemoryNode, against a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="node-model-")
        self.nodes: list[StorageNode] = [
            LocalNode(self.tmp, 0, 2, sync=False),
            MemoryNode(0, 2),
        ]
        self.model: dict[tuple[int, str], bytes] = {}

    ids = st.sampled_from(["a", "b.1", "c-2", "0123abcd.5.ff"])
    disks = st.integers(0, 1)

    @rule(disk=disks, cid=ids, data=st.binary(max_size=300))
    def write(self, disk: int, cid: str, data: bytes) -> None:
        for n in self.nodes:
            if (disk, cid) in self.model:
                with pytest.raises(AlreadyExistsError):
                    run(write(n, disk, cid, data))
            else:
                run(write(n, disk, cid, data))
        self.model.setdefault((disk, cid), data)

    @rule(disk=disks, cid=ids)
    def delete(self, disk: int, cid: str) -> None:
        for n in self.nodes:
            run(n.delete_chunk(disk, cid))
        self.model.pop((disk, cid), None)

    @rule(disk=disks, cid=ids)
    def read(self, disk: int, cid: str) -> None:
        for n in self.nodes:
            if (disk, cid) in self.model:
                assert bytes(run(n.read_chunk(disk, cid))[0]) == self.model[disk, cid]
            else:
                with pytest.raises(ChunkNotFoundError):
                    run(n.read_chunk(disk, cid))

    @invariant()
    def listings_match(self) -> None:
        for n in self.nodes:
            for disk in (0, 1):
                listed = {(i.chunk_id, i.stored_len) for i in run(n.list_chunks(disk))}
                assert listed == {(c, len(d)) for (dk, c), d in self.model.items() if dk == disk}

    def teardown(self) -> None:
        for n in self.nodes:
            run(n.close())
        shutil.rmtree(self.tmp)


NodeModel.TestCase.settings = settings(max_examples=15, stateful_step_count=20, deadline=None)
test_node_model = NodeModel.TestCase


# -- LocalNode on disk -------------------------------------------------------------------------
@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalNode]:
    n = LocalNode(tmp_path / "node", node_id=3, disks=2)
    yield n
    run(n.close())


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_unsynced_writes_cost_no_fsync_and_share_one_syncfs(
    local: LocalNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The point of ``sync=False``: no fdatasync or directory fsync per chunk; a disk's
    ``sync_disk`` is one ``syncfs``, run after the writes it covers, shared by the callers
    waiting together; a failed one raises, and the next call flushes again."""
    import tectonic_emu.chunkstore._local as local_mod

    calls: list[str] = []
    real_fdatasync, real_fsync, real_syncfs = os.fdatasync, os.fsync, local_mod._syncfs
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append("fdatasync"), real_fdatasync(fd)))
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd)))
    fail = [False]

    def syncfs(path: str) -> None:
        calls.append(f"syncfs {Path(path).name}")
        if fail[0]:
            raise OSError(errno.EIO, "injected writeback error")
        real_syncfs(path)

    monkeypatch.setattr(local_mod, "_syncfs", syncfs)

    async def go() -> None:
        for i in range(5):
            d = os.urandom(10_000)
            await local.write_chunk(1, f"c{i}", d, crc32c=crc(d), sync=False)
        assert calls == []
        await asyncio.gather(*(local.sync_disk(1) for _ in range(4)))
        assert calls == ["syncfs d1"]
        await local.sync_disk(1)  # nothing new: no flush
        await local.sync_disk(0)
        assert calls == ["syncfs d1"]
        d = os.urandom(10_000)
        await local.write_chunk(1, "c5", d, crc32c=crc(d), sync=False)
        fail[0] = True
        with pytest.raises(OSError, match="injected"):
            await local.sync_disk(1)
        fail[0] = False
        await local.sync_disk(1)
        assert calls == ["syncfs d1"] * 3
        await local.write_chunk(1, "c6", d, crc32c=crc(d))  # synced: its own fdatasync
        assert calls[3] == "fdatasync"

    run(go())


def test_file_format_is_as_documented(local: LocalNode) -> None:
    data = os.urandom(1000)
    run(write(local, 1, "fmt", data, flags=FLAG_ZSTD))
    path = local.chunk_path(1, "fmt")
    assert path.startswith(str(local.root / "d1")) and path.endswith("/fmt")
    raw = Path(path).read_bytes()
    assert raw == encode_chunk("fmt", data, crc(data), FLAG_ZSTD)
    magic, version, flags, length, pcrc, icrc, piece, hcrc = struct.unpack(
        "<4sHHQIIII", raw[:HEADER_SIZE]
    )
    assert (magic, version, flags, length) == (MAGIC, 3, FLAG_ZSTD, len(data))
    assert (pcrc, icrc, piece) == (crc(data), id_crc32c("fmt"), PIECE_SIZE)
    assert hcrc == crc(raw[:28])
    assert decode_chunk(raw, "fmt")[1] == data
    # one piece: its checksum, then zeros to the payload's page
    assert raw[HEADER_SIZE : HEADER_SIZE + 4] == struct.pack("<I", crc(data))
    assert raw[HEADER_SIZE + 4 : PAYLOAD_OFFSET] == bytes(PAYLOAD_OFFSET - HEADER_SIZE - 4)
    assert raw[PAYLOAD_OFFSET:] == data


def test_piece_checksums_are_as_documented(local: LocalNode) -> None:
    """One CRC32C per 8 KiB piece after the header, the last piece short; past 1,015
    pieces (7.9 MiB) the table takes a second page, and the payload starts there."""
    for size, offset in [(3 * PIECE_SIZE + 5, PAYLOAD_OFFSET), ((8 << 20) + 1, 2 * PAYLOAD_OFFSET)]:
        data = os.urandom(size)
        run(write(local, 0, f"p{size}", data))
        raw = Path(local.chunk_path(0, f"p{size}")).read_bytes()
        n = -(-size // PIECE_SIZE)
        table = struct.unpack_from(f"<{n}I", raw, HEADER_SIZE)
        pieces = [data[i : i + PIECE_SIZE] for i in range(0, size, PIECE_SIZE)]
        assert list(table) == [crc(p) for p in pieces]
        assert raw[HEADER_SIZE + 4 * n : offset] == bytes(offset - HEADER_SIZE - 4 * n)
        assert raw[offset:] == data and len(raw) == offset + size


def test_version_2_files_still_read(local: LocalNode) -> None:
    """A chunk written before piece checksums (version 2: zeros to the payload's page)
    reads whole and in ranges (checked whole)."""
    data = os.urandom(3 * PIECE_SIZE)
    path = Path(local.chunk_path(0, "v2"))
    path.parent.mkdir(parents=True, exist_ok=True)
    head = pack_header("v2", len(data), crc(data), 0, version=2)
    path.write_bytes(head.ljust(PAYLOAD_OFFSET, b"\0") + data)
    assert bytes(run(local.read_chunk(0, "v2"))[0]) == data
    assert bytes(run(local.read_chunk_range(0, "v2", 9000, 100))[0]) == data[9000:9100]
    _flip(str(path), PAYLOAD_OFFSET + 20000)  # outside the range: the whole is checked
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk_range(0, "v2", 9000, 100))


def test_version_1_files_still_read(local: LocalNode) -> None:
    """A chunk written before payloads moved to a page boundary (version 1: the payload
    right after the 32-byte header) reads, stats and lists as before."""
    data = os.urandom(3000)
    path = Path(local.chunk_path(0, "old"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pack_header("old", len(data), crc(data), 0, version=1) + data)
    assert bytes(run(local.read_chunk(0, "old"))[0]) == data
    assert run(local.stat_chunk(0, "old")).stored_len == len(data)
    buf = bytearray(len(data))
    run(local.read_chunk_into(0, "old", memoryview(buf)))
    assert buf == data


@pytest.mark.parametrize(
    "size", [PAYLOAD_OFFSET, PAYLOAD_OFFSET + 1, 3 * PAYLOAD_OFFSET, (9 << 20) + 123]
)
@pytest.mark.parametrize("aligned", [True, False])
def test_payloads_with_whole_pages_go_through_o_direct_from_any_memory(
    local: LocalNode, size: int, aligned: bool
) -> None:
    """Whole pages are written with O_DIRECT, from the caller's memory when it is
    page-aligned and through a bounce buffer when not; the partial last page through the
    page cache. Every layout reads back exactly."""
    data = os.urandom(size)
    if aligned:
        buf = mmap.mmap(-1, size)
        buf[:] = data
        payload: Any = memoryview(buf)
    else:
        payload = memoryview(bytearray(b"x" + data))[1:]  # one byte past a malloc boundary
    run(local.write_chunk(0, f"d{size}", payload, crc32c=crc(data)))
    at = payload_offset(size, PIECE_SIZE)
    assert os.path.getsize(local.chunk_path(0, f"d{size}")) == at + size
    assert bytes(run(local.read_chunk(0, f"d{size}"))[0]) == data
    assert 0 not in local._no_direct  # the disk took O_DIRECT


def _resident_pages(path: str) -> int:
    """Pages of the file at ``path`` in the page cache (``mincore`` over a private map of it,
    which touches none)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    size = os.path.getsize(path)
    vec = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        first = ctypes.c_char.from_buffer(m)
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(first)), ctypes.c_size_t(size), vec):
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del first  # before the map closes
    return sum(v & 1 for v in vec)


@pytest.mark.parametrize("sync", [True, False])
def test_a_sync_node_leaves_no_chunk_it_read_in_the_page_cache(tmp_path: Path, sync: bool) -> None:
    """Each read drops the chunk's pages once it is done (fresh page-cache pages are slow to
    touch on this kind of VM; the same few pages then serve every read), by both reads; a
    node without sync keeps them, as they serve its reads."""
    node = LocalNode(tmp_path / "n", node_id=0, disks=1, sync=sync)
    try:
        data = os.urandom(3 * PAYLOAD_OFFSET + 5)
        run(write(node, 0, "c", data))
        path = node.chunk_path(0, "c")
        assert bytes(run(node.read_chunk(0, "c"))[0]) == data
        after_read = _resident_pages(path)
        buf = bytearray(len(data))
        run(node.read_chunk_into(0, "c", memoryview(buf)))
        assert buf == data
        after_read_into = _resident_pages(path)
        if sync:
            assert after_read == after_read_into == 0
        else:
            assert after_read > 0 and after_read_into > 0
    finally:
        run(node.close())


@pytest.mark.parametrize("refuses", ["open", "write"])
def test_a_file_system_refusing_o_direct_is_written_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuses: str
) -> None:
    """Where O_DIRECT is refused (EINVAL at open, as some file systems do, or at the first
    write), the chunk is written through the page cache instead, and the disk is not asked
    again."""
    import tectonic_emu.chunkstore._local as local_module

    direct_fds: set[int] = set()
    opens: list[int] = []
    real_open, real_pwritev = os.open, os.pwritev

    def fake_open(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECT:
            opens.append(flags)
            if refuses == "open":
                raise OSError(errno.EINVAL, "Invalid argument")
            fd = real_open(path, flags, *args)
            direct_fds.add(fd)
            return fd
        return real_open(path, flags, *args)

    def fake_pwritev(fd: int, bufs: Any, offset: int) -> int:
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwritev(fd, bufs, offset)

    monkeypatch.setattr(local_module.os, "open", fake_open)
    monkeypatch.setattr(local_module.os, "pwritev", fake_pwritev)
    node = LocalNode(tmp_path / "n", node_id=0, disks=1)
    try:
        for k in range(2):
            data = os.urandom(3 * PAYLOAD_OFFSET + 5)
            run(write(node, 0, f"t{k}", data))
            assert bytes(run(node.read_chunk(0, f"t{k}"))[0]) == data
            assert os.path.getsize(node.chunk_path(0, f"t{k}")) == PAYLOAD_OFFSET + len(data)
        assert node._no_direct == {0} and len(opens) == 1  # asked once
    finally:
        run(node.close())


def test_flipped_payload_byte_reads_as_corrupt(local: LocalNode) -> None:
    data = os.urandom(5000)
    run(write(local, 0, "abc", data))
    _flip(local.chunk_path(0, "abc"), PAYLOAD_OFFSET + 4321)
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk(0, "abc"))
    assert run(local.stat_chunk(0, "abc")).stored_len == 5000  # header only: still fine


@pytest.mark.parametrize("offset", range(HEADER_SIZE))
def test_flipped_header_byte_reads_as_corrupt(local: LocalNode, offset: int) -> None:
    run(write(local, 0, "abc", b"some payload"))
    _flip(local.chunk_path(0, "abc"), offset)
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk(0, "abc"))
    with pytest.raises(ChunkCorruptError):
        run(local.stat_chunk(0, "abc"))


@pytest.mark.parametrize(
    "size", [0, 5, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 500, PAYLOAD_OFFSET, -1]
)
def test_truncated_file_reads_as_corrupt(local: LocalNode, size: int) -> None:
    data = os.urandom(1000)
    run(write(local, 0, "abc", data))
    path = local.chunk_path(0, "abc")
    os.truncate(path, size if size >= 0 else PAYLOAD_OFFSET + len(data) - 1)
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk(0, "abc"))
    with pytest.raises(ChunkCorruptError):
        run(local.stat_chunk(0, "abc"))
    # still listed (so garbage collection finds it) and counted
    assert [i.chunk_id for i in run(local.list_chunks(0))] == ["abc"]
    assert run(local.usage())[0].chunks == 1


def test_extra_bytes_and_wrong_name_read_as_corrupt(local: LocalNode) -> None:
    run(write(local, 0, "abc", b"payload"))
    run(write(local, 0, "def", b"payload"))
    with open(local.chunk_path(0, "abc"), "ab") as f:
        f.write(b"\0")
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk(0, "abc"))
    # a valid chunk file under another chunk's name
    os.makedirs(os.path.dirname(local.chunk_path(0, "xyz")), exist_ok=True)
    shutil.copy(local.chunk_path(0, "def"), local.chunk_path(0, "xyz"))
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk(0, "xyz"))


def test_torn_write_reads_as_corrupt_and_blocks_the_id(local: LocalNode) -> None:
    data = os.urandom(10_000)
    run(local.write_torn_chunk(0, "torn", data, crc32c=crc(data), keep=3000))
    assert os.path.getsize(local.chunk_path(0, "torn")) == PAYLOAD_OFFSET + 3000
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk(0, "torn"))
    with pytest.raises(AlreadyExistsError):
        run(write(local, 0, "torn", data))
    run(local.delete_chunk(0, "torn"))
    run(write(local, 0, "torn", data))
    assert bytes(run(local.read_chunk(0, "torn"))[0]) == data


def test_listing_skips_stray_files_and_keeps_unreadable_chunks(local: LocalNode) -> None:
    run(write(local, 0, "good", b"payload"))
    fan = os.path.dirname(local.chunk_path(0, "good"))
    Path(fan, ".tmp-good-123").write_bytes(b"junk")
    Path(fan, "UPPER").write_bytes(b"junk")
    os.mkdir(Path(fan, "subdir"))
    Path(local.root, "d0", "loose-file").write_bytes(b"junk")
    os.makedirs(os.path.dirname(local.chunk_path(0, "garbage")), exist_ok=True)
    Path(local.chunk_path(0, "garbage")).write_bytes(b"x" * 5000)
    infos = {i.chunk_id: i for i in run(local.list_chunks(0))}
    assert set(infos) == {"good", "garbage"}
    assert (infos["garbage"].stored_len, infos["garbage"].crc32c) == (5000 - PAYLOAD_OFFSET, 0)
    usage = run(local.usage())[0]
    assert (usage.chunks, usage.bytes_used) == (2, PAYLOAD_OFFSET + 7 + 5000)


def test_chunks_survive_a_restart(tmp_path: Path) -> None:
    a = LocalNode(tmp_path, 1, 2)
    run(write(a, 1, "keep", b"durable"))
    run(a.close())
    b = LocalNode(tmp_path, 1, 2)
    assert bytes(run(b.read_chunk(1, "keep"))[0]) == b"durable"
    run(b.close())


def test_fan_out_spreads_sequential_ids(local: LocalNode) -> None:
    ids = [f"{i:016x}.0.00000000" for i in range(64)]
    fans = {os.path.basename(os.path.dirname(local.chunk_path(0, c))) for c in ids}
    assert len(fans) > 32


def test_cancelled_write_leaves_no_chunk(local: LocalNode) -> None:
    data = os.urandom(48 << 20)  # several write slices, so cancellation lands midway
    checksum = crc(data)

    async def attempt(cid: str, delay: float) -> bool:
        task = asyncio.create_task(local.write_chunk(0, cid, data, crc32c=checksum))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    cancelled = 0
    delays = [0, 0, 0.001, 0.003, 0.006, 0.01, 0.02, 0.04, 0.08]
    for i, delay in enumerate(delays):
        cid = f"big.{i}"
        if run(attempt(cid, delay)):
            cancelled += 1
            assert not os.path.exists(local.chunk_path(0, cid))
            with pytest.raises(ChunkNotFoundError):
                run(local.read_chunk(0, cid))
        else:  # finished before the cancel: whole and valid
            got, _ = run(local.read_chunk(0, cid))
            assert got == data
    assert cancelled >= 3
    assert run(local.usage())[0].chunks == len(delays) - cancelled


def test_cancelled_queued_write_never_runs(tmp_path: Path) -> None:
    gate = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        node = LocalNode(tmp_path, 0, 1, executor=pool)
        blocker = pool.submit(gate.wait)

        async def go() -> None:
            task = asyncio.create_task(write(node, 0, "queued", b"data"))
            await asyncio.sleep(0.01)
            task.cancel()
            try:  # returns at once: the queued job is dropped, not waited for
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(task, 5)
            finally:
                gate.set()

        run(go())
        blocker.result()
        assert not os.path.exists(node.chunk_path(0, "queued"))
        run(node.close())  # a shared executor is left running
        assert pool.submit(lambda: 1).result() == 1


class InlineExecutor(Executor):
    """Runs each job at submit time: the job is finished before the coroutine is resumed."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        fut: Future[T] = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as e:
            fut.set_exception(e)
        return fut


def test_write_cancelled_after_the_worker_finished_leaves_no_chunk(tmp_path: Path) -> None:
    node = LocalNode(tmp_path, 0, 1, executor=InlineExecutor())

    async def go() -> None:
        task = asyncio.create_task(write(node, 0, "late", b"data"))
        await asyncio.sleep(0)
        assert (await node.stat_chunk(0, "late")).stored_len == 4  # written whole already
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(go())
    assert not os.path.exists(node.chunk_path(0, "late"))
    run(write(node, 0, "late", b"data"))  # the id is free again


def test_chunk_path_answers_while_down(local: LocalNode) -> None:
    local.available = False
    assert local.chunk_path(0, "abc").endswith("/abc")
    with pytest.raises(InvalidArgumentError):
        local.chunk_path(5, "abc")


# -- MemoryNode helpers ------------------------------------------------------------------------
@pytest.mark.parametrize("data", [b"", b"payload"])
def test_memory_corrupt_helper(data: bytes) -> None:
    node = MemoryNode(0, 1)
    run(write(node, 0, "abc", data))
    node.corrupt(0, "abc")
    with pytest.raises(ChunkCorruptError):
        run(node.read_chunk(0, "abc"))


def test_memory_torn_write() -> None:
    node = MemoryNode(0, 1)
    run(node.write_torn_chunk(0, "abc", b"payload", crc32c=crc(b"payload"), keep=3))
    with pytest.raises(ChunkCorruptError):
        run(node.read_chunk(0, "abc"))
    with pytest.raises(ChunkCorruptError):
        run(node.stat_chunk(0, "abc"))


# -- FaultyNode ----------------------------------------------------------------------------------
@pytest.fixture(params=["memory", "local"])
def faulty(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FaultyNode]:
    inner = make_node(request.param, tmp_path / "inner")
    n = FaultyNode(inner)
    yield n
    run(n.close())


def test_injected_write_and_read_failures(faulty: FaultyNode) -> None:
    async def go() -> None:
        faulty.fail_writes = 2
        for _ in range(2):
            with pytest.raises(NodeUnavailableError):
                await write(faulty, 0, "abc", b"data")
        await write(faulty, 0, "abc", b"data")
        faulty.fail_reads = 1
        with pytest.raises(NodeUnavailableError):
            await faulty.read_chunk(0, "abc")
        assert bytes((await faulty.read_chunk(0, "abc"))[0]) == b"data"
        faulty.corrupt_reads = True
        with pytest.raises(ChunkCorruptError):
            await faulty.read_chunk(0, "abc")
        faulty.corrupt_reads = False
        assert faulty.calls["write_chunk"] == 3 and faulty.calls["read_chunk"] == 3
        faulty.available = False
        with pytest.raises(NodeUnavailableError):
            await faulty.stat_chunk(0, "abc")

    run(go())


def test_crash_during_write_leaves_a_corrupt_chunk(faulty: FaultyNode) -> None:
    async def go() -> None:
        faulty.crash_writes = 1
        data = os.urandom(4096)
        with pytest.raises(NodeUnavailableError):
            await write(faulty, 0, "abc", data)
        with pytest.raises(ChunkCorruptError):
            await faulty.read_chunk(0, "abc")
        assert [i.chunk_id for i in await faulty.list_chunks(0)] == ["abc"]

    run(go())


def test_added_latency() -> None:
    node = FaultyNode(MemoryNode(0, 1), latency=0.05)

    async def go() -> float:
        t = time.perf_counter()
        await asyncio.gather(*(write(node, 0, f"c{i}", b"x") for i in range(5)))
        return time.perf_counter() - t

    assert 0.05 <= run(go()) < 0.5


def test_read_chunk_into(node: StorageNode) -> None:
    data = os.urandom(300_000)

    async def go() -> None:
        await write(node, 1, "into", data)
        dest = memoryview(bytearray(len(data)))
        info = await node.read_chunk_into(1, "into", dest)
        assert bytes(dest) == data and info.crc32c == crc(data)
        for size in (len(data) - 1, len(data) + 1):
            other = memoryview(bytearray(b"\x07" * size))
            with pytest.raises(ChunkCorruptError):
                await node.read_chunk_into(1, "into", other)
            assert bytes(other) == b"\x07" * size  # untouched
        with pytest.raises(ChunkNotFoundError):
            await node.read_chunk_into(1, "absent", dest)
        # the connection (if any) still works after the refusals
        assert bytes((await node.read_chunk(1, "into"))[0]) == data

    run(go())


def test_small_ranges_read_from_files_kept_open(local: LocalNode, monkeypatch: Any) -> None:
    """A small range is read from the chunk's file kept open (``_opencache.py``), at most
    ``LIMIT`` of them: a chunk deleted since reads as missing, one truncated as corrupt, a
    byte flipped fails its piece; the node's close closes them all."""
    monkeypatch.setattr(OpenChunks, "LIMIT", 4)

    def fds() -> int:
        """This process's descriptors of the node's files."""
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(local.root))
        return n

    before = fds()
    data = os.urandom(5 * PIECE_SIZE)
    for k in range(6):
        run(write(local, 0, f"k{k}", data))
        assert bytes(run(local.read_chunk_range(0, f"k{k}", 100, 10))[0]) == data[100:110]
    assert fds() == before + 4  # the last four read
    run(local.delete_chunk(0, "k5"))
    with pytest.raises(ChunkNotFoundError):
        run(local.read_chunk_range(0, "k5", 100, 10))
    os.unlink(local.chunk_path(0, "k4"))  # behind the node's back
    with pytest.raises(ChunkNotFoundError):
        run(local.read_chunk_range(0, "k4", 100, 10))
    os.truncate(local.chunk_path(0, "k3"), PAYLOAD_OFFSET + PIECE_SIZE)
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk_range(0, "k3", 3 * PIECE_SIZE, 10))
    _flip(local.chunk_path(0, "k2"), PAYLOAD_OFFSET + 2 * PIECE_SIZE)
    with pytest.raises(ChunkCorruptError):
        run(local.read_chunk_range(0, "k2", 2 * PIECE_SIZE, 10))
    assert bytes(run(local.read_chunk_range(0, "k2", 100, 10))[0]) == data[100:110]
    # A chunk's header and piece table are read once, at open: a range reads its pieces alone.
    assert bytes(run(local.read_chunk_range(0, "k1", 100, 10))[0]) == data[100:110]
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    for at in range(0, 4 * PIECE_SIZE, PIECE_SIZE):
        assert bytes(run(local.read_chunk_range(0, "k1", at, 10))[0]) == data[at : at + 10]
    assert reads == []
    run(local.close())
    assert fds() == before
