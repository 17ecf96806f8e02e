"""Garbage collection fenced against commits (issue 19): a chunk goes only when no committed
block, no live claim of a write in flight and no live write token references it.

- Served, for real: writer processes SIGSTOPped with a block in flight while
  ``repair --gc-grace 0`` runs. The one whose lease is still live loses nothing and finishes;
  the one whose lease ran out is fenced (its in-flight chunks go) and fails loudly on SIGCONT,
  and every byte it had acknowledged reads back.
- In one process: writers, repair and garbage collection at grace 0 interleaved by hypothesis
  over asyncio; a live writer slower than its lease keeps its claim.
- The guards: negative grace, foreign chunk ids, metadata that looks empty.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu import Cluster
from tectonic_emu.chunkstore.faults import FaultyNode
from tectonic_emu.coding import crc32c
from tectonic_emu.config import METADATA_FILE
from tectonic_emu.errors import InvalidArgumentError, MetadataMismatchError
from tectonic_emu.metadata.records import IntentRecord
from tectonic_emu.served import Serving
from tectonic_emu.services import collect_garbage, garbage_pass, repair, scrub

from .conftest import SMALL_BLOCK, make_cluster, run_with
from .served_writer import acknowledged, stream
from .test_cli import fails, ok_json, tecto
from .test_faults import chunks_on_disk, referenced
from .test_served import REPO, make, stream_prefix, until


# -- the guards ------------------------------------------------------------------------------
def test_a_negative_or_nan_grace_is_refused(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r3")

    async def go(c: Cluster) -> None:
        for grace in (-1.0, float("nan")):
            with pytest.raises(InvalidArgumentError, match="gc grace"):
                await collect_garbage(c, grace=grace)
            with pytest.raises(InvalidArgumentError, match="gc grace"):
                await repair(c, gc_grace=grace)
        with pytest.raises(InvalidArgumentError, match="gc grace"):
            await collect_garbage(c, grace="0")  # type: ignore[arg-type]
        for count in (-1, 1.5, True):
            with pytest.raises(InvalidArgumentError, match="i_know"):
                await collect_garbage(c, grace=0, i_know=count)  # type: ignore[arg-type]

    run_with(root, go)
    fails("repair", "--gc-grace", "-1", cluster=root, mentions="negative")
    fails("repair", "--gc-grace=-5s", cluster=root, mentions="negative")
    fails("serve", "--gc-grace=-1", cluster=root, mentions="negative")


def test_chunk_ids_not_of_the_block_format_are_kept_and_counted(tmp_path: Path) -> None:
    """Metadata backups live on the nodes as ``mb-...`` chunks: never garbage collection's."""
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r3")
    payload = b"a metadata backup"

    async def go(c: Cluster) -> None:
        await c.client().write_file("/f", b"x" * 100_000)
        await c.nodes[1].write_chunk(0, "mb-00000001", payload, crc32c=crc32c(payload))
        stale = "00000000000000aa.0.0123abcd"  # block format, referenced by nothing: garbage
        await c.nodes[2].write_chunk(0, stale, payload, crc32c=crc32c(payload))
        report = await garbage_pass(c, grace=0)
        assert report.foreign_kept == 1 and report.deleted == 1
        on_disk = await chunks_on_disk(c)
        assert (1, 0, "mb-00000001") in on_disk and (2, 0, stale) not in on_disk
        assert on_disk - {(1, 0, "mb-00000001")} == await referenced(c)
        assert await c.client().read_file("/f") == b"x" * 100_000

    run_with(root, go)


def forget_everything(root: Path) -> int:
    """Drop every file's records from the metadata, keeping the chunks on the nodes, as a lost
    or foreign database would; returns how many chunks the nodes hold."""

    async def go(c: Cluster) -> int:
        async with c.meta.transaction() as m:
            for e in await m.names.entries(1):
                await m.drop_file(e.id)
                await m.names.unlink(1, e.name)
        return len(await chunks_on_disk(c))

    return run_with(root, go)


