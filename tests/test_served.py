"""Served mode for real: node processes behind TCP ports, client processes, SIGKILL.

Each test runs ``tectonic-emu serve`` as a child process (``Serving``); the test process and
the writer processes it starts (``served_writer.py``) open the cluster as any client would.
Nodes are killed with SIGKILL (nothing of theirs runs afterwards) and started again through
the supervisor. The rules checked: an acknowledged byte is never lost and reads back exactly;
writers carry on through a node's death; repair brings every block back to full redundancy;
a chunk torn by a kill never reads as valid; a slow node holds up neither writes nor reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tectonic_emu import Cluster, ClusterConfig, DataUnavailableError, Encoding
from tectonic_emu.chunkstore import LocalNode
from tectonic_emu.chunkstore._local import fan_out
from tectonic_emu.coding import crc32c
from tectonic_emu.datapath import DEFAULT_HEDGE_AFTER
from tectonic_emu.errors import ChunkCorruptError
from tectonic_emu.served import (
    ADDRESS_FILE,
    SERVE_FILE,
    Serving,
    control,
    node_dir,
    pid_alive,
    read_address,
)
from tectonic_emu.services import repair, scrub

from .conftest import SMALL_BLOCK, run_with
from .served_writer import acknowledged, record, stream
from .test_cli import fails, ok, ok_json, tecto

REPO = Path(__file__).parent.parent  # where ``python -m tests.served_writer`` runs
RS_BLOCK = ClusterConfig(block_size=SMALL_BLOCK).block_size_for(Encoding.parse("rs-6-3"))


def make(root: Path, *, nodes: int, encoding: str, sync: bool = False) -> Path:
    Cluster.create(root, nodes=nodes, encoding=encoding, block_size=SMALL_BLOCK, sync=sync)
    return root


def stream_prefix(seed: int, nbytes: int) -> bytes:
    """The first ``nbytes`` a writer of ``seed`` appends."""
    out = bytearray()
    k = 0
    while len(out) < nbytes:
        out += record(seed, k)
        k += 1
    return bytes(out[:nbytes])


def until(done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


def kill_nodes(root: Path, nodes: list[int]) -> list[int]:
    """SIGKILL the processes of ``nodes``; returns once they are gone."""

    async def go(c: Cluster) -> list[int]:
        return [c.kill_node(n) for n in nodes]

    pids = run_with(root, go)
    until(lambda: not any(pid_alive(pid) for pid in pids), f"pids {pids} are gone", 10)
    return pids


def start_nodes(root: Path, nodes: list[int]) -> None:
    """Have the supervisor start ``nodes`` again; returns once they listen."""

    async def go(c: Cluster) -> None:
        await asyncio.gather(*(asyncio.to_thread(c.start_node, n) for n in nodes))

    run_with(root, go)


def read(root: Path, path: str, offset: int = 0, size: int = -1) -> bytes:
    """``path`` read by a client that opens the cluster afresh."""

    async def go(c: Cluster) -> bytes:
        return await c.client().read(path, offset, size)

    return run_with(root, go)


def below_redundancy(root: Path) -> int:
    async def go(c: Cluster) -> int:
        return (await c.status()).blocks_below_redundancy

    return run_with(root, go)


@contextmanager
def writers(
    root: Path, tmp: Path, count: int, *, stop: Path | None = None
) -> Iterator[tuple[list[subprocess.Popen[bytes]], list[Path]]]:
    """``count`` writer processes, writer ``i`` appending to ``/w{i}`` with seed ``i``;
    killed on the way out if still running."""
    progress = [tmp / f"progress-{i}" for i in range(count)]
    procs = []
    try:
        for i in range(count):
            cmd = [sys.executable, "-m", "tests.served_writer", str(root), f"/w{i}", str(i)]
            cmd += [str(progress[i])] + (["--stop", str(stop)] if stop else [])
            procs.append(subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL))
        yield procs, progress
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def flip_last_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        (b,) = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b ^ 0x40]))


def halve(path: str) -> None:
    """Cut a file to half its size: a write torn by a kill."""
    os.truncate(path, os.path.getsize(path) // 2)


# -- 1: writer processes carry on through a node's death --------------------------------------
@pytest.mark.parametrize(("encoding", "nodes"), [("r3", 7), ("rs-6-3", 12)])
def test_writers_lose_nothing_acknowledged_when_a_node_is_killed(
    tmp_path: Path, encoding: str, nodes: int
) -> None:
    """Four writer processes append while a node is SIGKILLed: what each had flushed before
    the kill reads back at once; they finish on their own; background repair brings every
    block back to full redundancy on the nodes left (the cluster has a node to spare)."""
    root = make(tmp_path / "c", nodes=nodes, encoding=encoding, sync=True)
    stop = tmp_path / "stop"
    victim = 3
    with Serving(root, repair_interval=1, repair_after=2):
        with writers(root, tmp_path, 4, stop=stop) as (procs, progress):
            until(lambda: all(acknowledged(p)[0] >= 6 for p in progress), "writers flushed")
            at_kill = [acknowledged(p) for p in progress]
            kill_nodes(root, [victim])
            assert not any(closed for _, _, closed in at_kill)  # killed mid-stream

            for i, (records, size, _) in enumerate(at_kill):  # the node is just gone
                assert read(root, f"/w{i}", 0, size) == stream(i, records)

            # The writers go on past the kill; then they are told to finish.
            wanted = [records + 6 for records, _, _ in at_kill]
            until(
                lambda: all(acknowledged(p)[0] >= k for p, k in zip(progress, wanted, strict=True)),
                "writers flushed after the kill",
            )
            stop.touch()
            for proc in procs:
                assert proc.wait(60) == 0
            done = [acknowledged(p) for p in progress]

        async def check(c: Cluster) -> None:
            client = c.client()
            for i, (records, size, closed) in enumerate(done):
                assert closed and size == len(stream(i, records))
                st = await client.stat(f"/w{i}")
                assert st.sealed and st.size == size
                assert await client.read_file(f"/w{i}") == stream(i, records)

        run_with(root, check)
        until(lambda: below_redundancy(root) == 0, "repair restored redundancy", 60)

        async def after_repair(c: Cluster) -> None:
            st = await c.status()
            assert st.nodes[victim].state == "down" and st.blocks_below_redundancy == 0
            assert st.files == 4 and st.blocks > 4 * 6
            async for rec in c.meta.iter_blocks():
                assert victim not in {ch.node for ch in rec.chunks}
            for i, (records, _, _) in enumerate(done):
                assert await c.client().read_file(f"/w{i}") == stream(i, records)

        run_with(root, after_repair)


# -- 2: RS(6,3) survives any three nodes -----------------------------------------------------
def test_rs_6_3_file_reads_back_with_any_three_node_processes_killed(tmp_path: Path) -> None:
    root = make(tmp_path / "c", nodes=9, encoding="rs-6-3")
    data = random.Random(2).randbytes(2 * RS_BLOCK + 5000)  # three blocks, the last short
    with Serving(root, repair_interval=0):

        async def put(c: Cluster) -> list[dict[int, int]]:
            await c.client().write_file("/f", data)
            return [{ch.index: ch.node for ch in b.chunks} for b in await c.client().layout("/f")]

        node_of = run_with(root, put)[0]  # chunk index -> node, in the first block
        assert below_redundancy(root) == 0  # the quorum's stragglers were drained at close
        # Nine nodes, nine chunks a block: every triple takes three chunks of every block.
        for indexes in ([0, 1, 2], [6, 7, 8], [2, 5, 7], [0, 3, 8]):
            nodes = [node_of[i] for i in indexes]
            kill_nodes(root, nodes)
            assert read(root, "/f") == data
            across = read(root, "/f", RS_BLOCK - 1000, 3000)  # a range over a block boundary
            assert across == data[RS_BLOCK - 1000 : RS_BLOCK + 2000]
            start_nodes(root, nodes)

        kill_nodes(root, [node_of[i] for i in (0, 4, 6, 8)])  # one too many: no wrong bytes
        with pytest.raises(DataUnavailableError):
            read(root, "/f")


# -- 3: every node killed at once ------------------------------------------------------------
def test_all_nodes_killed_mid_stream_lose_nothing_and_serve_no_torn_chunk(
    tmp_path: Path,
) -> None:
    """SIGKILL every node while a writer streams (fsync before every ack), restart them: every
    acknowledged byte is there, and every chunk on every node either reads with a payload that
    matches its header's CRC32C or is reported corrupt, never served as valid. A torn chunk
    is planted too (what a kill mid-``pwritev`` leaves), so that the last rule is exercised."""
    root = make(tmp_path / "c", nodes=7, encoding="rs-3-3", sync=True)
    nodes = list(range(7))
    with Serving(root, repair_interval=0):
        with writers(root, tmp_path, 1) as (procs, progress):
            until(lambda: acknowledged(progress[0])[0] >= 6, "the writer flushed")
            kill_nodes(root, nodes)
            assert procs[0].wait(60) == 1  # it fails, cleanly: no node is left
        records, size, _ = acknowledged(progress[0])

        async def tear(c: Cluster) -> tuple[str, str]:
            """With the nodes dead: plant a torn chunk, and tear one chunk of the file's last
            block, as a kill in the middle of writing them would have."""
            last = (await c.client().layout("/w0"))[-1]
            # A chunk that landed: acknowledged at a quorum, the block may name a straggler
            # the kill stopped before its file was made (repair rebuilds that one).
            paths = [
                node_dir(root, ch.node) / f"d{ch.disk}" / fan_out(ch.chunk_id) / ch.chunk_id
                for ch in last.chunks
            ]
            landed = await asyncio.to_thread(lambda: [p.exists() for p in paths])
            victim = next(ch for ch, ok in zip(last.chunks, landed, strict=True) if ok)
            local = LocalNode(node_dir(root, victim.node), victim.node, c.config.disks_per_node)
            try:
                torn = f"{last.block_id:016x}.0.0badc0de"
                payload = random.Random(3).randbytes(SMALL_BLOCK)
                await local.write_torn_chunk(
                    victim.disk, torn, payload, crc32c=crc32c(payload), keep=SMALL_BLOCK // 2
                )
                await asyncio.to_thread(halve, local.chunk_path(victim.disk, victim.chunk_id))
            finally:
                await local.close()
            return torn, victim.chunk_id

        planted, truncated = run_with(root, tear)
        start_nodes(root, nodes)

        async def check(c: Cluster) -> None:
            assert all(n.available for n in c.nodes)
            client = c.client()
            st = await client.stat("/w0")
            assert st.size >= size and not st.sealed
            assert await client.read_file("/w0") == stream_prefix(0, st.size)
            valid, corrupt = 0, set()
            for node in c.nodes:
                for disk in range(node.disks):
                    for info in await node.list_chunks(disk):
                        try:
                            payload, got = await node.read_chunk(disk, info.chunk_id)
                        except ChunkCorruptError:
                            corrupt.add(info.chunk_id)
                            continue
                        assert crc32c(payload) == got.crc32c and len(payload) == got.stored_len
                        valid += 1
            assert {planted, truncated} <= corrupt and valid >= records // 2

            before = await scrub(c)
            assert truncated in {p.chunk_id for p in before.corrupt}
            report = await repair(c)
            assert report.unrecoverable == [] and report.not_enough_nodes == []
            assert report.blocks_repaired >= 1
            assert (await scrub(c)).clean
            assert (await c.status()).blocks_below_redundancy == 0
            assert await client.read_file("/w0") == stream_prefix(0, st.size)

        run_with(root, check)


# -- 4: a very slow node ---------------------------------------------------------------------
@asynccontextmanager
async def slowed(c: Cluster, n: int, seconds: float) -> AsyncIterator[None]:
    """Node ``n`` adds ``seconds`` to every reply inside the block; SIGKILLed on the way out,
    so that neither the close nor the supervisor's shutdown waits for its late replies.

    The delay is set without waiting for the reply, which the node holds back by the new
    delay itself (see ``test_setting_a_node_delay_returns_at_once``). The request goes out on
    the node's data connection, so every request sent after it is delayed."""
    await c.nodes[n].usage()  # the data connection is open: the request below leaves at once
    setting = asyncio.create_task(c.set_node_delay(n, seconds))
    await asyncio.sleep(0)
    try:
        yield
    finally:
        c.kill_node(n)
        setting.cancel()
        await asyncio.gather(setting, return_exceptions=True)


