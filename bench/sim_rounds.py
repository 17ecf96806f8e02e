"""``bench sim``'s real rounds: each scenario run for real on an embedded cluster, and the
device measured beside it (``bench/sim.py`` projects the same scenarios and compares).

A round runs the scenario (``save_and_load``: an embedded cluster in ``directory``, the
real ``Checkpointer``, DLIO's files for llama3-8b scaled by ``scale``, random bytes) in a
new process (``apart``), as a job restarting from its checkpoint loads it. Run one after
another in one process, the loads of the first rounds took about 1 s and those after
0.6-0.65 s: once the process's heap had grown and kept about 0.9 GB of freed memory (a
1,024-rank r3 save leaves that much), glibc served even the 60 MB values from it, pages
already touched, where a new process takes new pages for every value (the first round's
case, and the model's). In a process of its own each round is a sample of the same thing:
three rounds' loads then spread by 0.02-0.15 s, not 0.6 (2026-12-06).

The machine is measured again beside each real run, since on a shared VM its rates swing
from one minute to the next: the device just before the save and again once the round is
over (``measure_device``: a node's chunk writes and reads, 1.3-2.5 and 1.9-3.2 GB/s on
2026-12-06 from one fresh ``mmap``, 1.6-1.8 and 2.0-2.2 from buffers of a writer's kind:
``sim/machine.py`` ``SOURCES``), the second in a process of its own (``probe``: in the
round's process, the probe after a 16-rank round measured 1.80-1.88 GB/s where all others
measured 1.15-1.79), fresh memory just before the load (``fresh_memory_gb_s``: after the
save, in the round's process, as the load is about to meet it). A thread's rate of copies
into new ``bytes``, measured there the same way, depended on what the save had left in the
heap (copies of 0.94 MB values ran at 1.9 GB/s there, at 1.5-1.6 in a new process), so
copies are measured once, by size, each size in a new process (``sim/cpu.py``
``copy_rates``, for the value sizes of the scenarios). The device's two measurements around
one round were no closer to each other than to any other (eight rounds of a 16-rank r1 save:
writes 1.37-1.85 GB/s, correlation 0.29 between a round's two, none with its save, which
held at 0.86-1.05 s), so each is one more sample of the same device. Most of that spread was
the old probe's memory: from a writer's kind of buffer, the probes of one run agree within
5%.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.sim_trace import Span, traced
from clients.checkpoint import Checkpointer
from clients.ckpt_models import checkpoint_plan
from tectonic_emu import Cluster
from tectonic_emu.sim.cpu import fresh_memory_gb_s
from tectonic_emu.sim.machine import (
    DISKS,
    NODES,
    Device,
    device_busy_s,
    drop_caches,
    measure_device,
)

MODEL = "llama3-8b"
FAIL_AT_S = 1.0  # seconds into the save when the failure scenario's node stops
SLOW_BY_S = 0.2  # seconds the slow-node scenario's node adds to every call
# Bytes each way of the device's measurement before each real run: 1 GiB measured 1.27-1.61
# GB/s write and 2.04-2.19 read six times in a row where 256 MiB measured 1.13-1.59 and
# 1.39-2.11 (2026-12-06, from one fresh mmap); 3.4 GB, as long as an r3 save, measured
# within 2% of 1 GiB from a writer's kind of buffer.
DEVICE_PROBE = 1 << 30

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    encoding: str
    ranks: int
    fail: bool = False  # a node stops FAIL_AT_S into the save
    slow: bool = False  # a node slowed by SLOW_BY_S throughout, writes acknowledged at quorum


def cases(encodings: Sequence[str], ranks: Sequence[int], fail: bool) -> list[Case]:
    """A save of each encoding at each rank count, and with ``fail`` two of rs-6-3 (or the
    last encoding) at the fewest ranks: one with a node stopped into it, one with a node
    slowed throughout."""
    out = [Case(f"{e} save, {n:,} ranks", e, n) for n in ranks for e in encodings]
    if fail:
        e, n = ("rs-6-3" if "rs-6-3" in encodings else encodings[-1]), min(ranks)
        out.append(Case(f"{e} save, {n:,} ranks, node stopped", e, n, fail=True))
        out.append(Case(f"{e} save, {n:,} ranks, slow node", e, n, slow=True))
    return out


@dataclass(frozen=True, slots=True)
class Saved:
    """A real save's seconds, and where they went: the shares of them that the event loop's
    thread spent on a CPU (``thread_time``) and that the device had a request in flight
    (``device_busy_s``; 0 where it cannot be read)."""

    seconds: float
    loop_busy: float
    device_busy: float


@dataclass(frozen=True, slots=True)
class Round:
    """One real run of a case: its save and load (seconds), and the machine beside it:
    the device before and after, and the host's fresh memory (GB/s)."""

    save: Saved
    load_s: float
    device: Device
    fresh_gb_s: float
    device_after: Device  # measured again once the round is over

    @property
    def save_s(self) -> float:
        return self.save.seconds


