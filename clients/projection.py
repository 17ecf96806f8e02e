"""``simulate checkpoint``: a checkpoint save of a model projected to a cluster's scale.

Every rank saves its DLIO files (``ckpt_models.py``) as ``Synthetic`` payloads through the
real ``Checkpointer`` of its host. A host of ``ranks_per_host`` ranks holds one
``Checkpointer`` over its own real ``Cluster`` client. The ranks meet through the store, as
processes on many hosts do: index files, then rank 0's host publishes the manifest. All of
it runs on the model servers, disks and network of a ``ModelCluster``
(``tectonic_emu/sim/``), in virtual time.

The report, as MLPerf Storage reports a checkpoint:

- the save's duration: the slowest rank's, from the common start to its commit;
- each rank's duration as p50, p99 and max;
- the throughput: the checkpoint's bytes over that duration, with the peak and sustained
  rates of stored bytes into the servers, per ``SAMPLE_S`` and in a last, shorter sample
  to the last commit. Into the servers is as the network carries them, each message in
  flight as far as its slowest hop has served it (``Fabric.received_so_far``); on an
  embedded cluster, where no network is crossed, as the device writes them. Not at the
  disks: a server writes a chunk once all of it has come, and chunks that share a NIC
  under processor sharing all come at its end together, so the disks see bunches that the
  network does not carry (60 TB/s in one sample of a 7 TB/s core);
- the utilisation of each class of resource (client NICs, server NICs, disks, and the
  fabric's core where the hardware has one), and the one that bounded the run;
- the physical lower bound from the hardware's own figures: the bytes stored (times the
  encoding's overhead) over the slowest class's aggregate bandwidth.

Metadata costs time when the hardware has a ``MetadataModel`` (``--metadata-shards``), and
the clients' per-byte CPU work when it has a ``CpuModel`` (``sim/cpu.py``): then the shards,
the client CPUs and the clients' event loops are classes of their own in the report. Not
modelled yet (docs/simulate.md): the switches of the core one by one (it is one aggregate
link).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from clients.checkpoint import Checkpointer
from clients.ckpt_catalog import SharedIndexes
from clients.ckpt_format import CheckpointCorruptError
from clients.ckpt_models import CheckpointPlan, checkpoint_plan
from clients.loop_python import python_costs
from tectonic_emu import clock, entropy
from tectonic_emu.chunkstore.base import MAX_NODE_DELAY
from tectonic_emu.client import Client
from tectonic_emu.coding import Encoding
from tectonic_emu.coding.synthetic import Synthetic
from tectonic_emu.coding.work import KINDS, Tally
from tectonic_emu.config import DEFAULT_BLOCK_SIZE, ClusterConfig
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.sim.cluster import Hardware, ModelCluster
from tectonic_emu.sim.cpu import ASSUMED_SERVER_CORE, CpuModel, HostCpu
from tectonic_emu.sim.devices import FLASH
from tectonic_emu.sim.fabric import FabricModel, Host
from tectonic_emu.sim.machine import Machine, measure
from tectonic_emu.sim.metadata import ModelKV
from tectonic_emu.sim.resources import Resource

ROOT = "/checkpoints"
SAMPLE_S = 0.1  # virtual seconds between samples of the stored bytes into the servers


@dataclass(frozen=True, slots=True)
class Preset:
    """A cluster to project onto, with the source of each figure (``sources``)."""

    name: str
    hardware: Hardware
    ranks_per_host: int | None  # None: every rank on the one host (an embedded cluster)
    block_size: int
    sources: tuple[str, ...]
    write_ack: str = "quorum"  # the clients' (a served client's default; embedded: "all")

    def scenario(
        self, model: str, ranks: int, encoding: str, *, hardware: Hardware | None = None, **kw: Any
    ) -> Scenario:
        """A scenario on this preset (its ``hardware`` unless another is given): its hosts,
        blocks and acknowledgment; ``kw``, the rest of ``Scenario``'s fields."""
        return Scenario(
            model,
            ranks,
            encoding,
            hardware or self.hardware,
            ranks_per_host=self.ranks_per_host or ranks,
            block_size=self.block_size,
            write_ack=self.write_ack,
            **kw,
        )


