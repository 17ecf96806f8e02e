"""Faults made for real on the cluster's files on disk, and what read, scrub and repair do.

Damage is done to chunk files (flipped bytes, deletions, truncation), to nodes (stopped, or
wrapped in ``FaultyNode``), and to writers (cancelled, abandoned, killed with SIGKILL). The
rules checked: a read returns the exact bytes or raises ``DataUnavailableError``, never wrong
bytes; scrub names exactly the damaged chunks; repair rebuilds them elsewhere and collects
what is left over; a crash loses nothing that was committed.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu import (
    BlockLayout,
    Cluster,
    ClusterConfig,
    DataUnavailableError,
    Encoding,
    NotEnoughNodesError,
    clock,
)
from tectonic_emu.chunkstore import FaultyNode
from tectonic_emu.chunkstore._format import (
    HEADER_SIZE,
    PAYLOAD_OFFSET,
    decode_chunk,
    encode_chunk,
)
from tectonic_emu.coding import crc32c
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.services import collect_garbage, repair, scrub
from tectonic_emu.services.scrub import ScrubReport

from .conftest import SMALL_BLOCK, flip, make_cluster, run_with

BLOCK = 16 << 10  # the clusters' block size: the size of every chunk


def block_of(encoding: str) -> int:
    """Bytes per block of an ``encoding`` file: ``BLOCK`` replicated, D x ``BLOCK`` for RS."""
    return ClusterConfig(block_size=BLOCK).block_size_for(Encoding.parse(encoding))


RS_BLOCK = block_of("rs-6-3")  # the clusters' default encoding
# Per encoding: three blocks, the last one short.
DATA = {e: os.urandom(2 * block_of(e) + 5000) for e in ("r1", "r3", "rs-3-3", "rs-6-3")}

Damage = Literal["flip", "delete", "truncate"]


def make(root: Path, *, nodes: int = 9) -> Path:
    Cluster.create(root, nodes=nodes, encoding="rs-6-3", block_size=BLOCK, sync=False)
    return root


def damage(path: str, how: Damage, *, at: int = 1) -> None:
    """Damage one chunk file: flip a payload byte ``at`` bytes from its end, delete it, or
    truncate it to half its length (a torn write)."""
    size = os.path.getsize(path)
    if how == "flip":
        flip(path, size - min(at, size - PAYLOAD_OFFSET))
    elif how == "delete":
        os.unlink(path)
    else:
        os.truncate(path, size // 2)


def rewrite_consistently(path: str, chunk_id: str) -> None:
    """Replace a chunk's payload with other bytes under a header that matches them: the node
    sees a valid chunk; only the Block layer's checksum (end to end) can tell."""
    with open(path, "rb") as f:
        header, payload = decode_chunk(f.read(), chunk_id)
    wrong = bytes([payload[0] ^ 1]) + payload[1:]
    with open(path, "wb") as f:
        f.write(encode_chunk(chunk_id, wrong, crc32c(wrong), header.flags))


def swap(a: str, b: str) -> None:
    tmp = a + ".swap"
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def chunk_path(block: BlockLayout, index: int) -> str:
    (path,) = [p for c, p in zip(block.chunks, block.chunk_paths, strict=True) if c.index == index]
    assert path is not None
    return path


def gone(path: str) -> bool:
    return not os.path.exists(path)


def problems(report: ScrubReport) -> dict[str, set[str]]:
    return {
        "corrupt": {p.chunk_id for p in report.corrupt},
        "missing": {p.chunk_id for p in report.missing},
        "unavailable": {p.chunk_id for p in report.unavailable},
    }


async def chunks_on_disk(c: Cluster) -> set[tuple[int, int, str]]:
    """(node, disk, chunk id) of every chunk file on the live nodes."""
    return {
        (node.node_id, disk, info.chunk_id)
        for node in c.nodes
        if node.available
        for disk in range(node.disks)
        for info in await node.list_chunks(disk)
    }


async def referenced(cl: Cluster) -> set[tuple[int, int, str]]:
    """(node, disk, chunk id) of every chunk the Block layer references."""
    return {(c.node, c.disk, c.chunk_id) async for rec in cl.meta.iter_blocks() for c in rec.chunks}