def test_gc_refuses_to_delete_when_the_metadata_looks_empty(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=6, encoding="rs-3-3")

    async def put(c: Cluster) -> None:
        for i in range(5):
            await c.client().write_file(f"/f{i}", os.urandom(100_000))

    run_with(root, put)
    held = forget_everything(root)
    assert held >= 5 * 6

    async def go(c: Cluster) -> None:
        with pytest.raises(MetadataMismatchError, match=f"refusing to delete {held} chunks"):
            await collect_garbage(c, grace=0)
        with pytest.raises(MetadataMismatchError, match=f"--i-know {held}"):
            await repair(c, gc_grace=0)
        with pytest.raises(MetadataMismatchError, match=f"not the {held - 1}"):
            await collect_garbage(c, grace=0, i_know=held - 1)
        assert len(await chunks_on_disk(c)) == held  # nothing went

    run_with(root, go)
    line = fails("repair", "--gc-grace", "0", cluster=root, mentions=f"--i-know {held}")
    assert f"0 of {held} chunks on disk are referenced" in line
    fails("repair", "--gc-grace", "0", "--i-know", "3", cluster=root, mentions="not the 3")
    assert run_with(root, chunks_on_disk) and len(run_with(root, chunks_on_disk)) == held
    done = ok_json("repair", "--gc-grace", "0", "--i-know", str(held), cluster=root)
    assert done["garbage_chunks_deleted"] == held
    assert run_with(root, chunks_on_disk) == set()


def test_repair_deletes_nothing_when_the_metadata_file_is_gone(tmp_path: Path) -> None:
    """Issue 19's loss: with ``metadata.db`` deleted, ``repair --gc-grace 0`` deleted every
    chunk. Now it fails (here, or at open once the metadata checks itself) and keeps them."""
    root = make_cluster(tmp_path / "c", nodes=6, encoding="rs-3-3")

    async def put(c: Cluster) -> int:
        for i in range(3):
            await c.client().write_file(f"/f{i}", os.urandom(200_000))
        return len(await chunks_on_disk(c))

    held = run_with(root, put)
    for name in os.listdir(root):
        if name.startswith(METADATA_FILE):
            os.unlink(root / name)
    r = tecto("repair", "--gc-grace", "0", cluster=root)
    assert r.returncode != 0 and b"Traceback" not in r.stderr, r.stderr
    files = [p for p in root.rglob("*") if p.is_file() and p.name.count(".") == 2]
    assert len(files) == held


# -- in one process --------------------------------------------------------------------------
class SlowWrites(FaultyNode):
    """A node whose chunk writes each take ``write_delay`` seconds more (lists do not)."""

    write_delay = 0.0

    async def write_chunk(self, disk: int, chunk_id: str, payload: Any, **kw: Any) -> None:
        await asyncio.sleep(self.write_delay)
        await super().write_chunk(disk, chunk_id, payload, **kw)


def test_a_live_writer_slower_than_its_lease_keeps_its_claim(tmp_path: Path) -> None:
    """Chunk writes that take longer than the lease: the writer renews its claim, and
    collection at grace 0, running all along, takes nothing of it (age alone never decides)."""
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r3")
    data = os.urandom(3 * SMALL_BLOCK + 123)

    async def go(c: Cluster) -> None:
        client = c.client()
        client.write_lease = 1.5
        slow = [SlowWrites(n) for n in c.nodes]
        for n, node in enumerate(slow):
            c.nodes[n] = node
        w = await client.open_writer("/slow")
        for node in slow:
            node.write_delay = 4.0  # each chunk write: more than twice the lease

        async def write() -> None:
            await w.append(data)
            await w.flush()

        flushing = asyncio.create_task(write())
        fenced = deleted = passes = 0
        while not flushing.done():
            report = await garbage_pass(c, grace=0, lease=client.write_lease)
            fenced += report.writers_fenced
            deleted += report.deleted
            passes += 1
            await asyncio.sleep(0.2)
        await flushing
        for node in slow:
            node.write_delay = 0.0
        await w.close()
        assert fenced == 0 and deleted == 0 and passes >= 2
        assert await client.read_file("/slow") == data

    run_with(root, go)