def this_machine(directory: Path | None = None, value_sizes: Iterable[int] = ()) -> Preset:
    """The ``this-machine`` preset, measured now in ``directory`` (default: the temp dir):
    an embedded cluster on this machine's device, cores and SQLite, its copies measured at
    ``value_sizes`` too (``tectonic_emu/sim/machine.py``; ``bench sim`` compares it with
    real runs)."""
    where = directory or Path(tempfile.gettempdir())
    return machine_preset(asyncio.run(measure_machine(where, value_sizes)))


async def measure_machine(directory: Path, value_sizes: Iterable[int] = ()) -> Machine:
    """This machine measured (``sim/machine.py``), with its client's Python on the loop
    per block and per rank's save (``clients/loop_python.py``)."""
    machine = await measure(directory, value_sizes)
    return replace(machine, python_s=await python_costs(directory, machine))


def machine_preset(machine: Machine) -> Preset:
    """The ``this-machine`` preset of a ``Machine`` measured before."""
    return Preset(
        THIS_MACHINE,
        machine.hardware(),
        ranks_per_host=None,
        block_size=DEFAULT_BLOCK_SIZE,
        sources=("measured on this machine just now (tectonic_emu/sim/machine.py)",),
        write_ack="all",
    )


THIS_MACHINE = "this-machine"

# The Llama 3 paper (arXiv 2407.21783, section 3.3.1): Tectonic "supports a sustainable
# throughput of 2 TB/s and a peak throughput of 7 TB/s".
PAPER_SUSTAINED_GB_S = 2000.0
PAPER_PEAK_GB_S = 7000.0
PAPER_PEAK_GBPS = PAPER_PEAK_GB_S * 8  # the same peak in Gb/s: meta-genai-24k's fitted core
PAPER_PRESET = "meta-genai-24k"  # the preset of the paper's cluster