def test_a_node_slow_by_30_s_stalls_neither_writes_nor_a_read(tmp_path: Path) -> None:
    """RS(6,3) on nine nodes: every block has a chunk on the slow node. Writes are
    acknowledged by the other eight (the ninth finishes later); a read that needs the slow
    node's chunk races it against parity once enough reads have been timed."""
    root = make(tmp_path / "c", nodes=9, encoding="rs-6-3")
    early = random.Random(4).randbytes(2 * RS_BLOCK)  # whole blocks: one chunk-size class
    late = random.Random(5).randbytes(4 * RS_BLOCK)
    with Serving(root, repair_interval=0):

        async def go(c: Cluster) -> None:
            client = c.client()
            stats = c.datapath.stats
            await client.write_file("/early", early)
            # Two reads of two blocks: 24 latency samples, so a read hedges after the 95th
            # percentile of them rather than after DEFAULT_HEDGE_AFTER. None of these reads
            # could hedge on percentiles (they started with fewer than 20 samples): the hedge
            # budget (5% of reads) is left for the read below.
            for _ in range(2):
                assert await client.read_file("/early") == early
            assert c.datapath.hedge_after(SMALL_BLOCK) < DEFAULT_HEDGE_AFTER
            assert stats.hedged_reads == 0
            slow = next(
                ch.node for ch in (await client.layout("/early"))[0].chunks if ch.index == 0
            )
            async with slowed(c, slow, 30):
                stragglers = stats.stragglers
                await asyncio.wait_for(client.write_file("/late", late), 20)
                assert stats.stragglers - stragglers == 4  # the slow node's chunk of each block
                layout = await client.layout("/late")
                assert all(slow in {ch.node for ch in b.chunks} for b in layout)
                # The first block of /early: its chunk 0 is on the slow node.
                got = await asyncio.wait_for(client.read("/early", 0, RS_BLOCK), 20)
                assert got == early[:RS_BLOCK] and stats.hedged_reads == 1

        run_with(root, go)


