"""Modelled disks and network (``tectonic_emu/sim/devices.py``, ``sim/fabric.py``) in virtual
time, against the arithmetic of their figures: issue 20's analytic cases."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tectonic_emu import clock
from tectonic_emu.coding.work import KINDS
from tectonic_emu.config import ClusterConfig
from tectonic_emu.sim.cluster import Hardware, ModelCluster
from tectonic_emu.sim.cpu import CpuModel, HostCpu
from tectonic_emu.sim.devices import FLASH, HDD, PRESETS, Disk, DiskModel
from tectonic_emu.sim.fabric import Fabric, FabricModel
from tectonic_emu.sim.metadata import MetadataModel, ModelKV
from tectonic_emu.sim.resources import QueueResource, SharedResource

GB = 1e9
MiB = 1 << 20


def timed(work: Callable[[], Awaitable[object]]) -> float:
    """Virtual seconds ``work()`` takes on a fresh virtual loop."""

    async def main() -> float:
        start = clock.monotonic()
        await work()
        return clock.monotonic() - start

    return clock.run_virtual(main())


# -- disks -----------------------------------------------------------------------------------
def test_one_big_write_runs_at_the_write_bandwidth_after_the_latency() -> None:
    disk = Disk(FLASH)
    took = timed(lambda: disk.write(64 * MiB))
    assert took == pytest.approx(FLASH.latency + 64 * MiB / FLASH.write_bw, rel=1e-9)
    assert disk.bytes_written == 64 * MiB and disk.ops == 1


def test_small_operations_together_reach_the_iops_figure_and_no_more() -> None:
    """20,000 4 KiB writes at once: the device's write IOPS bound them (0.1 s at 200K), plus
    one latency per queue-depth wave."""
    disk = Disk(FLASH)
    n = 20_000
    took = timed(lambda: asyncio.gather(*(disk.write(4096) for _ in range(n))))
    waves = n / FLASH.queue_depth
    assert n / FLASH.write_iops <= took <= n / FLASH.write_iops + waves * FLASH.latency * 1.01


def test_concurrent_reads_share_the_device() -> None:
    disk = Disk(FLASH)
    took = timed(lambda: asyncio.gather(disk.read(650 * MiB), disk.read(650 * MiB)))
    assert took == pytest.approx(FLASH.latency + 1300 * MiB / FLASH.read_bw, rel=1e-9)


def test_a_disk_head_seeks_for_every_operation() -> None:
    """On the HDD preset each operation costs its seek of device time: 100 reads of 1 MiB
    one after another take 100 x (seek + 1 MiB / bandwidth)."""
    disk = Disk(HDD)

    async def work() -> None:
        for _ in range(100):
            await disk.read(MiB)

    assert timed(work) == pytest.approx(100 * (HDD.seek + MiB / HDD.read_bw), rel=1e-9)


@pytest.mark.parametrize("model", [FLASH, HDD], ids=lambda m: m.name)
def test_a_small_read_behind_a_big_write(model: DiskModel) -> None:
    """Flash shares itself between what is in flight, so a small read started just after a
    big write ends first; a disk's head serves them in the order they came, so the read
    waits for the whole write (why a checkpoint's queue starves a loader's reads)."""
    disk = Disk(model)
    ended: list[str] = []

    async def op(name: str, io: Awaitable[None]) -> None:
        await io
        ended.append(name)

    async def work() -> None:
        write = asyncio.ensure_future(op("write", disk.write(256 * MiB)))
        await asyncio.sleep(0)
        await op("read", disk.read(64 * 1024))
        await write

    took = timed(work)
    if model.one_at_a_time:
        assert ended == ["write", "read"]
        assert took == pytest.approx(
            model.service(256 * MiB, write=True) + model.service(64 * 1024, write=False)
        )
    else:
        assert ended == ["read", "write"]


def test_a_queue_depth_of_one_serialises_the_latency() -> None:
    model = DiskModel("qd1", 1e9, 1e9, 1e6, 1e6, 1e-3, 0.0, 1, "test")
    disk = Disk(model, time=QueueResource(1.0))
    took = timed(lambda: asyncio.gather(*(disk.write(1000) for _ in range(10))))
    assert took == pytest.approx(10 * (1e-3 + 1e-6), rel=1e-9)


def test_writes_wait_their_own_latency_and_overlap_it() -> None:
    """A write alone takes ``write_latency`` and its bytes, a read ``latency`` and its bytes;
    eight writes at once wait their latency together and share the bandwidth (this
    machine's synced chunk files: the journal commits overlap, sim/machine.py)."""
    model = DiskModel("synced", 2e9, 1e9, 1e6, 1e6, 1e-4, 0.0, 32, "test", write_latency=2e-3)
    assert timed(lambda: Disk(model).write(8 * MiB)) == pytest.approx(2e-3 + 8 * MiB / 1e9)
    assert timed(lambda: Disk(model).read(8 * MiB)) == pytest.approx(1e-4 + 8 * MiB / 2e9)
    disk = Disk(model)
    took = timed(lambda: asyncio.gather(*(disk.write(8 * MiB) for _ in range(8))))
    assert took == pytest.approx(2e-3 + 64 * MiB / 1e9)
    with pytest.raises(ValueError, match="write_latency"):
        DiskModel("bad", 1e9, 1e9, 1.0, 1.0, 0.0, 0.0, 1, "", write_latency=-1.0)


def test_a_flush_waits_for_the_writes_the_device_holds_then_writes_its_bytes() -> None:
    """An fsync's barrier: a 4 KiB flush begun beside a 64 MiB write ends after it (and
    its own page), where a plain 4 KiB write beside it takes its share and ends first; a
    flush on an idle device is a write."""
    model = DiskModel("d", 1e9, 1e9, 1e6, 1e6, 0.0, 0.0, 32, "test")
    big = 64 * MiB / 1e9

    async def beside(small: Callable[[Disk], Awaitable[None]]) -> tuple[float, float]:
        disk = Disk(model)
        t0 = clock.monotonic()
        ends: list[float] = []

        async def timed_end(work: Awaitable[None]) -> None:
            await work
            ends.append(clock.monotonic() - t0)

        await asyncio.gather(timed_end(disk.write(64 * MiB)), timed_end(small(disk)))
        return ends[0], ends[1]

    first, flushed = clock.run_virtual(beside(lambda d: d.flush(4096)))
    assert first == pytest.approx(big, rel=1e-6)
    assert flushed == pytest.approx(big + 4096 / 1e9, rel=1e-6)
    small_end, _ = clock.run_virtual(beside(lambda d: d.write(4096)))
    assert small_end < 1e-5
    assert timed(lambda: Disk(model).flush(4096)) == pytest.approx(4096 / 1e9)


def test_disk_presets_name_their_sources_and_bad_figures_are_refused() -> None:
    for model in PRESETS.values():
        assert "Assumed" in model.source and len(model.source) > 80
    with pytest.raises(ValueError, match="write_bw"):
        DiskModel("bad", 1e9, 0.0, 1.0, 1.0, 0.0, 0.0, 1, "")
    with pytest.raises(ValueError, match="queue depth"):
        DiskModel("bad", 1e9, 1e9, 1.0, 1.0, 0.0, 0.0, 0, "")


# -- the network -----------------------------------------------------------------------------
@pytest.mark.parametrize("discipline", [SharedResource, QueueResource])
def test_one_flow_over_a_link_takes_size_over_bandwidth(discipline: type) -> None:
    """Issue 20: one flow over a 1 GB/s link takes size / 1 GB/s within 1% (here exactly),
    plus half the round trip."""
    fabric = Fabric(FabricModel(nic_gbps=8.0, rtt=0.004), discipline=discipline)
    a, b = fabric.add_rack(2)
    assert timed(lambda: fabric.send(a, b, int(3 * GB))) == pytest.approx(3.002, rel=1e-9)
    assert (a.sent, b.received) == (3 * GB, 3 * GB)
    assert timed(lambda: fabric.send(a, a, int(GB))) == 0.0  # within a host: free


def test_two_flows_into_one_host_share_its_nic() -> None:
    fabric = Fabric(FabricModel(nic_gbps=8.0))
    a, b, c = fabric.add_rack(3)
    took = timed(lambda: asyncio.gather(fabric.send(a, c, int(GB)), fabric.send(b, c, int(GB))))
    assert took == pytest.approx(2.0, rel=1e-9)


@pytest.mark.parametrize("oversubscription", [1.0, 2.0, 4.0])
def test_an_oversubscribed_uplink_divides_a_racks_throughput(oversubscription: float) -> None:
    """Issue 20: 4 hosts of one rack each send 1 GB to a host of another rack over 1 GB/s
    NICs. Non-blocking, that takes 1 s; a 2:1 uplink halves the rack's throughput (2 s), 4:1
    quarters it. Within the rack, nothing changes."""
    fabric = Fabric(FabricModel(nic_gbps=8.0, oversubscription=oversubscription))
    left, right = fabric.add_rack(4), fabric.add_rack(4)

    def across() -> Awaitable[object]:
        return asyncio.gather(
            *(fabric.send(s, d, int(GB)) for s, d in zip(left, right, strict=True))
        )

    def within() -> Awaitable[object]:
        pairs = [(left[0], left[1]), (left[1], left[2]), (left[2], left[3]), (left[3], left[0])]
        return asyncio.gather(*(fabric.send(s, d, int(GB)) for s, d in pairs))

    assert timed(across) == pytest.approx(oversubscription, rel=1e-9)
    assert timed(within) == pytest.approx(1.0, rel=1e-9)


def test_a_core_caps_the_traffic_between_racks_in_aggregate() -> None:
    """Three racks of 2 hosts on 1 GB/s NICs, and a 2 GB/s core. Rack 0 sends 1 GB from each
    host to rack 1 and rack 1 sends 1 GB from each host to rack 2, all at once: 4 GB through
    the core take 2 s, where the NICs alone allow 1 s. Within a rack the core is not held,
    and the core counts what it carried."""
    fabric = Fabric(FabricModel(nic_gbps=8.0, core_gbps=16.0))
    r0, r1, r2 = fabric.add_rack(2), fabric.add_rack(2), fabric.add_rack(2)
    pairs = [*zip(r0, r1, strict=True), *zip(r1, r2, strict=True)]
    took = timed(lambda: asyncio.gather(*(fabric.send(s, d, int(GB)) for s, d in pairs)))
    assert took == pytest.approx(2.0, rel=1e-9)
    assert fabric.core is not None and fabric.core.served == 4 * GB
    assert timed(lambda: fabric.send(r0[0], r0[1], int(GB))) == pytest.approx(1.0, rel=1e-9)
    assert fabric.core.served == 4 * GB
    assert Fabric(FabricModel(nic_gbps=8.0)).core is None


def test_what_hosts_received_counts_messages_in_flight_as_far_as_their_slowest_hop() -> None:
    """Two 1 GB messages into one host over 1 GB/s NICs share its ingress: half-way through
    (1 s) it has 1 GB of them, whatever their ends; once done, all 2 GB. A message that its
    source's NIC holds back counts as far as that NIC got, not its faster hops."""
    fabric = Fabric(FabricModel(nic_gbps=8.0, rtt=0.002))
    a, b, c = fabric.add_rack(3)
    seen: list[float] = []

    async def work() -> None:
        sends = asyncio.gather(fabric.send(a, c, int(GB)), fabric.send(b, c, int(GB)))
        await asyncio.sleep(1.0)
        seen.append(fabric.received_so_far({c}))
        seen.append(fabric.received_so_far({a, b}))
        await sends
        seen.append(fabric.received_so_far({c}))

    timed(work)
    assert seen == [pytest.approx(GB, rel=1e-9), 0.0, 2 * GB]

    fast = Fabric(FabricModel(nic_gbps=8.0, core_gbps=80.0))  # a 10 GB/s core
    (x,), (y,) = fast.add_rack(1), fast.add_rack(1)

    async def half() -> None:
        sending = asyncio.ensure_future(fast.send(x, y, int(GB)))
        await asyncio.sleep(0.5)
        seen.append(fast.received_so_far({y}))
        await sending

    timed(half)
    assert seen[-1] == pytest.approx(GB / 2, rel=1e-9)


def test_bad_fabric_figures_are_refused() -> None:
    for kwargs in ({"nic_gbps": 0.0}, {"nic_gbps": 1.0, "rtt": -1.0},
                   {"nic_gbps": 1.0, "oversubscription": 0.5},
                   {"nic_gbps": 1.0, "core_gbps": 0.0}):  # fmt: skip
        with pytest.raises(ValueError):
            FabricModel(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Fabric(FabricModel(nic_gbps=1.0)).add_rack(0)


# -- metadata ----------------------------------------------------------------------------------
def test_a_10_kqps_shard_caps_creates() -> None:
    """Issue 20: 100 clients each create 20 directories in a directory of their own,
    through the real client. With one metadata shard of 10 KQPS, the run takes what its
    operations cost at 10,000 a second (the shard never idles while any client waits). With
    16 it takes what the busiest shard's operations cost: the root's, which every path's
    walk reads. And the names of one directory share its shard, as in Tectonic's Name
    layer: 2,000 in one directory gain little from 16 shards."""

    async def main(shards: int, *, one_dir: bool = False) -> tuple[float, float, float]:
        model = MetadataModel(shards=shards, qps=10_000.0)
        hw = Hardware(9, 1, FLASH, FabricModel(nic_gbps=100.0), metadata=model)
        mc = ModelCluster(hw, ClusterConfig(nodes=9, disks_per_node=1, encoding="r3"))
        hosts = mc.add_clients(100)
        clients = [(await mc.client_cluster(h)).client() for h in hosts]
        assert isinstance(mc.kv, ModelKV)
        served0 = sum(s.served for s in mc.kv.shards)
        start = clock.monotonic()

        async def one(k: int) -> None:
            home = "" if one_dir else f"/c{k}"
            if home:
                await clients[k].mkdir(home)
            for i in range(20):
                await clients[k].mkdir(f"{home}/d{k}-{i}")

        await asyncio.gather(*(one(k) for k in range(100)))
        ops = sum(s.served for s in mc.kv.shards) - served0
        busiest = max(s.served for s in mc.kv.shards)
        return clock.monotonic() - start, ops, busiest

    took, ops, _ = clock.run_virtual(main(1))
    assert ops >= 2100 * 2  # at least a lookup and a write per directory
    assert took == pytest.approx(ops / 10_000, rel=0.02)
    wide, wide_ops, busiest = clock.run_virtual(main(16))
    assert wide_ops == ops and wide == pytest.approx(busiest / 10_000, rel=0.1)
    assert wide < took / 2
    hot, _, _ = clock.run_virtual(main(16, one_dir=True))
    alone, _, _ = clock.run_virtual(main(1, one_dir=True))
    assert hot > 0.6 * alone


def test_durable_writes_sync_their_log_on_the_device_they_share() -> None:
    """With ``log_bytes`` and a log device, each durable transaction that wrote syncs a page
    there, and so waits behind the device's other work; reads and non-durable writes do
    not touch it."""
    hdd = Disk(HDD, name="shared")
    kv = ModelKV(MetadataModel(1, 1e9, 0.0, log_bytes=4096), log=hdd)

    async def main() -> list[float]:
        times = []
        for durable, write in ((True, True), (True, False), (False, True)):
            t0 = clock.monotonic()
            async with kv.transaction(durable=durable) as tx:
                if write:
                    await tx.put(b"n\x00\x01k", b"v")
                else:
                    await tx.get(b"n\x00\x01k")
            times.append(clock.monotonic() - t0)
        return times

    synced, read, lazy = clock.run_virtual(main())
    assert synced == pytest.approx(HDD.service(4096, write=True), rel=1e-6) and synced > 0.004
    assert read == pytest.approx(0, abs=1e-6) and lazy == pytest.approx(0, abs=1e-6)
    assert hdd.bytes_written == 4096


def test_commits_share_flushes_of_the_log_and_sync_waits_for_one() -> None:
    """The real group commit (``GroupCommit``) on the model's log: a commit that need not be
    durable costs the log nothing until ``sync``, which flushes its page; twenty durable
    commits at once share a few flushes (one at a time, each covering every commit counted
    before it began) instead of twenty, and every page appended is written once."""
    hdd = Disk(HDD, name="shared")
    kv = ModelKV(MetadataModel(1, 1e9, 0.0, log_bytes=4096), log=hdd)
    page = HDD.service(4096, write=True)

    async def put(k: int, *, durable: bool) -> None:
        async with kv.transaction(durable=durable) as tx:
            await tx.put(b"n\x00\x01%d" % k, b"v")

    async def main() -> tuple[float, float, float]:
        t0 = clock.monotonic()
        await put(0, durable=False)
        lazy = clock.monotonic() - t0
        t0 = clock.monotonic()
        await kv.sync()
        synced = clock.monotonic() - t0
        t0 = clock.monotonic()
        await asyncio.gather(*(put(k, durable=True) for k in range(1, 21)))
        return lazy, synced, clock.monotonic() - t0

    lazy, synced, twenty = clock.run_virtual(main())
    assert lazy == pytest.approx(0, abs=1e-9) and synced == pytest.approx(page, rel=1e-6)
    assert twenty < 3 * page + 19 * 4096 / HDD.write_bw  # not 20 flushes one after another
    assert hdd.bytes_written == 21 * 4096 and hdd.ops < 5


@pytest.mark.parametrize("serial_s", [0.0, 1e-3])
def test_a_store_of_one_connection_serves_one_transaction_at_a_time(serial_s: float) -> None:
    """Ten transactions at once on a store that holds each for 1 ms (SQLite's one
    connection) end 1 ms apart, the last at 10 ms; with no hold they overlap, each taking
    only its round trip (2 ms)."""
    kv = ModelKV(MetadataModel(4, 1e9, 2e-3 if not serial_s else 0.0, serial_s=serial_s))

    async def main() -> list[float]:
        ends: list[float] = []

        async def one(k: int) -> None:
            async with kv.transaction() as tx:
                await tx.get(b"n\x00" + bytes([k]) + b"k")
            ends.append(round(clock.monotonic(), 9))

        await asyncio.gather(*(one(k) for k in range(10)))
        return ends

    ends = clock.run_virtual(main())
    if serial_s:
        assert ends == pytest.approx([(k + 1) * 1e-3 for k in range(10)], abs=1e-8)
    else:
        assert ends == pytest.approx([2e-3] * 10, abs=1e-8)
    with pytest.raises(ValueError, match="hold"):
        MetadataModel(1, 1.0, serial_s=-1.0)


@pytest.mark.parametrize("hops", [False, True])
def test_a_store_on_the_clients_thread_costs_its_loop_a_call_a_hop(hops: bool) -> None:
    """With ``hops`` (SQLiteKV embedded), each read that misses the transaction's own
    writes and each commit is a hop to the store's thread, which the client's loop pays as
    a node call (1 ms here): a transaction of two such reads, a read of its own write and
    a commit costs 3 ms (three calls); a durable one adds the log's flush, itself a hop to
    the thread that syncs it; without ``hops``, nothing."""
    model = MetadataModel(1, 1e9, 0.0, log_bytes=4096, hops=hops)
    kv = ModelKV(model, log=Disk(FLASH, name="log"))
    cpu = HostCpu(CpuModel(1, {k: 1.0 for k in KINDS}, call_s=1e-3), name="host")

    async def txn(durable: bool) -> float:
        t0 = clock.monotonic()
        async with kv.transaction(durable=durable) as tx:
            await tx.get(b"n\x00\x01a")
            await tx.put(b"n\x00\x01b", b"v")
            await tx.get(b"n\x00\x01b")  # its own write: no hop
            await tx.get(b"n\x00\x02c")
        return clock.monotonic() - t0

    async def main() -> tuple[float, float, int]:
        with cpu.active():
            lazy = await txn(durable=False)
            durable = await txn(durable=True)
        return lazy, durable, cpu.calls

    lazy, durable, calls = clock.run_virtual(main())
    flush = FLASH.service(8192, write=True) + FLASH.latency
    if hops:
        assert lazy == pytest.approx(3e-3, abs=1e-7) and calls == 3 + 3 + 1
        assert durable == pytest.approx(4e-3 + flush, rel=1e-3)
    else:
        assert lazy == pytest.approx(0, abs=1e-7) and calls == 0
        assert durable == pytest.approx(flush, rel=1e-3)


def test_a_read_outside_a_transaction_is_one_hop_and_holds_no_connection() -> None:
    """``get`` and ``scan`` outside a transaction go to ``SQLiteKV``'s reader connection:
    one hop each (1 ms of the loop here), no commit, and none of the transactions' one
    connection (``serial_s``, 5 ms), so ten of them at once do not queue behind it."""
    model = MetadataModel(1, 1e9, 0.0, serial_s=5e-3, hops=True)
    kv = ModelKV(model)
    cpu = HostCpu(CpuModel(4, {k: 1.0 for k in KINDS}, call_s=1e-3), name="host")

    async def main() -> tuple[float, int]:
        with cpu.active():
            t0 = clock.monotonic()
            await asyncio.gather(
                *(kv.get(b"n\x00\x01%d" % k) for k in range(5)),
                *(kv.scan(b"n\x00\x02%d" % k) for k in range(5)),
            )
            return clock.monotonic() - t0, cpu.calls

    took, calls = clock.run_virtual(main())
    assert calls == 10 and took == pytest.approx(10e-3, abs=1e-6)  # the one loop, no 50 ms