PRESETS = {
    p.name: p
    for p in (
        Preset(
            PAPER_PRESET,
            Hardware(
                servers=7500,
                disks=4,
                disk=FLASH,
                fabric=FabricModel(
                    nic_gbps=100.0, rtt=1e-4, oversubscription=1.0, core_gbps=PAPER_PEAK_GBPS
                ),
                servers_per_rack=16,
                cpu=CpuModel(16, ASSUMED_SERVER_CORE, "assumed"),
            ),
            ranks_per_host=8,
            block_size=72 << 20,
            sources=(
                "7,500 storage servers: the Llama 3 paper (arXiv 2407.21783), section 3.3.1",
                "8 GPUs (ranks) per host, 24,576 GPUs: 'Building Meta's GenAI "
                "Infrastructure', engineering.fb.com, 2024-03",
                "72 MiB blocks (8 MiB chunks at rs-9-6): Tectonic-Shift, USENIX ATC'23",
                "ASSUMED, not published (docs/presets/meta-genai-24k-sources.md): 4 flash "
                "devices per server (the flash preset's figures), 100 Gb/s NICs, 0.1 ms round "
                "trips, non-blocking racks of 16, 16 cores per host for storage at twice this "
                "machine's per-core rates",
                "FITTED: the fabric's core between racks at 7 TB/s in aggregate, the paper's "
                "peak, which it says checkpoint bursts reach as they 'saturate the storage "
                "fabric'; the assumed NICs and devices alone total 38 to 105 TB/s",
            ),
        ),
        Preset(
            "small-flash",
            Hardware(
                servers=18,
                disks=2,
                disk=FLASH,
                fabric=FabricModel(nic_gbps=100.0, rtt=1e-4),
                servers_per_rack=9,
                cpu=CpuModel(16, ASSUMED_SERVER_CORE, "assumed"),
            ),
            ranks_per_host=8,
            block_size=72 << 20,
            sources=("assumed: a small flash cluster for trying the command out",),
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Scenario:
    """One projected save: ``model``'s checkpoint on ``ranks`` ranks, ``ranks_per_host`` to a
    client host, stored with ``encoding`` in blocks of ``block_size`` on ``hardware``;
    ``fail_servers`` servers, drawn from the seed, go down ``fail_at`` virtual seconds into
    the save (0: down from the start); ``slow_servers`` others, drawn after them, add
    ``slow_by`` seconds to every call throughout (as ``tectonic-emu node slow`` does)."""

    model: str
    ranks: int
    encoding: str
    hardware: Hardware
    ranks_per_host: int = 8
    hosts_per_rack: int = 16
    block_size: int = 72 << 20
    seed: int = 1
    fail_servers: int = 0
    fail_at: float = 0.0
    slow_servers: int = 0
    slow_by: float = 0.0  # seconds added to each call of a slow server
    load: bool = True  # then every rank loads what it saved, once all have saved
    scale: float = 1.0  # every file's size times this (DLIO's files at full size: 1)
    write_ack: str = "quorum"  # the clients' (a served client's default; embedded: "all")
    steps: int = 1  # checkpoints saved, one every ``interval`` virtual seconds
    interval: float = 0.0  # from one step's start to the next's (the compute between them)
    async_save: bool = False  # ranks call save_async and go on once their state is staged
    keep_last: int | None = None  # the Checkpointer's retention (None: keep every step)


@dataclass(frozen=True, slots=True)
class ClassUse:
    """Utilisation of one class of resources over the save: mean and most loaded member."""

    name: str
    members: int
    mean: float
    max: float


@dataclass(frozen=True, slots=True)
class StepFigures:
    """One step's save: when it was due (virtual s from the first), its duration (the
    slowest rank, from when it was due to its commit), each rank's p50 and p99, and the
    longest a rank was blocked (``save_async``: until its state was staged; ``save``: the
    duration)."""

    step: int
    due_s: float
    duration_s: float
    rank_p50_s: float
    rank_p99_s: float
    blocked_max_s: float


@dataclass(frozen=True, slots=True)
class Phase:
    """A phase after the save (the load): its duration (the slowest rank, from the phase's
    common start), each rank's p50 and p99, the bytes over the duration, and the lower
    bound from the hardware's figures."""

    duration_s: float
    rank_p50_s: float
    rank_p99_s: float
    throughput_gb_s: float
    lower_bound_s: float
    bound_by: str


@dataclass(frozen=True, slots=True)
class Projection:
    model: str
    ranks: int
    hosts: int
    servers: int
    encoding: str
    failed_servers: tuple[int, ...]  # down from fail_at on
    slow_servers: tuple[int, ...]  # slow_by seconds more to each call, throughout
    bytes: int  # the checkpoint's bytes, as DLIO counts them
    stored_bytes: int  # times the encoding's overhead
    duration_s: float  # the slowest rank, start to commit (of the longest step)
    rank_p50_s: float
    rank_p99_s: float
    rank_max_s: float
    rank_s: tuple[float, ...]  # each rank's duration in that step
    steps: tuple[StepFigures, ...]
    throughput_gb_s: float  # bytes / duration
    peak_gb_s: float  # most stored bytes into the servers in one sample, per second
    sustained_gb_s: float  # stored bytes / duration
    lower_bound_s: float
    bound_by: str  # the class whose aggregate bandwidth makes the lower bound
    busiest: str  # the class most used during the save
    load: Phase | None  # every rank loading what it saved, after the save (None: not run)
    use: tuple[ClassUse, ...]
    cpu_work: dict[str, int]  # bytes of each kind of client CPU work (coding/work.py)
    timeline: tuple[tuple[float, float], ...]  # (virtual s, GB/s into the servers) per sample
    wall_s: float = field(compare=False)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def lower_bound(
    sc: Scenario, nbytes: int, hosts: int, cpu_seconds: float = 0.0, *, write: bool = True
) -> tuple[float, str]:
    """Seconds no save (``write``) or load of ``nbytes`` stored bytes can beat on this
    hardware, and the class that sets them: the bytes over the aggregate bandwidth of the
    client NICs, the server NICs and the disks, and, with a CPU model, the ``cpu_seconds``
    of work the clients did over all their cores."""
    hw = sc.hardware
    nic = hw.fabric.nic_rate
    disk = hw.disk.write_bw if write else hw.disk.read_bw
    bounds = {
        "client NICs": nbytes / (hosts * nic),
        "server NICs": nbytes / (hw.servers * nic),
        "disks": nbytes / (hw.devices * disk),
    }
    if hw.fabric.core_rate is not None:
        bounds["fabric core"] = nbytes / hw.fabric.core_rate
    if hw.cpu is not None:
        bounds["client CPUs"] = cpu_seconds / (hosts * hw.cpu.cores)
    name = max(bounds, key=lambda k: bounds[k])
    return bounds[name], name


def _percentile(xs: Sequence[float], q: float) -> float:
    ordered = sorted(xs)
    k = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[k]


def _use(name: str, members: Sequence[Resource], elapsed: float) -> ClassUse:
    shares = [r.utilisation(elapsed) for r in members] or [0.0]
    return ClassUse(name, len(members), sum(shares) / len(shares), max(shares))


Progress = Callable[[int, int], None]  # (bytes done so far, of all to do)


def model_cluster(
    hw: Hardware, encoding: str, block_size: int, hosts: int, per_rack: int, per_host: int
) -> tuple[ModelCluster, list[Host]]:
    """A ``ModelCluster`` on ``hw`` storing with ``encoding`` in blocks of ``block_size``,
    and its ``hosts`` client hosts (``per_rack`` to a rack), each running ``per_host``
    ranks as processes of their own (an embedded cluster: one process)."""
    config = ClusterConfig(
        nodes=hw.servers, disks_per_node=hw.disks, encoding=encoding, block_size=block_size
    )
    mc = ModelCluster(hw, config)
    return mc, mc.add_clients(hosts, per_rack=per_rack, processes=per_host)


async def model_clients(
    hw: Hardware,
    encoding: str,
    block_size: int,
    hosts: int,
    per_rack: int,
    per_host: int,
    write_ack: str,
) -> tuple[ModelCluster, list[Host], list[Client]]:
    """``model_cluster``, and the real client of each host."""
    mc, out = model_cluster(hw, encoding, block_size, hosts, per_rack, per_host)
    clients = [(await mc.client_cluster(h, write_ack=write_ack)).client() for h in out]
    return mc, out, clients


async def _save(sc: Scenario, plan: CheckpointPlan, progress: Progress | None) -> Projection:
    hw = sc.hardware
    mc, hosts = model_cluster(
        hw,
        sc.encoding,
        sc.block_size,
        -(-sc.ranks // sc.ranks_per_host),
        sc.hosts_per_rack,
        sc.ranks_per_host,
    )
    ckpts = []
    shared = SharedIndexes()  # one decoded manifest for all hosts, not one each
    for host in hosts:
        cluster = await mc.client_cluster(host, write_ack=sc.write_ack)
        ckpts.append(
            Checkpointer(
                cluster.client(),
                ROOT,
                world_size=sc.ranks,
                encoding=sc.encoding,
                keep_last=sc.keep_last,
                shared=shared,
            )
        )
    disks = list(dict.fromkeys(d for s in mc.servers for d in s.disks))  # embedded: one
    samples: list[tuple[float, float]] = []
    start = clock.monotonic()
    stored = round(plan.total * Encoding.parse(sc.encoding).overhead)

    sampled = [0.0, 0]  # the virtual s and bytes into the servers at the last sample
    server_hosts = {s.host for s in mc.servers}

    def into_servers() -> int:
        if hw.embedded:
            return round(sum(d.written_so_far() for d in disks))
        return round(mc.fabric.received_so_far(server_hosts))

    def take_sample() -> None:
        at, now = clock.monotonic() - start, into_servers()
        if at > sampled[0]:
            samples.append((round(at, 9), (now - sampled[1]) / (at - sampled[0]) / 1e9))
            sampled[:] = at, now
        if progress is not None:
            progress(now, stored)

    async def sample() -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            take_sample()

    durations = [[0.0] * sc.ranks for _ in range(sc.steps)]  # due to commit, per step
    blocked = [[0.0] * sc.ranks for _ in range(sc.steps)]

    async def rank(r: int) -> None:
        ckpt, state = ckpts[r // sc.ranks_per_host], rank_state(plan, r)
        commits = []
        with mc.cpus[hosts[r // sc.ranks_per_host]].active():
            for k in range(sc.steps):
                due = start + k * sc.interval
                if clock.monotonic() < due:
                    await asyncio.sleep(due - clock.monotonic())
                if sc.async_save:
                    pending = await ckpt.save_async(k + 1, r, state)
                    blocked[k][r] = clock.monotonic() - due
                    commits.append(_commit_time(pending.committed, durations[k], r, due))
                else:
                    await ckpt.save(k + 1, r, state)
                    durations[k][r] = blocked[k][r] = clock.monotonic() - due
            await asyncio.gather(*commits)

    rng = entropy.new_rng()
    failed = sorted(rng.sample(range(hw.servers), sc.fail_servers))
    slow = sorted(rng.sample(sorted(set(range(hw.servers)) - set(failed)), sc.slow_servers))
    for n in slow:
        mc.servers[n].delay = sc.slow_by

    def fail() -> None:
        for n in failed:
            mc.servers[n].available = False

    if sc.fail_at <= 0:
        fail()
    else:
        asyncio.get_running_loop().call_later(sc.fail_at, fail)
    sampler = asyncio.ensure_future(sample())
    try:
        await asyncio.gather(*(rank(r) for r in range(sc.ranks)))
    finally:
        sampler.cancel()
    take_sample()  # the last, shorter sample: to the last commit
    elapsed = clock.monotonic() - start  # to the last commit
    steps = tuple(
        StepFigures(
            k + 1,
            k * sc.interval,
            max(durations[k]),
            _percentile(durations[k], 50),
            _percentile(durations[k], 99),
            max(blocked[k]),
        )
        for k in range(sc.steps)
    )
    worst = max(range(sc.steps), key=lambda k: steps[k].duration_s)
    tallies = [mc.cpus[h] for h in hosts]
    cpu_work = _work(tallies)  # of every step: each step's bound counts its share
    bound, bound_by = lower_bound(sc, stored, len(hosts), _seconds(hw, cpu_work) / sc.steps)
    use: tuple[ClassUse, ...] = (
        _use("client NICs", [h.egress for h in hosts], elapsed),
        _use("server NICs", [s.host.ingress for s in mc.servers], elapsed),
        _use("disks", [d.time for d in disks], elapsed),
    )
    if mc.fabric.core is not None:
        use += (_use("fabric core", [mc.fabric.core], elapsed),)
    if hw.cpu is not None:
        cpus = [t for t in tallies if isinstance(t, HostCpu)]
        use += (_use("client CPUs", [t.cores for t in cpus], elapsed),)
        use += (_use("client loops", [t.loop for t in cpus], elapsed),)
    if isinstance(mc.kv, ModelKV):
        use += (_use("metadata shards", mc.kv.shards, elapsed),)
    load = await _load(sc, plan, mc, hosts, ckpts, sc.steps) if sc.load else None
    return Projection(
        model=sc.model,
        ranks=sc.ranks,
        hosts=len(hosts),
        servers=hw.servers,
        encoding=sc.encoding,
        failed_servers=tuple(failed),
        slow_servers=tuple(slow),
        bytes=plan.total,
        stored_bytes=stored,
        duration_s=steps[worst].duration_s,
        rank_p50_s=steps[worst].rank_p50_s,
        rank_p99_s=steps[worst].rank_p99_s,
        rank_max_s=steps[worst].duration_s,
        rank_s=tuple(durations[worst]),
        steps=steps,
        throughput_gb_s=plan.total / steps[worst].duration_s / 1e9,
        peak_gb_s=max((rate for _, rate in samples), default=0.0),
        sustained_gb_s=stored / steps[worst].duration_s / 1e9,
        lower_bound_s=bound,
        bound_by=bound_by,
        busiest=max(use, key=lambda u: u.mean).name,
        load=load,
        use=use,
        cpu_work=cpu_work,
        timeline=tuple(samples),
        wall_s=0.0,
    )


async def _load(
    sc: Scenario,
    plan: CheckpointPlan,
    mc: ModelCluster,
    hosts: list[Host],
    ckpts: list[Checkpointer],
    step: int,
) -> Phase:
    """Every rank loads ``step`` through its host's Checkpointer, all at once, and gets
    back the descriptions it saved (checked here: a wrong value is an error)."""
    tallies = [mc.cpus[h] for h in hosts]
    before = _work(tallies)
    durations = [0.0] * sc.ranks
    start = clock.monotonic()

    async def rank(r: int) -> None:
        host = r // sc.ranks_per_host
        with mc.cpus[hosts[host]].active():
            state = await ckpts[host].load(r, step)
        durations[r] = clock.monotonic() - start
        if state != rank_state(plan, r):  # the chain checks each part; this checks the whole
            raise CheckpointCorruptError(f"rank {r} loaded other values than it saved", ROOT)

    await asyncio.gather(*(rank(r) for r in range(sc.ranks)))
    elapsed = max(durations)
    done = {k: n - before[k] for k, n in _work(tallies).items()}
    bound, bound_by = lower_bound(
        sc, plan.total, len(hosts), _seconds(sc.hardware, done), write=False
    )
    return Phase(
        duration_s=elapsed,
        rank_p50_s=_percentile(durations, 50),
        rank_p99_s=_percentile(durations, 99),
        throughput_gb_s=plan.total / elapsed / 1e9,
        lower_bound_s=bound,
        bound_by=bound_by,
    )


async def _commit_time(
    committed: asyncio.Future[Any], durations: list[float], r: int, due: float
) -> None:
    """Wait for a ``save_async``'s commit and note when it came, from when it was due."""
    await committed
    durations[r] = clock.monotonic() - due


def rank_state(plan: CheckpointPlan, r: int) -> dict[str, Synthetic]:
    """Rank ``r``'s DLIO files as synthetic values, each seeded by its rank and index."""
    files = plan.per_rank[r].files
    return {f.name: Synthetic.random(r << 16 | i, f.size) for i, f in enumerate(files)}


def _work(tallies: Sequence[Tally]) -> dict[str, int]:
    return {k: sum(t.total.get(k, 0) for t in tallies) for k in KINDS}


def _seconds(hw: Hardware, done: dict[str, int]) -> float:
    return hw.cpu.seconds(done) if hw.cpu is not None else 0.0


def project_checkpoint(sc: Scenario, progress: Progress | None = None) -> Projection:
    """Run ``sc`` in virtual time, seeded (the same scenario gives the same projection);
    ``progress(done, total)`` hears of the stored bytes into the servers as it goes."""
    if sc.ranks < 1 or sc.ranks_per_host < 1:
        raise InvalidArgumentError("a projection needs at least one rank and one rank per host")
    if not 0 <= sc.fail_servers < sc.hardware.servers:
        raise InvalidArgumentError(
            f"--fail-servers takes 0 to {sc.hardware.servers - 1} of {sc.hardware.servers} "
            f"servers, not {sc.fail_servers}"
        )
    if not (math.isfinite(sc.fail_at) and sc.fail_at >= 0):
        raise InvalidArgumentError(f"--fail-at is 0 or more seconds, not {sc.fail_at}")
    if not 0 <= sc.slow_servers <= sc.hardware.servers - sc.fail_servers:
        raise InvalidArgumentError(
            f"--slow-servers takes 0 to {sc.hardware.servers - sc.fail_servers} (the servers "
            f"not failed), not {sc.slow_servers}"
        )
    if not (math.isfinite(sc.slow_by) and 0 <= sc.slow_by <= MAX_NODE_DELAY):
        raise InvalidArgumentError(f"--slow-by is 0 to {MAX_NODE_DELAY:g} s, not {sc.slow_by}")
    if sc.steps < 1 or not (math.isfinite(sc.interval) and sc.interval >= 0):
        raise InvalidArgumentError(
            f"--steps is 1 or more and --interval 0 or more seconds, not {sc.steps} and "
            f"{sc.interval}"
        )
    plan = checkpoint_plan(sc.model, sc.ranks, sc.scale)
    t0 = time.monotonic()
    with entropy.seeded(sc.seed):
        result = clock.run_virtual(_save(sc, plan, progress))
    return dataclasses.replace(result, wall_s=round(time.monotonic() - t0, 3))


__all__ = [
    "PAPER_PEAK_GBPS",
    "PAPER_PEAK_GB_S",
    "PAPER_PRESET",
    "PAPER_SUSTAINED_GB_S",
    "PRESETS",
    "ClassUse",
    "Phase",
    "Preset",
    "Projection",
    "Scenario",
    "StepFigures",
    "THIS_MACHINE",
    "machine_preset",
    "measure_machine",
    "this_machine",
    "lower_bound",
    "model_clients",
    "model_cluster",
    "project_checkpoint",
    "rank_state",
]
