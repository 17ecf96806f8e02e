"""This machine, measured: the figures of the ``this-machine`` preset.

Measured by the code the real runs use, in a directory on the disk the runs use:

- **the device:** as a real ``LocalNode`` uses it: 8 MiB chunks from buffers of the kind a
  writer's blocks are (``SOURCES``; ``O_DIRECT``, no copy) each written and fdatasync'd,
  then read back cold through the page cache (its bandwidths; the page-cache copy is also
  charged as the nodes' ``copy`` work, on the CPU, which overlaps the device); the same
  write alone (what it waits beyond its bytes and its call, ``DiskModel.write_latency``);
  and 4 KiB chunks written with fdatasync and read back cold (its small operations). All
  ``QUEUE_DEPTH`` at once, through a pool of as many threads: an embedded cluster's I/O
  pool. This used to be fio's direct I/O on one file: its writes measured 2.0-2.8 GB/s on
  2026-12-06 where the node's chunk writes got 1.5-1.8 (each chunk file's fdatasync commits
  ext4's journal; fio's one file has none to commit), and its direct reads 1.5-1.9 GB/s in a
  run whose real loads were the fastest of the day;
- **a node call:** a ``LocalNode.stat_chunk`` round trip through its I/O pool, the price
  of every call (embedded nodes have no network); and the same calls ``CALLS_AT_ONCE`` at
  once, whose time each is what the loop spends on a call, since their waits overlap:
  charged to the loop per call (``CpuModel.call_s``), the rest of a call's round trip as
  the fabric's; and the part of that loop time spent taking up the replies (the loop's
  CPU time from the calls' start until each is handed to the I/O pool, against its time
  from then until every reply is in): charged as each reply arrives, behind whatever
  the loop is doing then (``CpuModel.reply_share``);
- **metadata:** a SQLite store's transactions one after another (their time is what each
  holds of its one connection, since SQLite serves one at a time: 64 at once took as
  long each, 0.78-0.95 ms against 0.83), its reads in one transaction (their rate is the
  shard's), and a page of its WAL synced on the device by each transaction that writes;
- **the client's CPU:** ``CpuModel.measure()`` on this machine's cores, and the rate at
  which the host gives the process fresh memory (``fresh_memory_gb_s``, first thing, while
  the process's memory is still new); embedded nodes have no wire, so frames cost no CPU;
- **copies by size:** a copy into fresh memory of each value size the workload loads, and
  of a chunk (``copy_rates``, each in a new process). One rate did not fit both: in real
  loads, 0.94 MB values copied at 1.73-1.77 GB/s of the loop's CPU and 60 MB ones at
  2.08-2.23, as copies alone in a new process measured them (1.74 and 1.97-2.13), where
  ``CpuModel.measure``'s 8 MiB ``copy`` gave 1.94 for both (2026-12-06).

``Machine.hardware()`` is an embedded cluster of ``NODES`` nodes of ``DISKS`` disks on it
(``Hardware.embedded``: one device, the nodes' CPU work the one host's). ``bench sim``
compares projections on it with real runs (docs/simulate.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import mmap
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tectonic_emu.bufpool import uninitialised
from tectonic_emu.chunkstore import LocalNode
from tectonic_emu.cluster import IO_THREADS
from tectonic_emu.coding import crc32c
from tectonic_emu.metadata import SQLiteKV
from tectonic_emu.sim.cluster import Hardware
from tectonic_emu.sim.cpu import CpuModel, copy_rates
from tectonic_emu.sim.devices import DiskModel
from tectonic_emu.sim.fabric import FabricModel
from tectonic_emu.sim.metadata import MetadataModel

NODES, DISKS = 9, 2  # an embedded cluster's (Cluster.create's defaults for rs-6-3)
QUEUE_DEPTH = IO_THREADS  # chunk operations at once in the device measurement
BIG_CHUNK = 8 << 20  # the write bandwidth's chunks: a block of the default size at r1
CALLS_AT_ONCE = 64  # node calls at once in the measurement of a call's cost on the loop
# Buffers the device's chunk writes come from, of the kind a writer's blocks are
# (``bufpool.uninitialised``: malloc's heap, huge pages where numpy asks for them). The
# device's rate here follows the memory a write comes from: virtio-blk takes at most 254
# segments a request, and physically contiguous pages are one segment, so one 8 MiB
# O_DIRECT write went in 12-15 requests from a fresh shared ``mmap`` (4 KiB pages in the
# order the kernel gave them) and in 2 from huge pages. Six interleaved rounds
# (2026-12-06): chunk writes from one fresh ``mmap`` (the probe until then) 1.30-1.50 GB/s,
# from these buffers 1.71-1.88, from huge pages 1.72-1.93; a real 16-rank r3 save beside
# them wrote at 1.44-1.64.
SOURCES = 4


def drop_caches() -> bool:
    """Write back and drop the page cache (root only). True when it worked."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def device_busy_s(path: Path) -> float | None:
    """Seconds the block device holding ``path`` has had a request in flight since boot
    (``io_ticks``, the tenth field of its ``/sys/dev/block/MAJOR:MINOR/stat``); None where
    there is none to read (tmpfs, overlays, another kernel). Two readings around a run give
    the share of it the device was busy."""
    dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    try:
        return int(stat.read_text().split()[9]) / 1e3
    except (OSError, IndexError, ValueError):
        return None


