"""One seed of deterministic simulation testing, and many.

A seed sets everything: the encoding, the fault schedule, every writer's operations and
bytes, and (``entropy.seeded``) every id and token the real code draws. The whole cluster
runs in one process on the virtual clock (``clock.run_virtual``): model servers, the
metadata in memory, and the real clients, data path, writers and repair. So a seed's
run is the same every time, event for event, and a failing seed replays exactly from its
number (``SeedResult.replay``).

Invariants, checked as the run goes and at its end (``files.py`` for the reads):

- every acknowledged byte reads back, during the faults and after them;
- a crash leaves every committed block as many durable chunks as acknowledged it
  (``faults.py``);
- a delete that returned leaves nothing at the path;
- the Block layer's reverse index (each disk's blocks) equals a recount of the block
  records, and each tenant's usage a recount of its files (``files``, ``mixed``);
- repair, run during the faults in 30% of the seeds, finds no block lost;
- once the faults stop and repair has run, no block is unrecoverable and a scrub finds
  every chunk of every block in place and sound (full redundancy);
- no error other than a refused write reaches a writer (none is swallowed), and no task
  is left running.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from clients.dst.checkpoints import Saves, check_saves, checkpointers, run_saves
from clients.dst.faults import Injector, schedule
from clients.dst.files import Host, Ledger, check, check_tenants, make_tenants, run_host, until_up
from clients.dst.streams import read_epochs, store_dataset
from clients.projection import PRESETS, model_cluster
from tectonic_emu import buggify, clock, entropy
from tectonic_emu.cluster import Cluster
from tectonic_emu.coding import Encoding
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.services.repair import repair
from tectonic_emu.services.scrub import scrub
from tectonic_emu.sim.cluster import ModelCluster
from tectonic_emu.sim.metadata import MetadataModel, ModelKV

WORKLOADS = ("files", "checkpoint", "stream", "mixed")
ENCODINGS = ("r3", "rs-3-2")  # each survives two bad chunks of a block
SERVERS, DISKS, HOSTS = 8, 2, 2
BLOCK = 64 << 10  # bytes per chunk: files of a few blocks stay cheap to simulate
OPS = 24  # operations per host
PAUSE_S = 0.01  # at most this long between a host's operations
HORIZON_S = 0.4  # faults fall within this many virtual seconds of the start
FAULTS = (2, 8)  # faults per seed, at least and at most
# A sharded metadata store of no cost to speak of, which faults can take down or stall.
META = MetadataModel(shards=4, qps=1e6)
CKPT_TIMEOUT_S = 5.0  # a checkpoint step waits this long for its ranks
SERVICES = 0.3  # the share of seeds whose repair and scrub also run during the faults
STUCK_S = 60.0  # seconds of wall time after which a seed is given up as stuck


@dataclass(frozen=True, slots=True)
class SeedResult:
    """What one seed did: its violations (none, when all holds), the faults injected and
    the writers' operations by kind and outcome, the virtual seconds it took, and a digest
    of its whole trace (the same seed gives the same digest)."""

    seed: int
    workload: str
    encoding: str
    violations: tuple[str, ...]
    faults: dict[str, int]
    ops: dict[str, int]
    virtual_s: float
    trace: str

    @property
    def replay(self) -> str:
        """The command that runs this seed again, exactly."""
        return (
            f"tectonic-emu simulate faults --seeds 1 --seed {self.seed} --workload {self.workload}"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"replay": self.replay}


@dataclass(slots=True)
class Summary:
    """Many seeds: how many ran, those that failed, faults and operations in all."""

    first: int
    seeds: int = 0
    failed: list[SeedResult] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    ops: Counter[str] = field(default_factory=Counter)

    def add(self, r: SeedResult) -> None:
        self.seeds += 1
        self.faults.update(r.faults)
        self.ops.update(r.ops)
        if r.violations:
            self.failed.append(r)

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_seed": self.first,
            "seeds": self.seeds,
            "violations": sum(len(r.violations) for r in self.failed),
            "failed": [r.to_dict() for r in self.failed],
            "faults": dict(sorted(self.faults.items())),
            "ops": dict(sorted(self.ops.items())),
        }


def run_seed(seed: int, workload: str = "files", *, planted: Iterable[str] = ()) -> SeedResult:
    """Run seed ``seed`` of ``workload`` in virtual time, buggify points on; ``planted``:
    bugs to plant (``tectonic_emu/buggify.py``), for the tests that simulation finds them."""
    if workload not in WORKLOADS:
        raise ValueError(f"a workload is one of {', '.join(WORKLOADS)}, not {workload!r}")
    with entropy.seeded(seed), buggify.active(seed, planted=planted):
        return clock.run_virtual(_guarded(seed, workload))


async def _guarded(seed: int, workload: str) -> SeedResult:
    """``_run``, given up after ``STUCK_S`` seconds of wall time: a virtual loop with no
    timer left and every task waiting (a lock nobody will release) would otherwise block
    for ever, and a stuck seed is a failure like any other; so is one whose run raised."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    fired: list[bool] = []

    def give_up() -> None:  # on the loop's thread
        fired.append(True)
        task.cancel()

    timer = threading.Timer(STUCK_S, loop.call_soon_threadsafe, args=(give_up,))
    timer.start()
    try:
        return await _run(seed, workload)
    except asyncio.CancelledError:
        if not fired:
            raise
        why = (
            f"stuck: no end after {STUCK_S:g} s of wall time, at {clock.monotonic():.6f} "
            "virtual s (every task waiting on something nobody will do)"
        )
    except Exception as exc:  # the harness's own checks raised: this seed failed
        why = f"the run raised {type(exc).__name__}: {exc}"
    finally:
        timer.cancel()
    return SeedResult(
        seed=seed,
        workload=workload,
        encoding="?",
        violations=(why,),
        faults={},
        ops={},
        virtual_s=round(clock.monotonic(), 6),
        trace="",
    )


