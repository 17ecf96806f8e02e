"""The client's Python on the event loop, measured per event for ``this-machine``.

A projection charges the loop for the work it counts: per byte (copies, checksums), per
node call and per metadata hop (``CpuModel.call_s``). The real client's loop does more:
around each block it writes (the pipeline, placement, the chunk intent, the commit's
records and their encoding) and for each rank it stages for a checkpoint (its parts, its
index entries). On 2026-12-06 a real 16-rank r1 save's loop ran 0.26-0.35 s of CPU and
a 1,024-rank one 0.35-0.46 s, where the projection's loop served 0.20-0.21 s in both, and
the real pipeline's blocks spent about 5 ms each waiting for the loop beyond what the
projection's did (docs/simulate.md, *The loop's Python*).

So ``python_costs`` measures it, per event of ``work.EVENTS``, as the difference between
what the real code's loop spends and what the projection of the same work charges it,
each measured here on workloads of their own, not on ``bench sim``'s scenarios:

- **a block:** two writers, each appending a file of 64 KiB blocks on an embedded r1
  cluster; the loop's CPU time (``thread_time``) per block, from the difference between
  files of ``FEW`` and of ``MANY`` blocks (so a file's own opening and sealing drop out);
  the same files projected (``Synthetic`` bytes, virtual time) on the preset so far, their
  loop's service per block likewise; the median of ``ROUNDS`` real rounds;
- **a rank's save:** ``Checkpointer.save`` of ``FEW_RANKS`` and of ``MANY_RANKS`` ranks,
  each with two values of 4 KiB (their bytes cost nothing to speak of) in files of the
  default 8 MiB blocks (a block or two: per block, it would count the blocks' Python
  again), real and projected the same way, per rank.

Neither is below zero. The figures are this machine's Python, not a cluster's: the other
presets charge none.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from clients.checkpoint import Checkpointer
from tectonic_emu import Cluster, clock
from tectonic_emu.coding.synthetic import Payload, Synthetic
from tectonic_emu.config import DEFAULT_BLOCK_SIZE, ClusterConfig
from tectonic_emu.sim.cluster import Hardware, ModelCluster
from tectonic_emu.sim.cpu import HostCpu
from tectonic_emu.sim.machine import DISKS, NODES, Machine

BLOCK = 64 << 10  # bytes of each block of the block probe
FEW, MANY = 32, 512  # blocks of each of its files
WRITERS = 2  # files written at once, as a checkpoint's data files are
FEW_RANKS, MANY_RANKS = 16, 512
VALUE = 4 << 10  # bytes of each of a rank's two values
# Real rounds of each, the median taken: rounds of the block figure ran 0.31-0.57 ms
# apart with files of 512 blocks, 0.42-0.88 with 256 (2026-12-06, five rounds each); the
# projection's is the same every time.
ROUNDS = 5
# Work whose loop time is measured, on a cluster real or projected (``Synthetic`` bytes).
Probe = Callable[[Cluster, bool], Awaitable[None]]


async def python_costs(directory: Path, machine: Machine) -> dict[str, float]:
    """Seconds of the loop's Python per event of ``work.EVENTS`` that ``machine``'s preset
    does not charge (module docstring), measured in ``directory``."""
    # The real probes' bytes, made before their loop is timed: os.urandom runs at about
    # 1 GB/s here, which inside the timing added about 0.08 ms to each block.
    source = memoryview(os.urandom(max(MANY * BLOCK, MANY_RANKS * 2 * VALUE)))
    hardware = replace(machine, python_s={}).hardware()
    out = {}
    for event, few, many, per, probe, bs in (
        ("block", FEW, MANY, WRITERS, _blocks, BLOCK),  # per: events each of few, many
        ("rank-save", FEW_RANKS, MANY_RANKS, 1, _ranks, DEFAULT_BLOCK_SIZE),  # a block or two
    ):
        model = [
            await asyncio.to_thread(_projected, hardware, partial(probe, n, source), bs)
            for n in (few, many)
        ]
        events = (many - few) * per
        rounds = []
        for _ in range(ROUNDS):
            real = [await _real(directory, partial(probe, n, source), bs) for n in (few, many)]
            rounds.append(((real[1] - real[0]) - (model[1] - model[0])) / events)
        out[event] = max(0.0, statistics.median(rounds))
    return out


async def _blocks(blocks: int, source: memoryview, cluster: Cluster, synthetic: bool) -> None:
    client = cluster.client()

    async def one(k: int) -> None:
        # a memoryview is copied into the writer's blocks, as a tensor's bytes are
        data: Payload = (
            Synthetic.random(k, blocks * BLOCK) if synthetic else source[: blocks * BLOCK]
        )
        async with client.open_writer(f"/p{k}") as w:
            await w.append(data)

    await asyncio.gather(*(one(k) for k in range(WRITERS)))


async def _ranks(ranks: int, source: memoryview, cluster: Cluster, synthetic: bool) -> None:
    ckpt = Checkpointer(cluster.client(), "/ck", world_size=ranks)

    def value(seed: int) -> Payload:
        return (
            Synthetic.random(seed, VALUE)
            if synthetic
            else source[seed * VALUE : (seed + 1) * VALUE]
        )

    states = [{"a": value(2 * r), "b": value(2 * r + 1)} for r in range(ranks)]
    await asyncio.gather(*(ckpt.save(1, r, s) for r, s in enumerate(states)))
    await ckpt.close()


async def _real(directory: Path, probe: Probe, block_size: int) -> float:
    """The loop's CPU seconds in ``probe`` on a new embedded r1 cluster of ``block_size``
    blocks."""
    root = Path(tempfile.mkdtemp(prefix="tectonic-loop-python-", dir=directory)) / "cluster"
    try:
        Cluster.create(
            root, nodes=NODES, disks_per_node=DISKS, encoding="r1", block_size=block_size
        )
        async with Cluster.open(root) as cluster:
            t0 = time.thread_time()
            await probe(cluster, False)
            return time.thread_time() - t0
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def _projected(hardware: Hardware, probe: Probe, block_size: int) -> float:
    """The seconds the projection's loop serves in ``probe`` (in virtual time, run to the
    end here) on the same cluster modelled by ``hardware``."""
    config = ClusterConfig(
        nodes=hardware.servers, disks_per_node=hardware.disks, encoding="r1", block_size=block_size
    )

    async def main() -> float:
        mc = ModelCluster(hardware, config)
        (host,) = mc.add_clients(1)
        cluster = await mc.client_cluster(host, write_ack="all")
        cpu = mc.cpus[host]
        assert isinstance(cpu, HostCpu), "a this-machine preset charges its CPU"
        with cpu.active():
            before = cpu.loop.served
            await probe(cluster, True)
            return cpu.loop.served - before

    return clock.run_virtual(main())


__all__ = [
    "BLOCK",
    "FEW",
    "FEW_RANKS",
    "MANY",
    "MANY_RANKS",
    "ROUNDS",
    "WRITERS",
    "python_costs",
]