# The guest kernel's free page reporting (virtio-balloon): blocks of 2**order pages freed in
# the guest are handed back to the host, and the next touch of each page waits for the host
# to fault it in again. An order above the largest block the kernel has stops it.
PAGE_REPORTING = Path("/sys/module/page_reporting/parameters/page_reporting_order")
NO_REPORTING_ORDER = 11  # x86-64's largest block is order 10 (MAX_PAGE_ORDER)


@contextmanager
def page_reporting_held(path: Path = PAGE_REPORTING) -> Iterator[bool]:
    """Within it, memory this guest frees stays its own (free page reporting off, root
    only); the order before is put back at the end. Yields whether it was held: False where
    the kernel reports no free pages, refuses the order, or the caller is not root.

    On this project's VMs the host took freed memory back within seconds, and the next
    touch of it ran at 0.4 GB/s against 1.1-1.5 with reporting held (2026-12-06, both
    cores busy; ../shared/MACHINE.md's first quirk): a load's time followed what the host
    had taken back, 2-4x from one round to the next."""
    try:
        before = path.read_text().strip()
        path.write_text(f"{NO_REPORTING_ORDER}\n")
        held = path.read_text().strip() == str(NO_REPORTING_ORDER)
    except OSError:
        yield False
        return
    try:
        yield held
    finally:
        path.write_text(f"{before}\n")


# Of the memory a run may still take (``resources.memory_available``), what bench sim warms.
WARM_FRACTION = 0.5
_WARM_STEP = 256 << 20  # bytes mapped at a time
_ZEROS = bytes(1 << 20)


def warm_free_memory(nbytes: int) -> float:
    """Touch ``nbytes`` of new memory, all of it held at once, then free it: seconds taken.
    Within ``page_reporting_held`` the pages stay the guest's, so the run after it takes
    pages the host has already given, at the guest's own rate.

    Holding page reporting keeps only what the guest frees from then on. Memory freed
    before, or never touched since boot, still waits for the host on its first touch, and
    a process's first loads met it: a real 16-rank r1 load took 3.5, 2.1, 1.4, 1.06, 0.97
    s in the first five rounds of a process, its system time 4.2, 2.0, 1.4, 0.8, 0.6 s
    (page faults); after 18 GB warmed, 0.89-1.14 s from the first round, system time
    0.6-0.8 s (2026-12-06)."""
    maps: list[mmap.mmap] = []
    t0 = time.perf_counter()
    try:
        left = nbytes
        while left > 0:
            n = min(left, _WARM_STEP)
            m = mmap.mmap(-1, n)
            maps.append(m)
            for off in range(0, n, len(_ZEROS)):
                m[off : off + len(_ZEROS)] = _ZEROS[: n - off]
            left -= n
    finally:
        for m in maps:
            m.close()
    return time.perf_counter() - t0