def distinct_nodes(block: BlockLayout) -> bool:
    nodes = [ch.node for ch in block.chunks]
    return len(nodes) == len(set(nodes))


# -- one damaged chunk: every encoding, every kind of damage ---------------------------------
@pytest.mark.parametrize("how", ["flip", "delete", "truncate"])
@pytest.mark.parametrize("encoding", ["r1", "r3", "rs-3-3", "rs-6-3"])
def test_damaged_chunk_is_caught_reported_and_repaired(
    tmp_path: Path, encoding: str, how: Damage
) -> None:
    root = make(tmp_path / "c")
    field = "missing" if how == "delete" else "corrupt"
    data, bs = DATA[encoding], block_of(encoding)

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", data, encoding=encoding)
        await client.write_file("/other", data[:100], encoding=encoding)
        before = await client.layout("/f")
        victim = before[1].chunks[0]  # block 1, chunk 0: a data chunk for RS
        damage(chunk_path(before[1], victim.index), how)

        if encoding == "r1":
            with pytest.raises(DataUnavailableError):
                await client.read_file("/f")
            # A small read needs its pieces alone: the flipped byte is the chunk's last.
            with pytest.raises(DataUnavailableError):
                await client.read("/f", 2 * bs - 10, 10)
            if how == "flip":
                assert await client.read("/f", bs + 10, 10) == data[bs + 10 : bs + 20]
            else:
                with pytest.raises(DataUnavailableError):
                    await client.read("/f", bs + 10, 10)
        else:
            for _ in range(3):  # replicas are read in random order: try a few
                assert await client.read_file("/f") == data
            assert await client.read("/f", bs - 3, 10) == data[bs - 3 : bs + 7]
        assert await client.read("/f", 0, bs) == data[:bs]  # other blocks unaffected

        report = await scrub(c)
        assert problems(report) == {
            "corrupt": set(),
            "missing": set(),
            "unavailable": set(),
            field: {victim.chunk_id},
        }
        (p,) = getattr(report, field)
        assert (p.block_id, p.index, p.node, p.disk) == (
            f"{before[1].block_id:016x}",
            victim.index,
            victim.node,
            victim.disk,
        )
        assert report.blocks == 4

        fixed = await repair(c, gc_grace=0)
        if encoding == "r1":  # no other copy: nothing to rebuild from
            assert fixed.unrecoverable == [f"{before[1].block_id:016x}"]
            assert fixed.blocks_repaired == 0
            with pytest.raises(DataUnavailableError):
                await client.read_file("/f")
            return
        assert (fixed.blocks_repaired, fixed.chunks_rebuilt, fixed.unrecoverable) == (1, 1, [])
        assert (await scrub(c)).clean
        after = await client.layout("/f")
        assert after[0] == before[0] and after[2] == before[2]
        new = [ch for ch in after[1].chunks if ch.index == victim.index]
        assert len(new) == 1 and new[0].chunk_id != victim.chunk_id
        assert gone(chunk_path(before[1], victim.index))  # the bad file was deleted
        assert distinct_nodes(after[1])
        assert await client.read_file("/f") == data
        assert await client.read_file("/other") == data[:100]
        assert await chunks_on_disk(c) == await referenced(c)
        assert (await c.status()).blocks_below_redundancy == 0

    run_with(root, go)


def test_flipped_header_byte_is_corruption_too(tmp_path: Path) -> None:
    root = make(tmp_path / "c")

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", DATA["r3"], encoding="r3")
        (block, *_) = await client.layout("/f")
        flip(chunk_path(block, 0), 5)  # in the version field
        flip(chunk_path(block, 1), HEADER_SIZE - 1)  # in the header's checksum
        for _ in range(3):
            assert await client.read("/f", 0, BLOCK) == DATA["r3"][:BLOCK]
        assert problems(await scrub(c))["corrupt"] == {ch.chunk_id for ch in block.chunks[:2]}
        await repair(c, gc_grace=0)
        assert (await scrub(c)).clean

    run_with(root, go)