def test_a_file_reads_back_around_a_node_slow_by_30_s(tmp_path: Path) -> None:
    """Every block whose data chunk is on the slow node needs a hedge; the 5% budget allows
    one here, so the second such block waits 30 s."""
    root = make(tmp_path / "c", nodes=9, encoding="rs-6-3")
    data = random.Random(7).randbytes(4 * RS_BLOCK)
    with Serving(root, repair_interval=0):

        async def go(c: Cluster) -> None:
            client = c.client()
            await client.write_file("/f", data)
            assert await client.read_file("/f") == data  # 24 latency samples
            # The node holding most data chunks: at least three of the 24 in four blocks.
            data_chunks = Counter(
                ch.node for b in await client.layout("/f") for ch in b.chunks if ch.index < 6
            )
            ((slow, held),) = data_chunks.most_common(1)
            assert held >= 2
            async with slowed(c, slow, 30):
                assert await asyncio.wait_for(client.read_file("/f"), 5) == data

        run_with(root, go)


def test_setting_a_node_delay_returns_at_once(tmp_path: Path) -> None:
    root = make(tmp_path / "c", nodes=3, encoding="r3")
    with Serving(root, repair_interval=0):

        async def go(c: Cluster) -> None:
            try:
                await asyncio.wait_for(c.set_node_delay(1, 30), 5)
            finally:
                c.kill_node(1)  # a node with replies pending for 30 s stops slowly

        run_with(root, go)


