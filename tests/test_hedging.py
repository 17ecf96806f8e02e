"""Hedged writes and reads in DataPath, against in-process nodes with injected latency.

A slow node is a FaultyNode whose every call sleeps far longer than the bound the test waits
(``asyncio.wait_for``): if hedging did not work, the test would fail by timing out, not by a
speed figure. Speeds are measured by ``tectonic-emu bench hedge``, not here.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tectonic_emu.chunkstore import FaultyNode, MemoryNode
from tectonic_emu.coding import Encoding
from tectonic_emu.datapath import DataPath
from tectonic_emu.errors import NotEnoughNodesError
from tectonic_emu.hedging import HedgeStats, ReadHedging

T = TypeVar("T")
SLOW = 60.0  # seconds a slow node takes per call: far beyond any bound below
BOUND = 10.0  # seconds a hedged operation may take before the test fails
# Replicated reads start on a random replica: with 20 reads the slow one leads at least once
# in all but (2/3)^20 = 0.03% of runs; seeded below so the run is reproducible.
READS = 20


def make_path(
    nodes: int, *, write_ack: str = "quorum", hedge_share: float = 1.0
) -> tuple[DataPath, list[FaultyNode]]:
    faulty = [FaultyNode(MemoryNode(n, 2)) for n in range(nodes)]
    cpu = ThreadPoolExecutor(2)
    dp = DataPath(
        faulty,
        disks_per_node=2,
        compression="none",
        cpu=cpu,
        write_ack=write_ack,
        hedge_share=hedge_share,
    )
    dp._rng.seed(1234)  # placement and replica choice: the same every run
    return dp, faulty


def run(fn: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(fn())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("enc", "ack", "quorum"),
    [
        ("r1", "quorum", 1),
        ("r2", "quorum", 2),
        ("r3", "quorum", 2),
        ("rs-6-3", "quorum", 8),
        ("rs-3-3", "quorum", 5),
        ("rs-10-4", "quorum", 13),
        ("r3", "all", 3),
        ("rs-6-3", "all", 9),
    ],
)
def test_ack_quorum(enc: str, ack: str, quorum: int) -> None:
    dp, _ = make_path(16, write_ack=ack)
    assert dp.ack_quorum(Encoding.parse(enc)) == quorum


@pytest.mark.parametrize("enc", ["r3", "rs-6-3"])
def test_quorum_write_does_not_wait_for_a_slow_node(enc: str) -> None:
    """Every node the block needs is in use (no spare to hedge onto) and one is slow: the
    block is acknowledged at the quorum, names the straggler's chunk, and the straggler lands
    when drained."""
    e = Encoding.parse(enc)
    dp, nodes = make_path(e.width)
    nodes[0].latency = SLOW
    data = os.urandom(6 * 1000 + 17)

    async def go() -> None:
        rec = await asyncio.wait_for(dp.write_block(e, data, block_id=1, file_id=1), BOUND)
        assert len(rec.chunks) == e.width
        assert sorted(c.index for c in rec.chunks) == list(range(e.width))
        assert dp.stats.stragglers == 1
        # readable right away, without the slow node
        got = await asyncio.wait_for(dp.read_block(rec), BOUND)
        assert bytes(got) == data
        nodes[0].latency = 0.01  # the straggler's sleep already started; let drain cut it
        await dp.drain(wait=0.2)
        assert dp.stats.straggler_failures == 0 or dp.stats.stragglers == 1

    run(go)


def test_straggler_that_fails_leaves_its_chunk_to_repair() -> None:
    e = Encoding.parse("r3")
    dp, nodes = make_path(3)
    nodes[2].latency = 0.3
    nodes[2].fail_writes = 1  # after the delay, the write fails
    data = b"x" * 5000

    async def go() -> None:
        rec = await asyncio.wait_for(dp.write_block(e, data, block_id=7, file_id=1), BOUND)
        await dp.drain()
        assert dp.stats.straggler_failures == 1
        on_slow = [c for c in rec.chunks if c.node == 2]
        assert len(on_slow) == 1  # the record still names it: repair finds it missing
        assert await nodes[2].inner.list_chunks(on_slow[0].disk) == []
        assert bytes(await dp.read_block(rec)) == data

    run(go)


def test_ack_all_waits_for_every_chunk() -> None:
    e = Encoding.parse("r3")
    dp, nodes = make_path(3, write_ack="all")
    nodes[1].latency = 0.2

    async def go() -> None:
        rec = await dp.write_block(e, b"y" * 100, block_id=2, file_id=1)
        assert dp.stats.stragglers == 0
        for c in rec.chunks:
            await nodes[c.node].inner.stat_chunk(c.disk, c.chunk_id)  # all durable

    run(go)


def test_hedged_reservation_skips_a_slow_node() -> None:
    """With spare nodes, a write reserves on more than it needs and never waits for the
    slow one, whichever nodes placement proposes first."""
    e = Encoding.parse("r3")
    dp, nodes = make_path(6)
    nodes[3].latency = SLOW

    async def go() -> None:
        for block_id in range(20):
            rec = await asyncio.wait_for(
                dp.write_block(e, b"z" * 1000, block_id=block_id, file_id=1), BOUND
            )
            assert 3 not in {c.node for c in rec.chunks}
        assert dp.stats.hedged_writes == 20
        assert dp.stats.stragglers == 0

    run(go)


def test_reservation_failures_fall_back_to_live_nodes() -> None:
    e = Encoding.parse("r3")
    dp, nodes = make_path(5)
    for n in (0, 1):
        nodes[n].available = False  # refuses reservations and writes

    async def go() -> None:
        rec = await dp.write_block(e, b"q" * 1000, block_id=3, file_id=1)
        assert {c.node for c in rec.chunks} == {2, 3, 4}
        nodes[2].available = nodes[3].available = False  # one live node: too few even degraded
        with pytest.raises(NotEnoughNodesError):
            await dp.write_block(e, b"q", block_id=4, file_id=1)

    run(go)


def _warm(dp: DataPath, rec: object, times: int = 30) -> Awaitable[None]:
    async def go() -> None:
        for _ in range(times):
            await dp.read_block(rec)  # type: ignore[arg-type]

    return go()


@pytest.mark.parametrize("enc", ["r3", "rs-6-3"])
def test_hedged_read_races_a_slow_chunk(enc: str) -> None:
    e = Encoding.parse(enc)
    dp, nodes = make_path(e.width, write_ack="all")
    data = os.urandom(60_000)

    async def go() -> None:
        rec = await dp.write_block(e, data, block_id=9, file_id=1)
        await _warm(dp, rec)
        assert dp.hedge_after(rec.chunks[0].stored_len) < 1.0
        slow = next(c.node for c in rec.chunks if c.index == 0)
        nodes[slow].latency = SLOW  # a replica, or the first data chunk
        before = dp.stats.hedged_reads
        for _ in range(READS):
            pieces = await asyncio.wait_for(dp.read_range(rec, 0, len(data)), BOUND)
            got = b"".join(bytes(p) for _, p in sorted(pieces, key=lambda p: p[0]))
            assert got == data
        assert dp.stats.hedged_reads > before
        assert dp.stats.hedged_reads - before <= READS

    run(go)


def test_hedging_respects_its_share() -> None:
    """With a zero share, a slow read is waited for, not raced."""
    e = Encoding.parse("r3")
    dp, nodes = make_path(3, write_ack="all", hedge_share=0.0)

    async def go() -> None:
        rec = await dp.write_block(e, b"w" * 50_000, block_id=5, file_id=1)
        await _warm(dp, rec)
        for n in nodes:
            n.latency = 0.05
        for _ in range(5):
            assert bytes(await dp.read_block(rec)) == b"w" * 50_000
        assert dp.stats.hedged_reads == 0

    run(go)


@given(
    slow=st.sets(st.integers(0, 8), max_size=1),
    failing=st.sets(st.integers(0, 8), max_size=1),
    size=st.integers(1, 40_000),
)
def test_quorum_writes_always_read_back(slow: set[int], failing: set[int], size: int) -> None:
    """Whatever node is slow and whatever node fails its next write, an acknowledged
    rs-6-3 block reads back exactly, before and after its stragglers finish."""
    e = Encoding.parse("rs-6-3")
    dp, nodes = make_path(9)
    for n in slow:
        nodes[n].latency = 0.05
    for n in failing:
        nodes[n].fail_writes = 1
    data = os.urandom(size)

    async def go() -> None:
        rec = await asyncio.wait_for(dp.write_block(e, data, block_id=1, file_id=1), BOUND)
        assert bytes(await dp.read_block(rec)) == data
        await dp.drain()
        assert bytes(await dp.read_block(rec)) == data

    run(go)


def test_a_persistently_slow_node_is_marked_and_read_around() -> None:
    """A node whose reads take far longer than the others' is marked slow once it has a full
    window of samples; reads needing it then race it from the start. Uniformly slow nodes are
    not marked."""
    e = Encoding.parse("rs-6-3")
    dp, nodes = make_path(9, write_ack="all", hedge_share=0.0)
    data = os.urandom(60_000)

    async def go() -> None:
        rec = await dp.write_block(e, data, block_id=11, file_id=1)
        for n in nodes:
            n.latency = 0.002  # uniform: nobody stands out
        await _warm(dp, rec, times=12)
        assert dp.stats.slow_nodes_marked == 0
        slow = next(c.node for c in rec.chunks if c.index == 0)
        nodes[slow].latency = 0.1
        for _ in range(12):
            pieces = await dp.read_range(rec, 0, len(data))
            got = b"".join(bytes(p) for _, p in sorted(pieces, key=lambda p: p[0]))
            assert got == data
        assert dp.is_slow(slow)
        assert dp.stats.slow_nodes_marked == 1
        assert dp.stats.slow_node_reads >= 1
        dp.hedge_reads = False  # the switch turns all of it off
        assert not dp.is_slow(slow)

    run(go)


@given(
    hosts=st.integers(2, 5),
    per_host=st.integers(1, 4),
    enc=st.sampled_from(["r2", "r3", "rs-3-2"]),
    down=st.sets(st.integers(0, 19), max_size=6),
    seed=st.integers(0, 2**32 - 1),
)
def test_placement_spreads_a_block_over_failure_domains(
    hosts: int, per_host: int, enc: str, down: set[int], seed: int
) -> None:
    """Nodes grouped in hosts: a block's targets, placed (``place``) or won in a hedged
    reservation race (``_reserve_targets``), span as many hosts as the live nodes allow."""
    e = Encoding.parse(enc)
    n = hosts * per_host
    nodes = [FaultyNode(MemoryNode(k, 2)) for k in range(n)]
    domains = [f"10.0.0.{k // per_host}" for k in range(n)]
    for k in down:
        if k < n:
            nodes[k].available = False
    with ThreadPoolExecutor(1) as cpu:
        dp = DataPath(
            nodes, disks_per_node=2, compression="none", cpu=cpu, write_ack="quorum",
            domains=domains,
        )  # fmt: skip
        dp._rng.seed(seed)
        live = [k for k in range(n) if nodes[k].available]
        if len(live) < dp.min_live_nodes(e) or len(live) * 2 < e.width:
            return
        possible = min(e.width, len({domains[k] for k in live}), len(live))
        targets = dp.place(e, e.width)
        assert len({domains[k] for k, _ in targets}) == possible
        if len(live) > e.width:
            won = run(lambda: dp._reserve_targets(e, 1000))
            assert len({domains[k] for k, _ in won}) == possible


@pytest.mark.parametrize("nodes", [8, 300])
def test_a_slow_node_among_many_is_marked_and_no_fast_one_is(nodes: int) -> None:
    """Slow-node detection compares a node's fastest recent read with the others' median:
    exactly among a few nodes, against a median refreshed every few hundred reads among
    hundreds (``hedging._EXACT_NODES``). Either way the one node 50x slower is marked and
    none of the others."""
    h = ReadHedging(HedgeStats(), percentile=95.0, share=0.05, enabled=True)
    rng = random.Random(4)
    for _ in range(6):
        for n in range(nodes):
            base = 0.05 if n == 3 else 0.001
            h.record(n, 8 << 20, base * (1 + rng.random() / 10))
    assert [n for n in range(nodes) if h.is_slow(n)] == [3]