@settings(max_examples=12)
@given(
    st.lists(
        st.lists(st.integers(1, 3 * SMALL_BLOCK), min_size=1, max_size=6), min_size=1, max_size=3
    ),
    st.lists(st.floats(0.0, 0.05), min_size=9, max_size=9),
    st.integers(0, 2**32),
)
def test_gc_and_repair_at_grace_0_racing_writers_lose_nothing(
    writes: list[list[int]], delays: list[float], seed: int
) -> None:
    """Writers append and flush while repair and garbage collection run at grace 0 in a loop
    and a node drops out and comes back; the schedule (piece sizes, write delays, pauses) is
    hypothesis's. Every acknowledged byte reads back, no live writer is fenced, and in the end
    the nodes hold exactly what the metadata references, with no claim left."""
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_cluster(Path(tmp) / "c", nodes=9, encoding="rs-3-3", disks_per_node=1)

        async def go(c: Cluster) -> None:
            faulty = [SlowWrites(n) for n in c.nodes]
            for n, f in enumerate(faulty):
                # Chunk writes of one block end at different times: its first chunks sit
                # on disk, uncommitted, while the collector lists and decides.
                f.write_delay = delays[n]
                c.nodes[n] = f
            client = c.client()
            acked: dict[str, bytes] = {}
            stop = asyncio.Event()

            async def writer(i: int, sizes: list[int]) -> None:
                path = f"/w{i}"
                mine = bytearray()
                async with client.open_writer(path) as w:
                    for size in sizes:
                        piece = rnd.randbytes(size)
                        await w.append(piece)
                        mine += piece
                        await w.flush()
                        acked[path] = bytes(mine)
                        await asyncio.sleep(rnd.random() * 0.003)

            async def upkeep() -> None:
                while not stop.is_set():
                    victim = faulty[rnd.randrange(len(faulty))]
                    victim.available = rnd.random() < 0.7
                    await repair(c, gc_grace=0)
                    victim.available = True
                    report = await garbage_pass(c, grace=0)
                    assert report.writers_fenced == 0
                    await asyncio.sleep(rnd.random() * 0.003)

            keeper = asyncio.create_task(upkeep())
            try:
                await asyncio.gather(*(writer(i, s) for i, s in enumerate(writes)))
            finally:
                stop.set()
                await keeper
            for path, data in acked.items():
                assert await client.read_file(path) == data
            await repair(c, gc_grace=0)
            await collect_garbage(c, grace=0)
            assert [i async for i in c.meta.iter_intents()] == []
            assert await chunks_on_disk(c) == await referenced(c)
            assert (await scrub(c)).clean

        run_with(root, go)


# -- served, for real: SIGSTOP -----------------------------------------------------------------
def metadata_is_free(root: Path) -> bool:
    """Whether nobody holds the metadata file's lease or write lock: a process stopped
    inside a transaction would hold the lease, and lose it (``test_sqlite_lease.py``); this
    test is about the collector, not about that."""
    con = sqlite3.connect(root / METADATA_FILE, timeout=0.2)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.rollback()
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()
    record = root / f"{METADATA_FILE}-lease"  # 16-byte token first, zeros when free
    return not record.exists() or not any(record.read_bytes()[:16])


def claim_in_flight(root: Path, path: str) -> tuple[IntentRecord, set[tuple[int, int, str]]] | None:
    """The claim of the file at ``path``'s writer on a block whose chunks are on the nodes
    and not committed, with those chunks; None if there is none."""

    async def go(c: Cluster) -> Any:
        file_id = (await c.client().stat(path)).id
        for intent in [i async for i in c.meta.iter_intents()]:
            if intent.file_id != file_id:
                continue
            prefix = f"{intent.block_id:016x}."
            chunks = {ch for ch in await chunks_on_disk(c) if ch[2].startswith(prefix)}
            if chunks and await c.meta.block(intent.block_id) is None:
                return intent, chunks
        return None

    return run_with(root, go)