# -- Reed-Solomon at and past its tolerance --------------------------------------------------
def test_rs_6_3_repairs_three_damaged_chunks_per_block_but_not_four(tmp_path: Path) -> None:
    root = make(tmp_path / "c")
    bs = RS_BLOCK
    data = os.urandom(4 * bs)
    # per block: (chunk index, damage); data chunks, parity chunks, and a mix
    plan: list[list[tuple[int, Damage]]] = [
        [(0, "flip"), (1, "delete"), (2, "truncate")],
        [(6, "truncate"), (7, "flip"), (8, "delete")],
        [(0, "delete"), (5, "flip"), (8, "truncate")],
        [(1, "flip"), (3, "delete"), (4, "truncate"), (7, "flip")],  # one too many
    ]

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", data)
        layout = await client.layout("/f")
        for block, hits in zip(layout, plan, strict=True):
            for index, how in hits:
                damage(chunk_path(block, index), how)
        for b in range(3):
            assert await client.read("/f", b * bs, bs) == data[b * bs : (b + 1) * bs]
        # Block 3 lost four chunks. What needs bytes of a column with only five good chunks
        # raises, never wrong bytes: the last byte of chunk 1 (flipped there, as chunk 7's,
        # chunk 3 gone, chunk 4 torn), and the whole file...
        chunk = bs // 6
        for offset, size in ((3 * bs + 2 * chunk - 1, 1), (0, -1)):
            with pytest.raises(DataUnavailableError):
                await client.read("/f", offset, size)
        # ...while a small range whose columns have six good pieces is served: from data
        # chunks read directly (0; 1 where it is intact), or decoded from the same bytes of
        # six others (lost chunk 3's first bytes); and a large one inside intact chunk 0.
        for offset, size in (
            (3 * bs, 1),
            (3 * bs - 1, 2),
            (3 * bs + 5, chunk - 5),
            (3 * bs + chunk, 1),
            (3 * bs + 3 * chunk - 1, 2),
        ):
            assert await client.read("/f", offset, size) == data[offset : offset + size]

        report = await scrub(c)
        assert len(report.corrupt) == 9 and len(report.missing) == 4 and not report.unavailable

        fixed = await repair(c, gc_grace=0)
        assert fixed.unrecoverable == [f"{layout[3].block_id:016x}"]
        assert (fixed.blocks_repaired, fixed.chunks_rebuilt) == (3, 9)
        assert await client.read("/f", 0, 3 * bs) == data[: 3 * bs]
        with pytest.raises(DataUnavailableError):
            await client.read_file("/f")
        report = await scrub(c)  # only the lost block's four chunks remain bad
        assert len(report.corrupt) + len(report.missing) == 4

    run_with(root, go)


kinds = st.sampled_from(["flip", "delete", "truncate", "node down"])


