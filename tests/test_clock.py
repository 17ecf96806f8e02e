"""The clock seam (``tectonic_emu/clock.py``): one contract for the real and the virtual
clock, and what virtual time promises: long waits take no wall time, work on threads takes no
virtual time, and the same program gives the same timeline."""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu import clock
from tectonic_emu.chunkstore import FaultyNode, LocalNode, MemoryNode
from tectonic_emu.coding import Encoding, crc32c
from tectonic_emu.datapath import DataPath
from tectonic_emu.hedging import DEFAULT_HEDGE_AFTER
from tectonic_emu.offload import InlineExecutor

Runner = Callable[[Coroutine[Any, Any, Any]], Any]
RUNNERS: dict[str, Runner] = {"real": asyncio.run, "virtual": clock.run_virtual}


@pytest.fixture(params=sorted(RUNNERS))
def run(request: pytest.FixtureRequest) -> Runner:
    return RUNNERS[request.param]


# -- the contract, both backends -------------------------------------------------------------
def test_sleep_advances_the_clock_by_at_least_its_length(run: Runner) -> None:
    async def main() -> list[float]:
        seen = [clock.monotonic()]
        for pause in (0.0, 0.002, 0.01):
            await asyncio.sleep(pause)
            seen.append(clock.monotonic())
        return seen

    seen = run(main())
    assert seen == sorted(seen)
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert gaps[1] >= 0.002 - 1e-6 and gaps[2] >= 0.01 - 1e-6


def test_wall_moves_with_monotonic(run: Runner) -> None:
    """``wall() - monotonic()`` stays put across a sleep (to a few ms on the real clocks,
    which an NTP step could move), and ``wall`` is a plausible date."""

    async def main() -> tuple[float, float, float]:
        before = clock.wall() - clock.monotonic()
        await asyncio.sleep(0.01)
        return before, clock.wall() - clock.monotonic(), clock.wall()

    before, after, now = run(main())
    assert abs(after - before) < 0.005
    assert 1.7e9 < now < 4e9  # between 2023 and 2096


def test_the_running_loop_picks_the_backend(run: Runner) -> None:
    async def main() -> tuple[bool, float, float]:
        return clock.current().virtual, clock.monotonic(), asyncio.get_running_loop().time()

    virtual, ours, loops = run(main())
    assert virtual == (run is clock.run_virtual)
    assert ours == pytest.approx(loops, abs=0.01)


def test_off_a_loop_the_clocks_are_the_machines() -> None:
    assert clock.current() is clock.REAL
    assert abs(clock.monotonic() - time.monotonic()) < 0.01
    assert abs(clock.wall() - time.time()) < 0.01


# -- virtual time ----------------------------------------------------------------------------
def test_a_one_hour_timeout_expires_in_milliseconds() -> None:
    async def main() -> float:
        start = clock.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), timeout=3600)
        return clock.monotonic() - start

    t0 = time.monotonic()
    assert clock.run_virtual(main()) == 3600
    assert time.monotonic() - t0 < 0.5


def test_a_virtual_clock_starts_at_its_epoch_and_never_goes_back() -> None:
    c = clock.VirtualClock(epoch=1000.0)

    async def main() -> tuple[float, float]:
        await asyncio.sleep(5)
        return clock.monotonic(), clock.wall()

    assert clock.run_virtual(main(), clock=c) == (5.0, 1005.0)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError):
            c.advance(bad)
    assert c.now == 5.0


def test_work_on_a_thread_takes_no_virtual_time() -> None:
    """A real pool's job that takes 0.2 s of real time beats a 10 ms virtual timeout: the
    clock stands still while the loop waits for it."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as pool:
            start = clock.monotonic()
            await asyncio.wait_for(loop.run_in_executor(pool, time.sleep, 0.2), timeout=0.01)
            return clock.monotonic() - start

    assert clock.run_virtual(main()) == 0.0


def test_a_local_nodes_chunk_write_on_its_pool_takes_no_virtual_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LocalNode's writes go to its own pool of disk threads; while one runs (here held 0.2 s
    of real time) the clock stands still, so a 10 ms virtual timeout does not fire. (It once
    submitted to the pool directly, out of the loop's sight, and the clock jumped to the next
    timer mid-write: a slowed node's 30 s delay ended while its peers' writes were running.)"""
    node = LocalNode(tmp_path / "node", node_id=0, disks=1, sync=False)
    real = LocalNode._write_file

    def held(self: LocalNode, disk: int, job: Any) -> None:
        time.sleep(0.2)
        real(self, disk, job)

    monkeypatch.setattr(LocalNode, "_write_file", held)

    async def main() -> float:
        start = clock.monotonic()
        await asyncio.wait_for(node.write_chunk(0, "c", b"x" * 10, crc32c=crc32c(b"x" * 10)), 0.01)
        data, _ = await node.read_chunk(0, "c")
        assert bytes(data) == b"x" * 10
        await node.close()
        return clock.monotonic() - start

    assert clock.run_virtual(main()) == 0.0