@dataclass(frozen=True, slots=True)
class Machine:
    """What ``this-machine`` is made of, each figure measured (``measure``)."""

    write_gb_s: float  # a LocalNode's 8 MiB chunk writes, fdatasync'd, QUEUE_DEPTH at once
    read_gb_s: float  # the same chunks read back cold, QUEUE_DEPTH at once
    write_iops: float  # 4 KiB chunk writes per second, QUEUE_DEPTH at once
    read_iops: float
    call_s: float  # one node call through the I/O pool
    txn_s: float  # one metadata transaction (a read), one after another
    meta_ops: float  # metadata reads per second in one transaction
    cores: int
    cpu_gb_s: dict[str, float]  # per core, each kind of work (CpuModel.measure)
    cold_reads: bool  # whether the page cache could be dropped (root)
    fresh_gb_s: float = 0.0  # copies into fresh memory, all threads together (0: not limited)
    call_cpu_s: float = 0.0  # the loop's time per node call, CALLS_AT_ONCE at once
    write_latency_s: float = 0.0  # an 8 MiB chunk write alone, beyond bytes and call
    # GB/s of one core's copies into fresh memory by size (bytes, as text: JSON's keys)
    copy_gb_s: dict[str, float] = field(default_factory=dict)
    reply_share: float = 0.0  # the part of a call's loop time spent taking up its reply
    # the loop's Python per event of work.EVENTS beyond its calls (clients/loop_python.py)
    python_s: dict[str, float] = field(default_factory=dict)

    def hardware(self) -> Hardware:
        return Hardware(
            servers=NODES,
            disks=DISKS,
            disk=DiskModel(
                read_bw=self.read_gb_s * 1e9,
                write_bw=self.write_gb_s * 1e9,
                read_iops=self.read_iops,
                write_iops=self.write_iops,
                latency=0.0,
                write_latency=self.write_latency_s,
                seek=0.0,
                queue_depth=QUEUE_DEPTH,
                name="this machine's device",
                source="measured (tectonic_emu/sim/machine.py)",
            ),
            # In-process nodes: no NIC to speak of (memory), a call's round trip is the hop,
            # less what the loop spends on it (charged to the loop, ``call_cpu_s``).
            fabric=FabricModel(nic_gbps=8_000.0, rtt=max(0.0, self.call_s - self.call_cpu_s)),
            servers_per_rack=NODES,
            # SQLite on the one device: one transaction at a time (its time beyond the
            # read it made), each write transaction syncs a page of its WAL there, and
            # each hop to its thread costs the loop what a node call does.
            metadata=MetadataModel(
                1,
                self.meta_ops,
                0.0,
                "measured: SQLite here",
                log_bytes=4096,
                serial_s=max(0.0, self.txn_s - 1 / self.meta_ops),
                hops=True,
            ),
            cpu=CpuModel(
                self.cores,
                self.cpu_gb_s,
                "measured (tectonic_emu/sim/machine.py)",
                fresh_gb_s=self.fresh_gb_s or None,
                call_s=self.call_cpu_s,
                copy_sizes=tuple(sorted((int(n), r) for n, r in self.copy_gb_s.items())),
                reply_share=self.reply_share,
                python_s=dict(self.python_s),
            ),
            embedded=True,
        )