def run_seeds(
    first: int,
    count: int,
    workload: str = "files",
    progress: Callable[[], None] | None = None,
    *,
    planted: Iterable[str] = (),
) -> Summary:
    """Seeds ``first`` to ``first + count - 1``, one after another."""
    out = Summary(first)
    for seed in range(first, first + count):
        out.add(run_seed(seed, workload, planted=planted))
        if progress is not None:
            progress()
    return out


async def _run(seed: int, workload: str) -> SeedResult:
    rng = random.Random(seed)
    encoding = rng.choice(ENCODINGS)
    enc = Encoding.parse(encoding)
    tolerance = enc.width - enc.min_chunks
    hw = dataclasses.replace(
        PRESETS["small-flash"].hardware, servers=SERVERS, disks=DISKS, metadata=META, cpu=None
    )
    mc, hosts = model_cluster(hw, encoding, BLOCK, HOSTS, 16, 1)
    clusters = [await mc.client_cluster(h) for h in hosts]
    faults = schedule(
        random.Random(rng.getrandbits(64)),
        servers=SERVERS,
        victims=rng.randint(0, tolerance),
        horizon=HORIZON_S,
        count=rng.randint(*FAULTS),
    )
    ledger, trace, violations = Ledger(), [], []  # type: ignore[var-annotated]
    assert isinstance(mc.kv, ModelKV)
    truth = Metadata(mc.kv.inner)  # what the store holds, read past its faults and costs
    injector = Injector(mc, faults, violations, clusters[0].datapath.ack_quorum, hosts, truth)
    writers = [
        Host(i, c.client(), random.Random(rng.getrandbits(64)), ledger, trace, violations)
        for i, c in enumerate(clusters)
    ]
    ckpts = checkpointers([c.client() for c in clusters], CKPT_TIMEOUT_S)
    saves, reads = Saves(), Counter[str]()
    jobs = [injector.run()]
    files = workload in ("files", "mixed")
    if files:
        await make_tenants(writers, random.Random(seed))  # before the faults
        jobs += [run_host(h, OPS, PAUSE_S) for h in writers]
    if workload in ("checkpoint", "mixed"):
        jobs.append(run_saves(ckpts, random.Random(rng.getrandbits(64)), saves, violations))
    if workload in ("stream", "mixed"):
        index = await store_dataset(writers[0].client, seed)  # before the faults
        readers = [c.client() for c in clusters]
        jobs.append(read_epochs(readers, index, random.Random(seed), reads, violations))
    services = random.Random(seed + 1)
    if services.random() < SERVICES:
        jobs.append(_services(clusters[1], services, violations))
    start = clock.monotonic()
    await asyncio.gather(*jobs)
    for c in clusters:  # chunk writes that outlived their block's acknowledgment
        await c.datapath.drain()
    for ck in ckpts:  # the clean-up behind each commit
        await ck.wait_cleanup()
    report = await repair(clusters[0], gc_grace=0.0)
    violations += [f"block {b} unrecoverable after the faults" for b in report.unrecoverable]
    violations += await _full_redundancy(mc, truth)
    violations += await check(writers[0].client, ledger)
    if files:
        violations += await check_tenants(writers[0].client, writers)
    violations += await check_saves(ckpts, saves)
    violations += await _reverse_index(mc, truth)
    for ck in ckpts:
        await ck.close()
    ops: Counter[str] = Counter(saves.outcomes) + reads
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    if left:
        violations.append(f"{len(left)} tasks left running: {sorted({t.get_name() for t in left})}")
        for t in left:
            t.cancel()
    for h in writers:
        ops.update(h.outcomes)
    seen = [faults, trace, saves.committed, saves.failed, sorted(ops.items())]
    digest = hashlib.sha256(json.dumps(seen, default=str).encode()).hexdigest()
    return SeedResult(
        seed=seed,
        workload=workload,
        encoding=encoding,
        violations=tuple(violations),
        faults=dict(sorted(injector.injected.items())),
        ops=dict(sorted(ops.items())),
        virtual_s=round(clock.monotonic() - start, 6),
        trace=digest[:16],
    )


