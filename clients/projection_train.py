"""``simulate train --preset``: MLPerf Storage's training emulation projected to a cluster's
scale, with checkpoint bursts, in virtual time.

The run is the real one (``clients/simulate.py``'s ``train``), on the model servers, disks,
network and client CPUs of a ``ModelCluster`` (``tectonic_emu/sim/``):

1. Host 0's real client writes the dataset, laid out as ``dataset.generate`` lays out the
   workload's, its shards ``Synthetic`` payloads (``dataset.generate_described``): as many
   samples as ``steps`` batches for every accelerator, in one epoch.
2. ``train`` runs every accelerator as a rank of one ``Job``: rank ``r`` reads its
   ``ShardStream`` through the real client of its host (``ranks_per_host`` to a host) and
   computes by sleeping the workload's time per batch. Collectives meet in memory, as the
   training job's own network would carry them, not through the store.
3. With a ``checkpoint`` model, every ``every`` steps each rank saves its DLIO files of the
   model (``ckpt_models.py``, ``Synthetic``) through the real ``Checkpointer`` of its host:
   a burst, whose dip in AU the report shows.

The report is ``train``'s (``TrainReport``: AU, AU over time, each burst's AU and
blocking), with the disks' read and write throughput over time beside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from clients.checkpoint import Checkpointer
from clients.ckpt_catalog import SharedIndexes
from clients.ckpt_models import checkpoint_plan
from clients.dataset import generate_described
from clients.projection import ROOT, SAMPLE_S, Preset, Progress, model_clients, rank_state
from clients.ranks import Job, ProcessInfo
from clients.simulate import Bursts, TrainReport, train
from clients.workloads import workload_named
from tectonic_emu import clock, entropy, qos
from tectonic_emu.coding import Encoding
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.qos.node import merge_groups
from tectonic_emu.sim.cluster import Hardware
from tectonic_emu.sim.node import ModelServer

DATASET = "/datasets/projected"
# The traffic groups of a projection (docs/qos.md): what the servers' fair queues share
# between when the hardware's ``qos`` is "fair".
LOADERS = qos.TrafficGroup("loaders", "gold")
CHECKPOINTS = qos.TrafficGroup("checkpoints", "bronze")
WRITES = 64  # dataset shards host 0 stores at once


@dataclass(frozen=True, slots=True)
class TrainScenario:
    """``accelerators`` emulated accelerators of ``workload`` training for ``steps`` steps
    (one epoch of a dataset sized to it, records ``scale`` times the workload's), on
    ``hardware``, ``ranks_per_host`` to a client host; the dataset and the checkpoints are
    stored with ``encoding``. With ``checkpoint``, that model's checkpoint (its files times
    ``checkpoint_scale``) is saved after every ``every``-th step, ``save_async`` if
    ``async_save``, each host's checkpoint writes paced to ``checkpoint_rate`` bytes/s (0:
    not paced)."""

    workload: str
    accelerators: int
    hardware: Hardware
    accelerator: str = "h100"
    steps: int = 20
    scale: float = 1.0
    encoding: str = "rs-6-3"
    ranks_per_host: int = 8
    hosts_per_rack: int = 16
    block_size: int = 72 << 20
    write_ack: str = "quorum"
    prefetch: int = 2
    checkpoint: str | None = None
    every: int = 10
    async_save: bool = False
    checkpoint_scale: float = 1.0
    seed: int = 1
    # Bytes/s each client host's checkpoint writes are paced to (the bronze group's rate,
    # docs/qos.md); 0: not paced.
    checkpoint_rate: float = 0.0


def train_scenario(preset: Preset, workload: str, accelerators: int, **kw: Any) -> TrainScenario:
    """A training scenario on ``preset``: its hardware, hosts, blocks and acknowledgment
    (``kw``: the rest of ``TrainScenario``'s fields, ``hardware`` to replace the preset's)."""
    kw.setdefault("hardware", preset.hardware)
    return TrainScenario(
        workload,
        accelerators,
        ranks_per_host=preset.ranks_per_host or accelerators,
        block_size=preset.block_size,
        write_ack=preset.write_ack,
        **kw,
    )


@dataclass(frozen=True, slots=True)
class TrainProjection:
    workload: str
    accelerators: int
    hosts: int
    servers: int
    encoding: str
    dataset_bytes: int
    checkpoint: str | None
    checkpoint_bytes: int  # one checkpoint's, as DLIO counts them (0: none)
    # The most of one checkpoint a client host writes (DLIO puts the model's files on the
    # first data-parallel replica's ranks, so its hosts write the most): with a paced
    # checkpoint a burst lasts at least this over the rate.
    checkpoint_host_bytes: int
    checkpoint_every: int  # steps
    dataset_write_s: float  # virtual seconds host 0 took to store the dataset, before the run
    report: TrainReport
    # (s since the run's start, GB/s read, GB/s written) on the disks, per SAMPLE_S
    disks: tuple[tuple[float, float, float], ...]
    wall_s: float = field(compare=False)
    qos: str = "off"  # how the servers' disks were shared between loaders and checkpoints
    # With a scheduler (qos fair or fifo): each group's figures over every server's disks
    # (``GroupStats.summary``: requests, bytes, disk time charged, waits).
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def _run(sc: TrainScenario, progress: Progress | None) -> TrainProjection:
    wl = workload_named(sc.workload)
    acc = wl.accelerator(sc.accelerator)
    hosts_n = -(-sc.accelerators // sc.ranks_per_host)
    mc, hosts, clients = await model_clients(
        sc.hardware,
        sc.encoding,
        sc.block_size,
        hosts_n,
        sc.hosts_per_rack,
        sc.ranks_per_host,
        sc.write_ack,
    )
    record = max(1, round(wl.record_bytes * sc.scale))
    samples = sc.accelerators * acc.batch_size * sc.steps
    started = clock.monotonic()
    index = await generate_described(
        clients[0],
        wl,
        DATASET,
        samples=samples,
        record_bytes=record,
        seed=sc.seed,
        encoding=sc.encoding,
        writes=WRITES,
    )
    written = clock.monotonic() - started

    def host(r: int) -> int:
        return r // sc.ranks_per_host

    bursts, ckpt_bytes, host_bytes = None, 0, 0
    if sc.checkpoint is not None:
        plan = checkpoint_plan(sc.checkpoint, sc.accelerators, sc.checkpoint_scale)
        shared = SharedIndexes()
        ckpts = [
            Checkpointer(
                c,
                ROOT,
                world_size=sc.accelerators,
                encoding=sc.encoding,
                shared=shared,
                group=dataclasses.replace(CHECKPOINTS, rate=sc.checkpoint_rate),
            )
            for c in clients
        ]
        bursts = Bursts(
            sc.every, lambda r: ckpts[host(r)], lambda r: rank_state(plan, r), sc.async_save
        )
        ckpt_bytes = plan.total
        per_host = [0] * hosts_n
        for r, rank in enumerate(plan.per_rank):
            per_host[host(r)] += rank.size
        host_bytes = max(per_host)
    disks = list(dict.fromkeys(d for s in mc.servers for d in s.disks))
    samples_out: list[tuple[float, float, float]] = []
    t0 = clock.monotonic()

    async def sample() -> None:
        read = wrote = 0
        while True:
            await asyncio.sleep(SAMPLE_S)
            r, w = sum(d.bytes_read for d in disks), sum(d.bytes_written for d in disks)
            at = round(clock.monotonic() - t0, 9)
            samples_out.append((at, (r - read) / SAMPLE_S / 1e9, (w - wrote) / SAMPLE_S / 1e9))
            read, wrote = r, w
            if progress is not None:
                progress(min(r, index.nbytes), index.nbytes)

    job = Job(clients[0], "projected", ranks_per_process=sc.accelerators, process=ProcessInfo(0, 1))
    sampler = asyncio.ensure_future(sample())
    try:
        with qos.using(LOADERS):  # the ranks' streams; their checkpoints are CHECKPOINTS'
            report = await train(
                clients[0],
                DATASET,
                workload=wl.name,
                accelerators=sc.accelerators,
                accelerator=acc.name,
                seed=sc.seed,
                prefetch=sc.prefetch,
                job=job,
                source_name="projected",
                sources=lambda r: clients[host(r)],
                within=lambda r: mc.cpus[hosts[host(r)]].active(),
                bursts=bursts,
            )
    finally:
        sampler.cancel()
    return TrainProjection(
        workload=wl.name,
        accelerators=sc.accelerators,
        hosts=hosts_n,
        servers=sc.hardware.servers,
        encoding=sc.encoding,
        dataset_bytes=index.nbytes,
        checkpoint=sc.checkpoint,
        checkpoint_bytes=ckpt_bytes,
        checkpoint_host_bytes=host_bytes,
        checkpoint_every=sc.every,
        dataset_write_s=round(written, 6),
        report=report,
        disks=tuple(samples_out),
        wall_s=0.0,
        qos=sc.hardware.qos,
        groups=_groups(mc.servers),
    )


def _groups(servers: Sequence[ModelServer]) -> dict[str, dict[str, Any]]:
    merged = merge_groups(s.qos.by_group() for s in servers if s.qos is not None)
    return {name: stats.summary() for name, stats in sorted(merged.items())}


def project_train(sc: TrainScenario, progress: Progress | None = None) -> TrainProjection:
    """Run ``sc`` in virtual time, seeded (the same scenario gives the same projection);
    ``progress(done, total)`` hears of the dataset's bytes read from the disks."""
    if sc.accelerators < 1 or sc.ranks_per_host < 1 or sc.steps < 1 or sc.every < 1:
        raise InvalidArgumentError(
            "a projection needs at least one accelerator, rank per host and step, and "
            "checkpoints every 1 or more steps"
        )
    if not (math.isfinite(sc.checkpoint_rate) and sc.checkpoint_rate >= 0):
        raise InvalidArgumentError(
            f"a checkpoint rate is 0 or more bytes/s, not {sc.checkpoint_rate}"
        )
    if not 0 < sc.scale <= 1:
        raise InvalidArgumentError(f"--scale is in (0, 1], not {sc.scale}")
    Encoding.parse(sc.encoding)
    t0 = time.monotonic()
    with entropy.seeded(sc.seed):
        result = clock.run_virtual(_run(sc, progress))
    return dataclasses.replace(result, wall_s=round(time.monotonic() - t0, 3))


__all__ = ["TrainProjection", "TrainScenario", "project_train", "train_scenario"]