@settings(max_examples=25)
@given(
    encoding=st.sampled_from(["r3", "rs-3-3", "rs-6-3"]),
    order=st.permutations(range(9)),
    how=st.lists(kinds, min_size=4, max_size=4),
    at=st.integers(1, 200),
    compressible=st.booleans(),
)
def test_reads_return_exact_bytes_or_raise(
    encoding: str, order: list[int], how: list[str], at: int, compressible: bool
) -> None:
    """Up to the encoding's tolerance of chunks lost, in any way: exact bytes. One more: an
    error, never wrong bytes."""
    enc = Encoding.parse(encoding)
    size = block_of(encoding) - 7  # one block, nearly full
    line = b"%d tokens/s\n" % at
    data = (line * (size // len(line) + 1))[:size] if compressible else os.urandom(size)
    hits = [i for i in order if i < enc.width][: enc.tolerance + 1]

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", data, encoding=encoding)
        (block,) = await client.layout("/f")
        assert any(ch.flags for ch in block.chunks) == compressible
        for index, kind in zip(hits, how, strict=False):
            assert await client.read_file("/f") == data
            if kind == "node down":
                (ch,) = [ch for ch in block.chunks if ch.index == index]
                c.stop_node(ch.node)
            else:
                damage(chunk_path(block, index), kind, at=at)  # type: ignore[arg-type]
        with pytest.raises(DataUnavailableError):
            await client.read_file("/f")

    with tempfile.TemporaryDirectory() as tmp:
        run_with(make(Path(tmp) / "c"), go)


@pytest.mark.parametrize("encoding", ["r1", "r3", "rs-6-3"])
def test_end_to_end_checksum_catches_what_the_node_cannot(tmp_path: Path, encoding: str) -> None:
    root = make(tmp_path / "c")

    async def go(c: Cluster) -> None:
        client = c.client()
        data, bs = DATA[encoding], block_of(encoding)
        await client.write_file("/f", data, encoding=encoding)
        (block, *_) = await client.layout("/f")
        victim = block.chunks[0]
        rewrite_consistently(chunk_path(block, 0), victim.chunk_id)
        await c.nodes[victim.node].read_chunk(victim.disk, victim.chunk_id)  # valid to the node
        if encoding == "r1":
            with pytest.raises(DataUnavailableError):
                await client.read("/f", 0, 10)
        else:
            for _ in range(3):
                assert await client.read("/f", 0, bs) == data[:bs]
        assert problems(await scrub(c))["corrupt"] == {victim.chunk_id}

    run_with(root, go)


def test_chunk_file_under_another_chunks_name_is_corrupt(tmp_path: Path) -> None:
    """Two chunk files swapped (a misdirected write, a bad restore): both fail their header's
    id check, even though each is an intact chunk."""
    root = make(tmp_path / "c")

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", DATA["rs-6-3"])
        (block, *_) = await client.layout("/f")
        a, b = chunk_path(block, 0), chunk_path(block, 1)
        swap(a, b)
        assert await client.read_file("/f") == DATA["rs-6-3"]
        corrupt = problems(await scrub(c))["corrupt"]
        assert corrupt == {block.chunks[0].chunk_id, block.chunks[1].chunk_id}
        first = await repair(c, gc_grace=0)
        assert (first.blocks_repaired, first.chunks_rebuilt) == (1, 2)
        again = await repair(c, gc_grace=0)  # idempotent: nothing left to do
        assert (again.blocks_repaired, again.garbage_chunks_deleted) == (0, 0)
        assert (await scrub(c)).clean
        assert await client.read_file("/f") == DATA["rs-6-3"]

    run_with(root, go)


# -- a node out of service -------------------------------------------------------------------
def test_stopped_node_is_reported_repaired_around_and_collected_on_return(tmp_path: Path) -> None:
    # 12 nodes: an rs-6-3 block (9 chunks) finds a spare node for the chunk it lost.
    root = make(tmp_path / "c", nodes=12)
    encodings = ["rs-6-3", "r3", "rs-3-3", "rs-6-3"]
    files = {f"/f{i}": os.urandom(block_of(e) * (i + 1) + i) for i, e in enumerate(encodings)}

    async def go(c: Cluster) -> None:
        client = c.client()
        for (path, data), enc in zip(files.items(), encodings, strict=True):
            await client.write_file(path, data, encoding=enc)
        layouts = {p: await client.layout(p) for p in files}
        counts: dict[int, int] = {}
        for blocks in layouts.values():
            for b in blocks:
                for ch in b.chunks:
                    counts[ch.node] = counts.get(ch.node, 0) + 1
        down = max(counts, key=lambda n: counts[n])
        on_down = {
            ch.chunk_id for bl in layouts.values() for b in bl for ch in b.chunks if ch.node == down
        }
        c.stop_node(down)

        report = await scrub(c)
        assert problems(report) == {"corrupt": set(), "missing": set(), "unavailable": on_down}
        assert all(p.node == down for p in report.unavailable)
        for path, data in files.items():
            assert await client.read_file(path) == data
        assert (await c.status()).blocks_below_redundancy == sum(
            any(ch.node == down for ch in b.chunks) for bl in layouts.values() for b in bl
        )

        fixed = await repair(c, gc_grace=0)
        assert fixed.chunks_rebuilt == len(on_down) and not fixed.not_enough_nodes
        status = await c.status()
        assert status.blocks_below_redundancy == 0
        assert not status.nodes[down].up
        assert (await scrub(c)).clean  # nothing references the stopped node any more
        for path, data in files.items():
            assert await client.read_file(path) == data
            assert all(distinct_nodes(b) for b in await client.layout(path))

        c.start_node(down)
        node = c.nodes[down]
        stale = {i.chunk_id for d in range(node.disks) for i in await node.list_chunks(d)}
        assert stale == on_down
        fixed = await repair(c, gc_grace=0)
        assert fixed.garbage_chunks_deleted == len(on_down)
        assert [await node.list_chunks(d) for d in range(node.disks)] == [[], []]
        assert await chunks_on_disk(c) == await referenced(c)
        for path, data in files.items():
            assert await client.read_file(path) == data

    run_with(root, go)


def test_rs_6_3_on_nine_nodes_cannot_regain_redundancy_with_one_down(tmp_path: Path) -> None:
    """Nine chunks need nine nodes: with one down, repair reports the block, reads still work."""
    root = make(tmp_path / "c")

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", DATA["rs-6-3"])  # three blocks
        c.stop_node(0)
        fixed = await repair(c, gc_grace=0)
        assert len(fixed.not_enough_nodes) == 3 and fixed.unrecoverable == []
        assert (await c.status()).blocks_below_redundancy == 3
        assert await client.read_file("/f") == DATA["rs-6-3"]

    run_with(root, go)


# -- crashed writers -------------------------------------------------------------------------
def check_after_crash(
    root: Path, sealed: dict[str, bytes], stream: bytes, at_least: int, *, exact: bool = False
) -> int:
    """Reopen: sealed files intact, the stream's durable prefix readable and takeable, and the
    crash's garbage collected without touching anything referenced. Returns the garbage count."""

    async def go(c: Cluster) -> int:
        client = c.client()
        for path, data in sealed.items():
            assert await client.read_file(path) == data
        got = await client.read_file("/stream")
        assert len(got) >= at_least and stream.startswith(got)
        if exact:
            assert len(got) == at_least
        assert not (await client.stat("/stream")).sealed
        w = await client.open_writer("/stream")
        assert w.offset == len(got)
        await w.append(b"after the crash")
        await w.close()
        assert await client.read_file("/stream") == got + b"after the crash"
        refs = await referenced(c)
        assert refs <= await chunks_on_disk(c)  # nothing committed was lost
        garbage = await collect_garbage(c, grace=0)
        assert await chunks_on_disk(c) == refs
        assert (await scrub(c)).clean
        return garbage

    return run_with(root, go)


def write_sealed(root: Path) -> dict[str, bytes]:
    sealed = {"/a": os.urandom(3 * RS_BLOCK), "/b": b"small", "/c": os.urandom(RS_BLOCK)}

    async def go(c: Cluster) -> None:
        for path, data in sealed.items():
            await c.client().write_file(path, data, encoding="r3" if path == "/b" else None)

    run_with(root, go)
    return sealed


def test_writer_cancelled_mid_append(tmp_path: Path) -> None:
    root = make(tmp_path / "c")
    sealed = write_sealed(root)
    head, big = os.urandom(RS_BLOCK + 99), os.urandom(64 * RS_BLOCK)

    async def go(c: Cluster) -> None:
        client = c.client()
        w = await client.open_writer("/stream")
        await w.append(head)
        await w.flush()
        task = asyncio.create_task(w.append(big))
        for _ in range(10_000):  # until two blocks of it are committed
            if (await client.stat("/stream")).size >= len(head) + 2 * RS_BLOCK:
                break
            await asyncio.sleep(0.001)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        got = await client.read_file("/stream")
        assert (len(got) - len(head)) % RS_BLOCK == 0  # whole blocks after the flush point

    run_with(root, go)
    check_after_crash(root, sealed, head + big, len(head) + 2 * RS_BLOCK)


def test_cluster_closed_under_an_open_writer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer's blocks in flight fail as the cluster closes; nothing committed is lost,
    and their errors, which nobody is left to take, are not logged as never retrieved when
    their tasks are collected (errors.retrieved: such a log once broke a later test)."""
    root = make(tmp_path / "c")
    sealed = write_sealed(root)
    head, big = os.urandom(2 * RS_BLOCK + 1), os.urandom(12 * RS_BLOCK + 5)

    async def go(c: Cluster) -> None:
        client = c.client()
        w = await client.open_writer("/stream")
        await w.append(head)
        await w.flush()
        await w.append(big)  # blocks in flight, a tail in the buffer, no flush, no close
        # Chunks written but never committed, as a crash between the two leaves them.
        for _ in range(3):
            await c.datapath.write_block(
                Encoding.parse("rs-6-3"), os.urandom(RS_BLOCK), block_id=12345, file_id=w.file_id
            )

    run_with(root, go)
    gc.collect()
    assert "never retrieved" not in caplog.text
    assert check_after_crash(root, sealed, head + big, len(head)) >= 3 * 9


CHILD = textwrap.dedent(
    """
    import asyncio, random, sys
    from tectonic_emu import Cluster
    from tectonic_emu.chunkstore import FaultyNode

    async def main():
        root, piece, pieces = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        rnd = random.Random(7)
        async with Cluster.open(root) as c:
            slow = c.nodes[0] = FaultyNode(c.nodes[0])
            w = await c.client().open_writer("/stream")
            for n in range(pieces + 1):
                if n == pieces:
                    slow.latency = 600  # node 0 stalls: the next blocks never commit
                    print("stall", flush=True)
                await w.append(rnd.randbytes(piece))
                await w.flush()
                print((n + 1) * piece, flush=True)

    asyncio.run(main())
    """
)


def chunk_files(root: Path) -> int:
    return sum(1 for _ in root.glob("nodes/*/d*/*/*"))


def test_writer_process_killed_mid_block(tmp_path: Path) -> None:
    """SIGKILL a writer process while a block's chunks are on disk but not yet committed:
    nothing runs its cleanup, so those chunks stay behind as garbage."""
    root = make(tmp_path / "c")
    sealed = write_sealed(root)
    piece, pieces = 2 * RS_BLOCK + 77, 3
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(piece), str(pieces)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    try:
        assert proc.stdout is not None
        flushed = 0
        for line in proc.stdout:
            if line.strip() == "stall":
                break
            flushed = int(line)
        before = chunk_files(root)
        deadline = time.monotonic() + 60  # (a bound on the wait, not a timing assertion)
        while time.monotonic() < deadline:  # until the other eight chunks of a block are written
            if chunk_files(root) >= before + 8:
                break
            time.sleep(0.005)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert flushed == pieces * piece and chunk_files(root) >= before + 8
    rnd = random.Random(7)
    stream = b"".join(rnd.randbytes(piece) for _ in range(pieces + 1))
    garbage = check_after_crash(root, sealed, stream, flushed, exact=True)
    assert garbage >= 8


# -- chunk writes failing on one node --------------------------------------------------------
async def write_until_tried(
    c: Cluster, faulty: FaultyNode, encoding: str, check: Callable[[str], Awaitable[None]]
) -> None:
    """Write files until the faulty node was asked for a chunk at least once."""
    for i in range(50):
        path = f"/{encoding}-{i}"
        await c.client().write_file(path, DATA[encoding], encoding=encoding)
        await check(path)
        if faulty.calls["write_chunk"]:
            return
    raise AssertionError("the faulty node was never picked")


@pytest.mark.parametrize("encoding", ["r3", "rs-3-3", "rs-6-3"])
def test_chunk_write_failing_on_one_node_goes_elsewhere(tmp_path: Path, encoding: str) -> None:
    root = make(tmp_path / "c", nodes=12)

    async def go(c: Cluster) -> None:
        assert c.datapath.nodes is c.nodes
        faulty = FaultyNode(c.nodes[4])
        faulty.fail_writes = 1_000_000
        c.nodes[4] = faulty
        client = c.client()

        async def check(path: str) -> None:
            assert await client.read_file(path) == DATA[encoding]
            for b in await client.layout(path):
                assert distinct_nodes(b) and 4 not in {ch.node for ch in b.chunks}
                assert len(b.chunks) == Encoding.parse(encoding).width

        await write_until_tried(c, faulty, encoding, check)
        assert (await c.status()).blocks_below_redundancy == 0

    run_with(root, go)


def test_chunk_write_torn_on_one_node_leaves_only_garbage(tmp_path: Path) -> None:
    root = make(tmp_path / "c", nodes=12)

    async def go(c: Cluster) -> None:
        faulty = FaultyNode(c.nodes[7])
        faulty.crash_writes = 1
        c.nodes[7] = faulty
        client = c.client()

        async def check(path: str) -> None:
            assert await client.read_file(path) == DATA["rs-6-3"]

        await write_until_tried(c, faulty, "rs-6-3", check)
        assert faulty.crash_writes == 0
        torn = await chunks_on_disk(c) - await referenced(c)
        assert len(torn) == 1  # the half-written chunk, on node 7
        ((node, _, chunk_id),) = torn
        assert node == 7
        # Retried on another node under a new id (block id, index, then a random part).
        same_chunk = chunk_id.rsplit(".", 1)[0] + "."
        (retried,) = [(n, ch) for n, _, ch in await referenced(c) if ch.startswith(same_chunk)]
        assert retried[0] != 7 and retried[1] != chunk_id
        assert (await scrub(c)).clean
        assert await collect_garbage(c, grace=0) == 1
        assert await chunks_on_disk(c) == await referenced(c)

    run_with(root, go)


def test_chunk_write_failure_on_a_cluster_as_wide_as_the_encoding(tmp_path: Path) -> None:
    root = make(tmp_path / "c", nodes=9)

    async def go(c: Cluster) -> None:
        faulty = FaultyNode(c.nodes[4])
        faulty.fail_writes = 1
        c.nodes[4] = faulty
        try:
            await c.client().write_file("/f", DATA["rs-6-3"], encoding="rs-6-3")
        except NotEnoughNodesError as e:
            pytest.fail(f"one failed chunk write failed the file write: {e}")
        assert faulty.calls["write_chunk"] >= 1  # nine chunks, nine nodes: node 4 was tried
        assert await c.client().read_file("/f") == DATA["rs-6-3"]
        # The failed chunk went to a second disk of a node the block uses: below redundancy
        # until repair moves it to a node of its own.
        assert (await c.status()).blocks_below_redundancy == 1
        fixed = await repair(c, gc_grace=0)
        assert (fixed.blocks_repaired, fixed.not_enough_nodes) == (1, [])
        assert (await c.status()).blocks_below_redundancy == 0
        assert all(distinct_nodes(b) for b in await c.client().layout("/f"))
        assert await c.client().read_file("/f") == DATA["rs-6-3"]

    run_with(root, go)


def test_an_embedded_node_slowed_by_30_s_stalls_neither_quorum_writes_nor_reads(
    tmp_path: Path,
) -> None:
    """``Cluster.set_node_delay`` on an embedded node (a ``LocalNode``), in virtual time over
    the real nodes' I/O: each of its calls waits 30 s first. RS(6,3) on nine nodes puts a
    chunk of every block there; writes at quorum are acknowledged by the other eight, and
    reads race its chunks against parity, so neither waits the 30 s; a call to it does."""
    root = make_cluster(tmp_path / "c", nodes=9, encoding="rs-6-3", disks_per_node=1)
    data = os.urandom(4 * SMALL_BLOCK * 6)

    async def main() -> None:
        async with Cluster.open(root, write_ack="quorum") as c:
            client = c.client()
            await c.set_node_delay(0, 30.0)
            t0 = clock.monotonic()
            await client.write_file("/f", data)
            assert await client.read_file("/f") == data
            assert clock.monotonic() - t0 < 30
            t0 = clock.monotonic()
            await c.nodes[0].usage()
            assert clock.monotonic() - t0 >= 30
            for bad in (-1.0, float("nan"), 3601.0):
                with pytest.raises(InvalidArgumentError, match="delay must be"):
                    await c.set_node_delay(0, bad)
            await c.set_node_delay(0, 0.0)
            t0 = clock.monotonic()
            await c.nodes[0].usage()
            assert clock.monotonic() - t0 < 1

    clock.run_virtual(main())