# -- 5: the command line ---------------------------------------------------------------------
REPAIR_FAST = ["--repair-interval", "1s", "--repair-after", "2s"]


def status(root: Path) -> Any:
    """``cluster status --json``, from a new process."""
    return ok_json("cluster", "status", cluster=root)


def test_cli_serve_kill_start_slow_and_shutdown(tmp_path: Path) -> None:
    root = make(tmp_path / "c", nodes=5, encoding="r3")
    data = random.Random(6).randbytes(3 * SMALL_BLOCK + 7)
    serve = subprocess.Popen(
        [sys.executable, "-m", "tectonic_emu", "serve", "--cluster", str(root), *REPAIR_FAST],
        stdin=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("wb"),  # read on failure: it says where it stuck
    )
    try:
        until(
            lambda: (
                (root / SERVE_FILE).exists()
                and all((node_dir(root, n) / ADDRESS_FILE).exists() for n in range(5))
            ),
            "serve started every node",
        )
        st = status(root)
        nodes = st["nodes"]
        assert st["served"] is True
        for n, node in enumerate(nodes):
            address = json.loads((node_dir(root, n) / ADDRESS_FILE).read_text())
            assert node["state"] == "up" and node["pid"] == address["pid"]
            assert node["address"] == f"{address['host']}:{address['port']}"
            assert pid_alive(node["pid"]) and node["heartbeat_ms"] is not None
        ok("put", "-", "/f", cluster=root, stdin=data)

        out = ok("node", "kill", "2", cluster=root).decode()
        assert out == f"node 2: killed pid {nodes[2]['pid']}\n"
        until(lambda: not pid_alive(nodes[2]["pid"]), "node 2 is gone", 10)
        st = status(root)
        assert [n["state"] for n in st["nodes"]] == ["up", "up", "down", "up", "up"]
        assert ok("get", "/f", "-", cluster=root) == data
        # The background repair moves node 2's chunks once it has been down 2 s.
        until(lambda: status(root)["blocks_below_redundancy"] == 0, "repair ran", 30)

        ok("node", "start", "2", cluster=root)
        st = status(root)
        assert [n["state"] for n in st["nodes"]] == ["up"] * 5
        new_pid = st["nodes"][2]["pid"]
        assert new_pid != nodes[2]["pid"] and pid_alive(new_pid)
        assert st["blocks_below_redundancy"] == 0

        ok("node", "slow", "1", "50ms", cluster=root)
        assert ok("get", "/f", "-", cluster=root) == data
        ok("node", "slow", "1", "0", cluster=root)

        fails("node", "serve", "--node", "1", cluster=root, mentions="already served")
        embedded = make(tmp_path / "embedded", nodes=3, encoding="r3")
        r = tecto("node", "kill", "0", cluster=embedded)
        assert r.returncode == 1 and r.stdout == b""
        assert r.stderr.decode().count("\n") == 1 and "Traceback" not in r.stderr.decode()
        assert r.stderr.decode().startswith("tectonic-emu: error: only a served node")

        serve.send_signal(signal.SIGTERM)
        try:
            code = serve.wait(30)
        except subprocess.TimeoutExpired:
            log = (tmp_path / "serve.log").read_text(errors="replace")
            tail = log[-3000:]
            raise AssertionError(f"serve did not stop in 30 s; its log ends:\n{tail}") from None
        assert code == 0
        assert not (root / SERVE_FILE).exists()
        assert not list(root.glob(f"nodes/*/{ADDRESS_FILE}"))
        assert not any(pid_alive(pid) for pid in [n["pid"] for n in nodes] + [new_pid])
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