def test_the_default_executor_runs_jobs_inline_and_passes_errors_on() -> None:
    def boom() -> None:
        raise KeyError("x")

    async def main() -> int:
        with pytest.raises(KeyError):
            await asyncio.to_thread(boom)
        return await asyncio.to_thread(threading.get_ident)

    assert clock.run_virtual(main()) == threading.get_ident()
    assert InlineExecutor().submit(pow, 2, 10).result() == 1024


def test_sockets_still_work_on_a_virtual_loop() -> None:
    async def main() -> bytes:
        a, b = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=a)
        b.sendall(b"ping")
        got = await reader.readexactly(4)
        writer.close()
        b.close()
        return got

    assert clock.run_virtual(main()) == b"ping"


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), tasks=st.integers(1, 30))
def test_the_same_program_gives_the_same_timeline(seed: int, tasks: int) -> None:
    """Tasks that sleep random lengths (some equal, some zero) and hand work to the default
    executor leave the same (time, task, step) trace on every run, at the sums of their
    sleeps."""

    async def main() -> list[tuple[float, int, int]]:
        trace: list[tuple[float, int, int]] = []
        rng = random.Random(seed)

        async def task(k: int, pauses: list[float]) -> None:
            for step, pause in enumerate(pauses):
                await asyncio.sleep(pause)
                if step % 2:
                    await asyncio.to_thread(sum, range(10))
                trace.append((clock.monotonic(), k, step))

        plans = [[rng.choice([0.0, 0.5, 1.0, rng.random() * 3]) for _ in range(5)]
                 for _ in range(tasks)]  # fmt: skip
        await asyncio.gather(*(task(k, p) for k, p in enumerate(plans)))
        for t, k, step in trace:
            assert t == pytest.approx(sum(plans[k][: step + 1]), abs=1e-9)
        return trace

    first = clock.run_virtual(main())
    assert clock.run_virtual(main()) == first


# -- the real data path in virtual time ------------------------------------------------------
def test_hedged_quorum_writes_and_reads_run_in_virtual_time() -> None:
    """The real DataPath on in-memory nodes of 1 ms, one of which takes an hour per call. In
    virtual time the rs-6-3 block is acknowledged at its quorum after one call's time (the
    chunk writes run at once), read back around the slow node once the hedging delay has run
    on the clock (1 s, plus two calls), and its
    straggler lands when drained, an hour later; in all, well under a second of wall time.
    Two runs give the same times."""
    enc = Encoding.parse("rs-6-3")
    data = bytes(range(256)) * 400

    async def main() -> tuple[float, float, float]:
        nodes = [FaultyNode(MemoryNode(n, 1), latency=0.001) for n in range(enc.width)]
        nodes[0].latency = 3600.0
        dp = DataPath(
            nodes, disks_per_node=1, compression="none", cpu=InlineExecutor(),
            write_ack="quorum", hedge_share=1.0,
        )  # fmt: skip
        dp._rng.seed(7)
        start = clock.monotonic()
        rec = await dp.write_block(enc, data, block_id=1, file_id=1)
        acked = clock.monotonic() - start
        assert bytes(await dp.read_block(rec)) == data
        read = clock.monotonic() - start - acked
        await dp.drain(wait=7200)
        assert dp.stats.stragglers == 1 and dp.stats.straggler_failures == 0
        return acked, read, clock.monotonic() - start

    t0 = time.monotonic()
    times = clock.run_virtual(main())
    assert time.monotonic() - t0 < 1.0
    acked, read, drained = times
    assert acked == pytest.approx(0.001)
    assert read == pytest.approx(DEFAULT_HEDGE_AFTER + 0.002)
    assert 3600 <= drained < 3601
    assert clock.run_virtual(main()) == times