async def _services(cluster: Cluster, rng: random.Random, violations: list[str]) -> None:
    """Repair (with its garbage collection, at its default grace) and scrub, once each at
    a random time while the faults fall and the clients write, as a cluster's background
    services run beside them (in ``SERVICES`` of the seeds: they double a seed's time).
    A block repair finds lost then is a violation: its chunks are on no more victims than
    the encoding survives (seeds 2011 and 2016 of ``mixed`` found repair reporting blocks
    of files deleted meanwhile as lost)."""
    await asyncio.sleep(rng.uniform(0.0, HORIZON_S))
    report = await until_up(lambda: repair(cluster))
    if report.unrecoverable:
        violations.append(f"repair during the faults: {len(report.unrecoverable)} blocks lost")
    await until_up(lambda: scrub(cluster))


async def _full_redundancy(mc: ModelCluster, truth: Metadata) -> list[str]:
    """Every chunk of every block in place and sound, read from the model servers' stores
    directly (as a scrub would find them, without the modelled disks' and network's time:
    this check is the run's most frequent reader)."""
    bad = 0
    async for rec in truth.iter_blocks():
        for c in rec.chunks:
            try:
                data, info = await mc.servers[c.node].store.read_chunk(c.disk, c.chunk_id)
            except OSError:
                bad += 1
                continue
            bad += len(data) != c.stored_len or info.crc32c != c.crc32c
    return [f"not back to full redundancy after repair: {bad} bad chunks"] if bad else []


async def _reverse_index(mc: ModelCluster, truth: Metadata) -> list[str]:
    """The Block layer's reverse index (disk -> blocks) against a recount of its records."""
    counted: dict[tuple[int, int], set[int]] = {}
    async for rec in truth.iter_blocks():
        for c in rec.chunks:
            counted.setdefault((c.node, c.disk), set()).add(rec.block_id)
    out = []
    for node in range(SERVERS):
        for disk in range(DISKS):
            indexed = set(await truth.blocks_on_disk(node, disk))
            if indexed != counted.get((node, disk), set()):
                out.append(
                    f"the reverse index of node {node} disk {disk} names {len(indexed)} blocks, "
                    f"the block records {len(counted.get((node, disk), ()))}"
                )
    return out


__all__ = ["WORKLOADS", "SeedResult", "Summary", "run_seed", "run_seeds"]