# -- the supervisor --------------------------------------------------------------------------
def test_start_right_after_kill_or_stop_brings_the_node_back(tmp_path: Path) -> None:
    """``start_node`` at once after ``kill_node`` or ``stop_node``: the supervisor must not
    take the dying process for a running one."""
    root = make(tmp_path / "c", nodes=3, encoding="r3")
    with Serving(root, repair_interval=0):

        async def go(c: Cluster) -> None:
            for how in ("kill", "stop", "kill", "stop"):
                old = read_address(root, 1)
                assert old is not None
                if how == "kill":
                    c.kill_node(1)
                else:
                    c.stop_node(1)
                c.start_node(1)
                new = read_address(root, 1)
                assert new is not None and new.pid != old.pid and pid_alive(new.pid), how
                await c.check_health()
                assert c.nodes[1].available, how

        run_with(root, go)


def test_concurrent_starts_of_a_node_start_one_process(tmp_path: Path) -> None:
    root = make(tmp_path / "c", nodes=3, encoding="r3")
    with Serving(root, repair_interval=0):
        kill_nodes(root, [2])
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda _: control(root, {"cmd": "start", "node": 2}), range(4)))
        pids = {r["address"]["pid"] for r in replies}
        assert len(pids) == 1 and pid_alive(pids.pop())
        supervised = control(root, {"cmd": "status"})["nodes"]["2"]
        assert supervised["running"] and supervised["pid"] == replies[0]["address"]["pid"]