def stopped(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "T"


def pause_in_flight(
    root: Path, proc: subprocess.Popen[bytes], path: str
) -> tuple[IntentRecord, set[tuple[int, int, str]]]:
    """SIGSTOP the writer at a moment it has a block in flight (chunks on the nodes, not
    committed) and holds no metadata transaction; returns its claim and those chunks."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        os.kill(proc.pid, signal.SIGSTOP)
        until(lambda: stopped(proc.pid), "the writer stopped", 10)
        time.sleep(0.1)  # chunk writes it had sent settle on the nodes
        if metadata_is_free(root) and (found := claim_in_flight(root, path)) is not None:
            return found
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(random.random() * 0.05)
    raise AssertionError(f"never caught the writer of {path} with a block in flight")


def test_paused_writers_lose_no_acknowledged_byte_to_repair_at_grace_0(tmp_path: Path) -> None:
    """Two writer processes are SIGSTOPped with a block in flight; ``repair --gc-grace 0``
    runs once one's lease has run out. The one still within its lease keeps its in-flight
    chunks, resumes and seals everything it wrote. The other is fenced: its in-flight chunks
    are deleted, it fails loudly on SIGCONT (exit 1, FencedWriterError), and every byte it
    acknowledged reads back."""
    root = make(tmp_path / "c", nodes=9, encoding="rs-6-3", sync=True)
    stop = tmp_path / "stop"
    progress = {"live": tmp_path / "live", "fenced": tmp_path / "fenced"}
    lease = {"live": 300.0, "fenced": 1.0}
    with Serving(root, repair_interval=0):
        procs = {}
        try:
            for seed, name in enumerate(("live", "fenced"), start=1):
                cmd = [sys.executable, "-m", "tests.gc_writer", str(root), f"/{name}", str(seed)]
                cmd += [str(progress[name]), "--lease", str(lease[name]), "--stop", str(stop)]
                procs[name] = subprocess.Popen(
                    cmd, cwd=REPO, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            until(lambda: all(acknowledged(p)[0] >= 3 for p in progress.values()), "flushes")
            live_claim, live_chunks = pause_in_flight(root, procs["live"], "/live")
            fenced_claim, fenced_chunks = pause_in_flight(root, procs["fenced"], "/fenced")
            acked = {name: acknowledged(p) for name, p in progress.items()}
            until(lambda: time.time() > fenced_claim.expires + 0.2, "the lease ran out", 30)
            assert time.time() < live_claim.expires  # the other's still holds

            report = ok_json("repair", "--gc-grace", "0", cluster=root)
            assert report["writers_fenced"] == 1, report
            on_disk = run_with(root, chunks_on_disk)
            assert live_chunks <= on_disk  # in flight, live: kept
            assert not fenced_chunks & on_disk  # in flight, fenced: collected

            for proc in procs.values():
                os.kill(proc.pid, signal.SIGCONT)
            stop.touch()
            assert procs["live"].wait(120) == 0
            assert procs["fenced"].wait(120) == 1
            assert procs["fenced"].stderr is not None
            err = procs["fenced"].stderr.read().decode()
            assert "FencedWriterError" in err and "garbage collection fenced" in err, err
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                proc.wait()

        records, size, closed = acknowledged(progress["live"])
        assert closed and size >= acked["live"][1]

        async def check(c: Cluster) -> None:
            client = c.client()
            assert await client.read_file("/live") == stream(1, records)
            st_fenced = await client.stat("/fenced")
            assert not st_fenced.sealed and st_fenced.size >= acked["fenced"][1]
            assert await client.read_file("/fenced") == stream_prefix(2, st_fenced.size)
            assert not acknowledged(progress["fenced"])[2]  # it never claimed to close
            # The fenced file is a crashed writer's: a new writer takes it over.
            w = await client.open_writer("/fenced")
            assert w.offset == st_fenced.size
            await w.close()

        run_with(root, check)
        assert (ok_json("scrub", cluster=root))["clean"]