Before = tuple[Saved, float, Device, float]  # a Round's fields but its device_after


async def real(case: Case, scale: float, directory: Path, cores: int) -> Before:
    """``case`` run (``save_and_load``) with the device measured (``measure_device``)
    before: a ``Round``'s fields but the last (``device_after``, ``probe``'s)."""
    device = await measure_device(directory, DEVICE_PROBE)
    save, load, fresh = await save_and_load(case, scale, directory, cores)
    return save, load, device, fresh


def probe(directory: Path) -> Device:
    """``measure_device`` in ``directory``, run to the end (in a process of its own: a
    probe in the process of a 16-rank round just over measured 1.80-1.88 GB/s where every
    other probe measured 1.15-1.79, 2026-12-06)."""
    return asyncio.run(measure_device(directory, DEVICE_PROBE))


async def save_and_load(
    case: Case, scale: float, directory: Path, cores: int
) -> tuple[Saved, float, float]:
    """``case`` on an embedded cluster in ``directory``: every rank from a common start to
    its commit, then (caches dropped) the host's rate of fresh memory as the load is about
    to meet it (``cores`` threads), then every rank's load of its own state. The save, the
    load's seconds, and that rate (GB/s)."""
    plan = checkpoint_plan(MODEL, case.ranks, scale)
    data = memoryview(os.urandom(plan.total))
    states, at = [], 0
    for rank in plan.per_rank:
        state = {}
        for f in rank.files:
            state[f.name], at = data[at : at + f.size], at + f.size
        states.append(state)
    root = Path(tempfile.mkdtemp(prefix="tectonic-sim-real-", dir=directory)) / "cluster"
    try:
        Cluster.create(root, nodes=NODES, disks_per_node=DISKS, encoding=case.encoding)
        async with Cluster.open(root, write_ack="quorum" if case.slow else None) as cluster:
            if case.slow:
                await cluster.set_node_delay(0, SLOW_BY_S)
            ckpt = Checkpointer(cluster.client(), "/ck", world_size=case.ranks)
            stop = (
                asyncio.get_running_loop().call_later(FAIL_AT_S, cluster.stop_node, 0)
                if case.fail
                else None
            )
            busy0, loop0 = device_busy_s(directory), time.thread_time()
            t0 = time.perf_counter()
            await asyncio.gather(*(ckpt.save(1, r, s) for r, s in enumerate(states)))
            seconds = time.perf_counter() - t0
            loop, busy1 = time.thread_time() - loop0, device_busy_s(directory)
            device = 0.0 if busy0 is None or busy1 is None else (busy1 - busy0) / seconds
            save = Saved(seconds, loop / seconds, min(1.0, device))
            if stop is not None:
                stop.cancel()  # a save done before FAIL_AT_S: no node to stop after it
            await cluster.datapath.drain()
            drop_caches()
            sample = os.urandom(8 << 20)
            fresh = await asyncio.to_thread(fresh_memory_gb_s, sample, threads=cores)
            t0 = time.perf_counter()
            got = await asyncio.gather(*(ckpt.load(r, 1) for r in range(case.ranks)))
            load = time.perf_counter() - t0
            for r, (loaded, saved) in enumerate(zip(got, states, strict=True)):
                if any(loaded[n] != bytes(v) for n, v in saved.items()):
                    raise RuntimeError(f"{case.name}: rank {r} loaded other bytes than it saved")
            await ckpt.close()
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
    return save, load, fresh


def real_round(case: Case, scale: float, directory: Path, cores: int) -> Before:
    """``real`` run to the end (in a process of its own: ``apart``)."""
    return asyncio.run(real(case, scale, directory, cores))


async def apart(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a new process, spawned (a forked one would start with this
    process's heap): each real round meets the memory a process starting to load a
    checkpoint meets (module docstring)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


def traced_round(case: Case, scale: float, directory: Path, cores: int) -> list[Span]:
    """The spans (``bench/sim_trace.py``) of ``case``'s save and load, without the device's
    measurements, which a traced round does not report."""
    with traced() as spans:
        asyncio.run(save_and_load(case, scale, directory, cores))
    return spans


__all__ = [
    "DEVICE_PROBE",
    "FAIL_AT_S",
    "MODEL",
    "SLOW_BY_S",
    "Before",
    "Case",
    "Round",
    "Saved",
    "apart",
    "cases",
    "probe",
    "real",
    "real_round",
    "save_and_load",
    "traced_round",
]
