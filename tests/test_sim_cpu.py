"""Client CPU in a projection: work counted where the real code does it (coding/work.py),
charged to a host's cores (sim/cpu.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.projection import PRESETS, Scenario, project_checkpoint
from tectonic_emu import clock
from tectonic_emu.coding import Encoding, codec_for, crc32c, crc32c_each, crc32c_many, work
from tectonic_emu.coding.synthetic import Synthetic
from tectonic_emu.offload import InlineExecutor, offload
from tectonic_emu.sim.cpu import (
    ASSUMED_SERVER_CORE,
    COPY_SIZES,
    CpuModel,
    HostCpu,
    copy_rates,
)

ONE_GBPS = {kind: 1.0 for kind in work.KINDS}


def _tally_of(fn, payload) -> dict[str, int]:  # type: ignore[no-untyped-def]
    tally = work.Tally()
    with tally.active():
        fn(payload)
    return tally.total


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 300_000),
    enc=st.sampled_from(["rs-6-3", "rs-3-3", "r3"]),
    lost=st.integers(0, 3),
)
def test_real_and_synthetic_bytes_count_the_same_work(n: int, enc: str, lost: int) -> None:
    """Each counted function counts the same bytes for a Synthetic payload as for the bytes
    it describes: a projection charges what a real run would do."""
    synthetic = Synthetic.random(7, n)
    real = synthetic.materialize()
    codec = codec_for(Encoding.parse(enc))

    def checks(p):  # type: ignore[no-untyped-def]
        crc32c(p)
        crc32c_many(p, [(0, n // 2), (n // 2, n - n // 2)])
        crc32c_each([p, p])

    def codes(p):  # type: ignore[no-untyped-def]
        chunks = codec.encode(p)
        width = Encoding.parse(enc).width
        kept = {i: c for i, c in enumerate(chunks) if i >= min(lost, width - 1)}
        codec.decode(kept, n)

    for fn in (checks, codes):
        assert _tally_of(fn, synthetic) == _tally_of(fn, real)
    assert _tally_of(checks, real) == {"crc32c": 4 * n}


def test_nothing_is_counted_without_a_tally() -> None:
    assert work.Tally.current() is None
    crc32c(b"x" * 1000)  # no error, nowhere to count
    tally = work.Tally()
    with tally.active():
        assert work.Tally.current() is tally
    assert work.Tally.current() is None


def test_offloaded_and_threaded_work_is_charged_to_the_host_first_come_first_served() -> None:
    """A 1 GB checksum at 1 GB/s takes one virtual second of a core; three at once on two
    cores end at 1, 1 and 2 s, whether the real code offloads them or hands them to
    ``asyncio.to_thread``. Work outside any tally costs nothing."""
    gb = Synthetic.random(1, 10**9)

    async def main() -> list[float]:
        cpu = HostCpu(CpuModel(2, ONE_GBPS), name="host")
        ends: list[float] = []

        async def job(k: int) -> None:
            with cpu.active():
                if k % 2:
                    await asyncio.to_thread(crc32c, gb)
                else:
                    await offload(InlineExecutor(), len(gb), crc32c, gb)
            ends.append(clock.monotonic())

        t0 = clock.monotonic()
        await asyncio.gather(*(job(k) for k in range(3)))
        free = clock.monotonic()
        await offload(InlineExecutor(), len(gb), crc32c, gb)  # no tally: free
        assert clock.monotonic() == free
        assert cpu.total == {"crc32c": 3 * 10**9}
        assert cpu.cores.utilisation(2.0) == pytest.approx(0.75)
        return [round(e - t0, 9) for e in ends]

    assert sorted(clock.run_virtual(main())) == [1.0, 1.0, 2.0]


def test_small_work_stays_owed_until_it_is_worth_a_timer() -> None:
    async def main() -> None:
        cpu = HostCpu(CpuModel(1, ONE_GBPS))
        with cpu.active():
            crc32c(b"x" * 100)  # 100 ns of work
            t0 = clock.monotonic()
            await work.settle()
            assert clock.monotonic() == t0 and cpu.owed_loop == pytest.approx(1e-7)
            crc32c(b"x" * 1000)
            await work.settle()
            assert clock.monotonic() - t0 == pytest.approx(1.1e-6)
            assert cpu.owed == cpu.owed_loop == 0

    clock.run_virtual(main())


def test_work_on_the_event_loop_takes_turns_on_its_one_thread() -> None:
    """Four 1 GB copies made on the loop (as a load makes a bytes value's) on a host of four
    cores take 4 s, one after another; the same four on threads take 1 s together. Loop
    work also takes a core: two copies on the loop beside two checksums on threads, on two
    cores, end at 1, 1, 2 and 2 s (the second copy waits for the loop)."""
    gb = Synthetic.random(1, 10**9)

    async def run(cores: int, jobs: list[str]) -> list[float]:
        cpu = HostCpu(CpuModel(cores, ONE_GBPS), name="host")
        ends: list[float] = []

        async def job(kind: str) -> None:
            with cpu.active():
                if kind == "loop":
                    work.count("copy", len(gb))
                    await work.settle()
                else:
                    await asyncio.to_thread(crc32c, gb)
            ends.append(round(clock.monotonic(), 9))

        await asyncio.gather(*(job(k) for k in jobs))
        assert sum(cpu.total.values()) == len(jobs) * 10**9
        return sorted(ends)

    assert clock.run_virtual(run(4, ["loop"] * 4)) == [1.0, 2.0, 3.0, 4.0]
    assert clock.run_virtual(run(4, ["thread"] * 4)) == [1.0] * 4
    assert clock.run_virtual(run(2, ["loop", "thread", "loop", "thread"])) == [1.0, 1.0, 2.0, 2.0]


def test_copies_into_fresh_memory_share_the_hosts_rate_of_it() -> None:
    """With the host's fresh memory at 1 GB/s, two 1 GB copies on threads of two cores at
    1 GB/s each end at 1 and 2 s (one core each, but one rate of new pages between them);
    a checksum beside them waits for a core (1 s) either way."""
    gb = 10**9

    async def run(fresh: float | None) -> list[float]:
        cpu = HostCpu(CpuModel(2, ONE_GBPS, fresh_gb_s=fresh), name="host")
        ends: list[float] = []

        async def job(kind: str) -> None:
            with cpu.active(), work.on_thread():
                work.count(kind, gb)
                await work.settle()
            ends.append(round(clock.monotonic(), 9))

        await asyncio.gather(*(job(k) for k in ("copy", "copy", "crc32c")))
        return ends

    assert clock.run_virtual(run(None)) == [1.0, 1.0, 2.0]
    assert clock.run_virtual(run(1.0)) == [1.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="positive rate"):
        CpuModel(1, ONE_GBPS, fresh_gb_s=0.0)


def test_a_copy_takes_the_rate_measured_for_its_size() -> None:
    """Rates at 1 MB and 100 MB: a copy of either size takes its own, one of 10 MB the
    rate halfway between them (halfway on the log of the size), smaller and larger ones
    the nearest end's; without rates by size every copy takes ``gbps["copy"]``."""
    model = CpuModel(1, ONE_GBPS, copy_sizes=((10**6, 1.0), (10**8, 3.0)))
    assert model.copy_gbps(10**6) == 1.0
    assert model.copy_gbps(10**8) == 3.0
    assert model.copy_gbps(10**7) == pytest.approx(2.0)
    assert model.copy_gbps(1000) == 1.0
    assert model.copy_gbps(10**10) == 3.0
    assert CpuModel(1, {**ONE_GBPS, "copy": 5.0}).copy_gbps(10**6) == 5.0
    # a lower bound knows no sizes: its copies go at the fastest rate
    assert model.seconds({"copy": 3 * 10**9, "crc32c": 10**9}) == pytest.approx(2.0)

    async def run(sizes: list[int]) -> float:
        cpu = HostCpu(model, name="host")
        with cpu.active():
            for n in sizes:
                work.count("copy", n)
                work.count("crc32c", n)  # other kinds keep their one rate
            await work.settle()
        return clock.monotonic()

    # 1 GB as a thousand 1 MB copies (1 s) or ten 100 MB ones (1/3 s), plus 1 s of CRC
    assert clock.run_virtual(run([10**6] * 1000)) == pytest.approx(2.0)
    assert clock.run_virtual(run([10**8] * 10)) == pytest.approx(1 + 1 / 3)


@pytest.mark.parametrize(
    "sizes",
    [((10**6, 0.0),), ((0, 1.0),), ((10**8, 1.0), (10**6, 1.0)), ((10**6, 1.0), (10**6, 2.0))],
)
def test_copy_rates_by_size_are_positive_and_in_order(sizes: tuple[tuple[int, float], ...]) -> None:
    with pytest.raises(ValueError, match=r"copies of positive sizes|copy rates by size"):
        CpuModel(1, ONE_GBPS, copy_sizes=sizes)


def test_copies_by_size_are_measured_each_in_a_new_process() -> None:
    rates = copy_rates([1 << 20, 100_000, 1 << 20, 8, 1 << 30], total=16 << 20)
    assert sorted(rates) == [COPY_SIZES[0], 100_000, 1 << 20, COPY_SIZES[1]]
    assert all(0.05 < r < 1000 for r in rates.values())


def test_a_cpu_model_needs_every_rate_and_a_core() -> None:
    with pytest.raises(ValueError, match="at least one core"):
        CpuModel(0, ONE_GBPS)
    with pytest.raises(ValueError, match="rs-decode"):
        CpuModel(1, {k: 1.0 for k in work.KINDS if k != "rs-decode"})
    assert CpuModel(4, ASSUMED_SERVER_CORE).seconds({"crc32c": 20 * 10**9}) == 1.0


def test_measured_rates_are_this_machines() -> None:
    model = CpuModel.measure(repeat=1)
    assert model.cores >= 1
    assert set(model.gbps) == set(work.KINDS)
    assert all(0.01 < rate < 1000 for rate in model.gbps.values())


def test_slow_client_cpus_bound_the_save_and_the_report_says_so() -> None:
    """The same 64-rank save on hosts of one slow core is bound by the client CPUs: the
    report names them, the lower bound is theirs, and the save takes longer than it."""
    small = PRESETS["small-flash"].hardware
    fast = Scenario("llama3-8b", 64, "rs-6-3", small)
    slow_cpu = CpuModel(1, {k: 0.5 for k in work.KINDS})
    slow = dataclasses.replace(fast, hardware=dataclasses.replace(small, cpu=slow_cpu))
    a, b = project_checkpoint(fast), project_checkpoint(slow)
    assert b.bound_by == "client CPUs" and b.busiest == "client CPUs"
    assert b.duration_s > 3 * a.duration_s
    assert b.lower_bound_s <= b.duration_s
    # The same work (to a part in 10^4: timing changes hedged reservations and metadata),
    # charged at another rate; every byte encoded once, with the files' small headers. But
    # new block buffers: how many a host's recycler allocates depends on how many blocks
    # are in flight at once, which timing changes.
    new_a, new_b = a.cpu_work.pop("new-pages"), b.cpu_work.pop("new-pages")
    assert b.cpu_work == {k: pytest.approx(n, rel=1e-4) for k, n in a.cpu_work.items()}
    assert 0 < new_a <= a.bytes * 1.01 and 0 < new_b <= b.bytes * 1.01
    assert b.cpu_work["rs-encode"] == pytest.approx(b.bytes, rel=1e-3)


def test_an_embedded_clusters_nodes_spend_the_client_hosts_cpu() -> None:
    """Nodes in the client's process (``Hardware.embedded``): one device for every disk,
    and the page-cache copies of their reads are the one host's CPU work (their writes
    copy nothing: O_DIRECT from the writer's memory); a second client host is refused."""
    from tectonic_emu.config import ClusterConfig
    from tectonic_emu.sim.cluster import ModelCluster

    hw = dataclasses.replace(
        PRESETS["small-flash"].hardware, embedded=True, cpu=CpuModel(2, ONE_GBPS)
    )
    config = ClusterConfig(nodes=hw.servers, disks_per_node=hw.disks, encoding="r3")

    async def main() -> dict[str, int]:
        mc = ModelCluster(hw, config)
        assert len({id(d) for s in mc.servers for d in s.disks}) == hw.devices == 1
        (host,) = mc.add_clients(1)
        with pytest.raises(ValueError, match="one client host"):
            mc.add_clients(1)
        client = (await mc.client_cluster(host)).client()
        data = Synthetic.random(3, 10 << 20)
        with mc.cpus[host].active():
            await client.write_file("/f", data)
            assert await client.read("/f") == data
        return mc.cpus[host].total

    total = clock.run_virtual(main())
    # copied into the writer's block buffers (a Synthetic stands for a buffer, not bytes);
    # the three replicas written from there with O_DIRECT, no copy; read out of the page
    # cache into fresh memory once; checksums: the block's, the read's
    assert total["copy-warm"] == 10 << 20 and total["copy"] == 10 << 20
    assert total["crc32c"] >= 2 * (10 << 20)
    # two new block buffers: the second block's is taken while the first is in flight
    assert total["new-pages"] == 2 * (8 << 20)


@settings(max_examples=20, deadline=None)
@given(
    appends=st.lists(st.tuples(st.integers(1, 40_000), st.booleans()), min_size=1, max_size=12),
    enc=st.sampled_from(["r1", "rs-3-2"]),
)
def test_a_described_writer_takes_new_block_buffers_when_a_real_one_does(
    appends: list[tuple[int, bool]], enc: str
) -> None:
    """The same appends (sizes; whether each is ``bytes``, handed over in place when it
    starts a block), made once as bytes and once described, on a projected cluster of
    16 KiB blocks with a flush after each append but the last, every chunk acknowledged
    (no straggler outlives its block: their timing differs with the bytes' CPU work): the
    writer copies the same bytes into its block buffers, and its recycler
    (``bufpool.recycled``, in a new process: none yet) and the described writer's
    stand-ins (``bufpool.stand_in``) hand out new buffers as often, with blocks in flight
    holding theirs."""
    from tectonic_emu import bufpool
    from tectonic_emu.config import ClusterConfig
    from tectonic_emu.sim.cluster import ModelCluster

    hw = dataclasses.replace(PRESETS["small-flash"].hardware, cpu=CpuModel(2, ONE_GBPS))
    config = ClusterConfig(
        nodes=hw.servers, disks_per_node=hw.disks, encoding=enc, block_size=16 << 10
    )

    def run(described: bool) -> dict[str, int]:
        async def main() -> dict[str, int]:
            mc = ModelCluster(hw, config)
            (host,) = mc.add_clients(1)
            client = (await mc.client_cluster(host, write_ack="all")).client()
            with mc.cpus[host].active():
                async with client.open_writer("/f") as w:
                    for k, (n, as_bytes) in enumerate(appends):
                        piece = Synthetic.random(k, n)
                        if not described:
                            piece = piece.materialize()
                            piece = piece if as_bytes else bytearray(piece)
                        await w.append(piece, owned=as_bytes and described)
                        if k < len(appends) - 1:
                            await w.flush()
            return mc.cpus[host].total

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(bufpool, "_recyclers", {})  # a new process's
            return clock.run_virtual(main())

    real, synthetic = run(described=False), run(described=True)
    for kind in ("copy-warm", "new-pages"):
        assert real.get(kind, 0) == synthetic.get(kind, 0), kind


def test_each_node_call_costs_the_loop_its_measured_python() -> None:
    """With ``call_s`` of 1 ms, ten calls at once on a host of four cores take 10 ms of the
    loop: a call's Python is the loop's, one at a time, a quarter of it as its reply is
    taken up (``reply_share``) and the rest as the call is made: the ten made by 7.5 ms,
    the replies taken up one every 0.25 ms after. Without it, free."""

    async def run(call_s: float) -> list[float]:
        cpu = HostCpu(CpuModel(4, ONE_GBPS, call_s=call_s, reply_share=0.25), name="host")
        ends: list[float] = []

        async def call() -> None:
            with cpu.active():
                work.calls(1)
                await work.settle()
                work.calls(1, replies=True)
                await work.settle()
            ends.append(round(clock.monotonic(), 9))

        await asyncio.gather(*(call() for _ in range(10)))
        assert cpu.calls == 10  # replies are not calls
        return ends

    got = clock.run_virtual(run(1e-3))
    assert got == pytest.approx([7.5e-3 + k * 0.25e-3 for k in range(1, 11)])
    assert clock.run_virtual(run(0.0)) == [0.0] * 10


def test_a_reply_waits_for_the_loop_behind_work_already_on_it() -> None:
    """A 10 ms copy on the loop, then a call's reply due at 1 ms: the reply is taken up
    once the copy is done (10 ms, and its own share after), as a real loop runs a ready
    callback only between others."""

    async def run() -> list[float]:
        cpu = HostCpu(CpuModel(4, ONE_GBPS, call_s=2e-3, reply_share=0.5), name="host")
        ends: list[float] = []

        async def copy() -> None:
            with cpu.active():
                work.count("copy", 10**7)  # 10 ms at 1 GB/s, on the loop
                await work.settle()

        async def reply() -> None:
            await asyncio.sleep(1e-3)
            with cpu.active():
                work.calls(1, replies=True)
                await work.settle()
            ends.append(round(clock.monotonic(), 9))

        await asyncio.gather(copy(), reply())
        return ends

    assert clock.run_virtual(run()) == pytest.approx([10e-3 + 0.5 * 2e-3])
    with pytest.raises(ValueError, match="call's cost"):
        CpuModel(1, ONE_GBPS, call_s=-1.0)
    with pytest.raises(ValueError, match="reply's share"):
        CpuModel(1, ONE_GBPS, reply_share=1.5)


def test_each_block_and_each_ranks_save_costs_the_loop_its_measured_python(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``CpuModel.python_s``: the loop's Python per block written and per rank's state
    staged, counted where the real code does them (``BlockPipeline``, the saver). The
    probes of ``clients/loop_python.py`` make as many events on a real cluster and on a
    projected one; projected with 1 ms a block and 0.1 ms a rank, each probe's loop serves
    exactly that much more than with none; and the figures measured here are not below
    zero."""
    from functools import partial

    from clients import loop_python as lp
    from tectonic_emu.config import DEFAULT_BLOCK_SIZE
    from tectonic_emu.sim.machine import Machine

    with pytest.raises(ValueError, match="per event"):
        CpuModel(1, ONE_GBPS, python_s={"page": 1e-3})
    m = Machine(1.0, 2.0, 1000.0, 2000.0, 2e-4, 4e-4, 8000.0, 2, dict(ONE_GBPS), True)
    counted: list[dict[str, int]] = []
    add = HostCpu.add_event

    def spy(self: HostCpu, kind: str) -> None:
        add(self, kind)
        counted.append(dict(self.events))

    def loop_s(python_s: dict[str, float], probe, bs: int) -> float:  # type: ignore[no-untyped-def]
        hw = dataclasses.replace(m, python_s=python_s).hardware()
        return lp._projected(hw, probe, bs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HostCpu, "add_event", spy)
        blocks = partial(lp._blocks, 5, memoryview(b""))
        plain = loop_s({}, blocks, lp.BLOCK)
        assert counted[-1] == {"block": 5 * lp.WRITERS}
        charged = loop_s({"block": 1e-3}, blocks, lp.BLOCK)
        ranks = partial(lp._ranks, 40, memoryview(b""))
        plain_r = loop_s({}, ranks, DEFAULT_BLOCK_SIZE)
        assert counted[-1]["rank-save"] == 40
        charged_r = loop_s({"rank-save": 1e-4}, ranks, DEFAULT_BLOCK_SIZE)
    # To a microsecond: the two runs' ids and times differ, and with them the length of a
    # record or manifest by a few bytes, each a nanosecond of copies at these 1 GB/s rates
    # (CI once saw 4 ns).
    assert charged - plain == pytest.approx(5 * lp.WRITERS * 1e-3, abs=1e-6)
    assert charged_r - plain_r == pytest.approx(40 * 1e-4, abs=1e-6)
    costs = asyncio.run(lp.python_costs(tmp_path, m))
    assert set(costs) == set(work.EVENTS) and min(costs.values()) >= 0
    assert not list(tmp_path.iterdir())  # its clusters cleaned up