async def measure(directory: Path, value_sizes: Iterable[int] = ()) -> Machine:
    """``this-machine``'s figures (module docstring), measured in ``directory``, with
    copies of ``value_sizes`` (the sizes of the values a projection will load) and of a
    chunk."""
    cpu = CpuModel.measure()
    copies = await asyncio.to_thread(copy_rates, {BIG_CHUNK, *value_sizes})
    work = Path(tempfile.mkdtemp(prefix="tectonic-sim-machine-", dir=directory))
    pool = concurrent.futures.ThreadPoolExecutor(QUEUE_DEPTH)
    try:
        node = LocalNode(work / "node", 0, 1, executor=pool)
        device = await _device(node)
        small = os.urandom(4096)
        write_small = await _chunk_ops(node, "s", 256, [small])
        cold = drop_caches()
        read_small = await _chunk_ops(node, "s", 256)
        t0 = time.perf_counter()
        for _ in range(200):
            await node.stat_chunk(0, "s0")
        call_s = (time.perf_counter() - t0) / 200
        call_cpu_s = await _call_cost(node)
        reply_share = await _reply_share(node)
        await node.close()
        txn_s, meta_ops = await _metadata(work / "meta.db")
    finally:
        pool.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return Machine(
        write_gb_s=device.write_gb_s,
        read_gb_s=device.read_gb_s,
        write_latency_s=device.write_latency_s,
        write_iops=256 / write_small,
        read_iops=256 / read_small,
        call_s=call_s,
        call_cpu_s=call_cpu_s,
        txn_s=txn_s,
        meta_ops=meta_ops,
        cores=cpu.cores,
        cpu_gb_s=dict(cpu.gbps),
        cold_reads=cold,
        fresh_gb_s=cpu.fresh_gb_s or 0.0,
        copy_gb_s={str(n): rate for n, rate in copies.items()},
        reply_share=reply_share,
    )


async def _chunk_ops(
    node: LocalNode,
    prefix: str,
    count: int,
    payloads: Sequence[bytes | memoryview] = (),
) -> float:
    """Seconds for ``count`` chunk writes, QUEUE_DEPTH at once, chunk ``k`` written from
    ``payloads[k % len(payloads)]``; without ``payloads``, the same chunks read back."""
    crcs = [crc32c(p) for p in payloads]
    gate = asyncio.Semaphore(QUEUE_DEPTH)

    async def one(k: int) -> None:
        async with gate:
            if not payloads:
                await node.read_chunk(0, f"{prefix}{k}")
            else:
                i = k % len(payloads)
                await node.write_chunk(0, f"{prefix}{k}", payloads[i], crc32c=crcs[i])

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(count)))
    return time.perf_counter() - t0


@dataclass(frozen=True, slots=True)
class Device:
    """The device as a node uses it (module docstring): GB/s of chunk writes and of reads,
    and the seconds a chunk write alone waits beyond its bytes and its call (fdatasync's
    journal commit), which writes at once overlap."""

    write_gb_s: float
    read_gb_s: float
    write_latency_s: float


async def measure_device(directory: Path, total: int = 512 << 20) -> Device:
    """The device under ``directory`` as ``measure`` takes it, ``total`` bytes each way:
    on a shared VM its rates swing 1.3-2.5 (write) and 1.9-3.2 (read) GB/s from one
    minute to the next (2026-12-06), so ``bench sim`` takes them again beside each real
    run."""
    work = Path(tempfile.mkdtemp(prefix="tectonic-sim-device-", dir=directory))
    pool = concurrent.futures.ThreadPoolExecutor(QUEUE_DEPTH)
    try:
        node = LocalNode(work / "node", 0, 1, executor=pool)
        try:
            return await _device(node, total)
        finally:
            await node.close()
    finally:
        pool.shutdown()
        shutil.rmtree(work, ignore_errors=True)