def test_nodes_exit_with_a_killed_supervisor_and_a_new_one_takes_over(tmp_path: Path) -> None:
    root = make(tmp_path / "c", nodes=3, encoding="r3")
    first = Serving(root, repair_interval=0).start()
    try:
        run_with(root, lambda c: c.client().write_file("/f", b"kept"))
        pids = [addr.pid for n in range(3) if (addr := read_address(root, n)) is not None]
        assert first.proc is not None and len(pids) == 3
        first.proc.kill()
        first.proc.wait()
        # Each node process gets SIGTERM when its supervisor dies, and exits cleanly.
        until(lambda: not any(pid_alive(pid) for pid in pids), "the nodes exited", 20)
        assert not list(root.glob(f"nodes/*/{ADDRESS_FILE}"))
    finally:
        first.stop()
    with Serving(root, repair_interval=0):
        assert read(root, "/f") == b"kept"
        info = json.loads((root / SERVE_FILE).read_text())
        assert info["pid"] != first.proc.pid
    assert not (root / SERVE_FILE).exists()


def test_the_supervisors_scrub_repairs_a_damaged_chunk(tmp_path: Path) -> None:
    root = make(tmp_path / "c", nodes=4, encoding="r3")
    data = random.Random(8).randbytes(2 * SMALL_BLOCK)
    with Serving(root, repair_interval=0, scrub_interval=0.2):

        async def put(c: Cluster) -> str:
            await c.client().write_file("/f", data)
            damaged = (await c.client().layout("/f"))[1].chunks[0]
            local = LocalNode(node_dir(root, damaged.node), damaged.node, c.config.disks_per_node)
            try:
                await asyncio.to_thread(
                    flip_last_byte, local.chunk_path(damaged.disk, damaged.chunk_id)
                )
            finally:
                await local.close()
            return damaged.chunk_id

        damaged = run_with(root, put)

        async def chunk_ids(c: Cluster) -> set[str]:
            return {ch.chunk_id for b in await c.client().layout("/f") for ch in b.chunks}

        until(lambda: damaged not in run_with(root, chunk_ids), "scrub replaced the chunk", 30)
        assert read(root, "/f") == data
        assert run_with(root, scrub).clean