async def _device(node: LocalNode, total: int = 512 << 20) -> Device:
    """``node``'s chunk writes and reads (module docstring), written from buffers of the
    kind a writer fills (``SOURCES``)."""
    data = os.urandom(BIG_CHUNK)
    sources = [uninitialised(BIG_CHUNK) for _ in range(SOURCES)]
    for buf in sources:
        buf[:] = data
    count = max(1, total // BIG_CHUNK)
    write_gb_s = count * BIG_CHUNK / await _chunk_ops(node, "b", count, sources) / 1e9
    alone = await _one_at_a_time(node, sources[0])
    drop_caches()
    read_gb_s = count * BIG_CHUNK / await _chunk_ops(node, "b", count) / 1e9
    for k in range(count):  # the small operations' measurement is not to find them
        await node.delete_chunk(0, f"b{k}")
    return Device(write_gb_s, read_gb_s, max(0.0, alone - BIG_CHUNK / (write_gb_s * 1e9)))


async def _one_at_a_time(node: LocalNode, view: memoryview, count: int = 8) -> float:
    """Seconds a BIG_CHUNK write takes alone, less a call's round trip (``stat_chunk``):
    the medians of ``count`` of each, the chunks deleted after."""
    crc = crc32c(view)
    writes, calls = [], []
    for k in range(count):
        t0 = time.perf_counter()
        await node.write_chunk(0, f"a{k}", view, crc32c=crc)
        writes.append(time.perf_counter() - t0)
    for k in range(count):
        t0 = time.perf_counter()
        await node.stat_chunk(0, f"a{k}")
        calls.append(time.perf_counter() - t0)
    for k in range(count):
        await node.delete_chunk(0, f"a{k}")
    return max(0.0, statistics.median(writes) - statistics.median(calls))


async def _call_cost(node: LocalNode, calls: int = 2000) -> float:
    """Seconds per node call with CALLS_AT_ONCE calls at once: their round trips overlap,
    so what is left is each call's Python on the loop and the I/O pool's hand-offs, which
    are done one at a time."""
    gate = asyncio.Semaphore(CALLS_AT_ONCE)

    async def one() -> None:
        async with gate:
            await node.stat_chunk(0, "s0")

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    return (time.perf_counter() - t0) / calls


async def _reply_share(node: LocalNode, rounds: int = 9) -> float:
    """The part of a node call's time on the loop spent taking up its reply (``CpuModel.
    reply_share``): CALLS_AT_ONCE calls started at once, the loop's CPU time until each has
    been handed to the I/O pool, against its CPU time from then until every reply is in.
    No reply is taken up before the first part ends: a call's reply is queued to the loop
    from a pool thread, behind the task that measures it. The median of ``rounds``."""
    shares = []
    for _ in range(rounds):
        t0 = time.thread_time()
        calls = [asyncio.ensure_future(node.stat_chunk(0, "s0")) for _ in range(CALLS_AT_ONCE)]
        await asyncio.sleep(0)  # each call's first step: sent
        t1 = time.thread_time()
        await asyncio.gather(*calls)
        t2 = time.thread_time()
        shares.append((t2 - t1) / max(t2 - t0, 1e-9))
    return statistics.median(shares)


async def _metadata(path: Path) -> tuple[float, float]:
    """(seconds per transaction of one read, one after another: the round trip, its sync
    being the device's; reads per second in one transaction)."""
    kv = await SQLiteKV.open(path)
    try:
        async with kv.transaction() as tx:
            for k in range(100):
                await tx.put(b"k%05d" % k, b"v" * 100)
        t0 = time.perf_counter()
        for k in range(200):
            async with kv.transaction() as tx:
                await tx.get(b"k%05d" % (k % 100))
        txn_s = (time.perf_counter() - t0) / 200
        t0 = time.perf_counter()
        async with kv.transaction() as tx:
            for k in range(2000):
                await tx.get(b"k%05d" % (k % 100))
        return txn_s, 2000 / (time.perf_counter() - t0)
    finally:
        await kv.close()


__all__ = [
    "DISKS",
    "NODES",
    "Device",
    "QUEUE_DEPTH",
    "Machine",
    "device_busy_s",
    "drop_caches",
    "measure",
    "measure_device",
    "NO_REPORTING_ORDER",
    "PAGE_REPORTING",
    "WARM_FRACTION",
    "page_reporting_held",
    "warm_free_memory",
]
