"""Client CPU: the data path's per-byte work, charged to a host's cores.

The real code counts its work where it does it (``coding/work.py``): CRC32C, Reed-Solomon
encode and decode, the digests of incremental checkpoints, each frame's MAC and socket
copy, copies of payloads into fresh memory (a load's values, a read out of a server's page
cache) and into memory in use (a writer's recycled block buffers); a server's copies are
charged to the server's CPU where it has one (``Hardware.embedded``). A ``HostCpu`` is one
client host's ``Tally``. Each time a job settles (the end of an ``offload``, of an executor
job, of a frame a ``ModelNode`` sends or receives), the job's work takes
``CpuModel.seconds(work)`` of one core, first come first served over the host's ``cores``:
the real client hands this work to a pool of as many threads as cores. Work done on the
event loop (counted outside a thread's job, ``work.on_thread``) also takes the loop of one
of the host's processes, which does one thing at a time; a copy into fresh memory also
takes the host's rate of new pages, where the model has one, and goes at the rate of its
size, where the model has rates by size (``copy_rates``: a small value's copy costs more
per byte here). A node call's Python is charged to the loop part as the call is made and
part as its reply is taken up, behind whatever the loop is doing then, and so is a job's
hop to the CPU pool (``offload``). The rest of the client's Python on the loop is charged
per event where the model has a figure for it (``python_s``: per block written, per
rank's state staged; ``work.python``).

What is not charged: the client's Python beyond those events and calls, compression (a
projection's payloads are incompressible, and ``auto`` then costs one small sample), and
the CPU of servers on hosts of their own.

``CpuModel.measure()`` times each kind of work here, on this machine's libraries, for the
``this-machine`` preset; ``ASSUMED_SERVER_CORE`` is a figure for a modern server core.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import mmap
import multiprocessing
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tectonic_emu.coding import work
from tectonic_emu.sim.resources import QueueResource, use_all


@dataclass(frozen=True, slots=True)
class CpuModel:
    """``cores`` cores, each doing ``gbps[kind]`` GB/s of each kind of work in
    ``work.KINDS`` (bytes of input per second of one core). ``fresh_gb_s``: the host's
    rate of copies into fresh memory however many threads make them (a VM whose host hands
    it new pages at one rate, ../shared/MACHINE.md); None: each core's ``copy`` rate.
    ``call_s``: seconds of the event loop's Python per node call (its future, its job on
    an I/O pool, its wake-up), where measured; 0: not charged. ``reply_share`` of it is
    charged as the reply is taken up, the rest as the call is made: a reply waits for the
    loop as any callback does. ``copy_sizes``: (bytes, GB/s) of one core's copies of
    values of that size into fresh memory, where measured (``copy_rates``): a copy of
    another size takes the rate of its neighbours, interpolated on the log of the size and
    held beyond the ends; empty: ``gbps["copy"]`` at any size. ``python_s``: seconds of
    the event loop's Python per event of ``work.EVENTS`` (a block written, a rank's state
    staged) beyond its node calls and hops, where measured; missing: not charged."""

    cores: int
    gbps: Mapping[str, float] = field(hash=False)
    source: str = ""
    fresh_gb_s: float | None = None
    call_s: float = 0.0
    copy_sizes: tuple[tuple[int, float], ...] = ()
    reply_share: float = 0.0
    python_s: Mapping[str, float] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"a host has at least one core, not {self.cores}")
        missing = [k for k in work.KINDS if not self.gbps.get(k, 0) > 0]
        if missing:
            raise ValueError(f"a CPU model needs a positive rate for {', '.join(missing)}")
        if self.fresh_gb_s is not None and not self.fresh_gb_s > 0:
            raise ValueError(f"fresh memory comes at a positive rate, not {self.fresh_gb_s}")
        if not (math.isfinite(self.call_s) and self.call_s >= 0):
            raise ValueError(f"a call's cost cannot be negative: {self.call_s}")
        if not 0 <= self.reply_share <= 1:
            raise ValueError(f"a reply's share of a call is within [0, 1]: {self.reply_share}")
        if any(not (n > 0 and rate > 0) for n, rate in self.copy_sizes):
            raise ValueError(f"copies of positive sizes at positive rates: {self.copy_sizes}")
        bad = {k: s for k, s in self.python_s.items()
               if k not in work.EVENTS or not (math.isfinite(s) and s >= 0)}  # fmt: skip
        if bad:
            raise ValueError(f"the loop's Python per event of {work.EVENTS}, >= 0 s: {bad}")
        if list(self.copy_sizes) != sorted(dict(self.copy_sizes).items()):
            raise ValueError(f"copy rates by size, each size once, in order: {self.copy_sizes}")

    def copy_gbps(self, nbytes: int) -> float:
        """GB/s of one core's copy of ``nbytes`` into fresh memory (``copy_sizes``)."""
        points = self.copy_sizes
        if not points:
            return self.gbps["copy"]
        k = bisect.bisect_left(points, nbytes, key=lambda p: p[0])
        if k == 0:
            return points[0][1]
        if k == len(points):
            return points[-1][1]
        (n0, r0), (n1, r1) = points[k - 1], points[k]
        w = math.log(nbytes / n0) / math.log(n1 / n0)
        return r0 + w * (r1 - r0)

    def seconds(self, done: Mapping[str, int]) -> float:
        """Core-seconds that ``done`` (bytes per kind) takes at least: its copies at the
        fastest of ``copy_sizes``' rates where it has them (``done`` has no sizes), so that
        a projection's lower bound is one."""
        fastest = {"copy": max(r for _, r in self.copy_sizes)} if self.copy_sizes else {}
        return sum(n / (fastest.get(kind, self.gbps[kind]) * 1e9) for kind, n in done.items())

    @classmethod
    def measure(cls, *, cores: int | None = None, repeat: int = 5) -> CpuModel:
        """Each kind timed here in 8 MiB calls over 64 MiB of random bytes (the best of
        ``repeat`` passes), with ``cores`` (default: this machine's) cores; and the host's
        rate of fresh memory (``fresh_memory_gb_s``)."""
        data = os.urandom(_MEASURE_BYTES)
        cores = cores or os.cpu_count() or 1
        fresh = fresh_memory_gb_s(data[:_MEASURE_CALL], threads=cores)  # first: memory is new
        return cls(
            cores,
            {kind: _gbps(fn, repeat) for kind, fn in _measurements(data).items()},
            "measured on this machine (sim/cpu.py, CpuModel.measure)",
            fresh_gb_s=fresh,
        )


class HostCpu(work.Tally):
    """One client host's cores: the work of each job settled is charged in its turn. Every
    job takes one of the ``cores``. Work on an event loop also takes one of the host's
    ``loops`` (a thread per client process: one on an embedded cluster, one per rank where
    each rank is a process, as torchrun starts them). A copy into fresh memory also takes
    the host's ``memory``, where the model has a rate for it (``CpuModel.fresh_gb_s``)."""

    def __init__(self, model: CpuModel, *, name: str = "", loops: int = 1) -> None:
        super().__init__()
        self.model = model
        self.cores = QueueResource(1.0, servers=model.cores, name=name)
        self.loop = QueueResource(1.0, servers=loops, name=f"{name} event loops".strip())
        self.processes = loops
        self.memory = (
            None
            if model.fresh_gb_s is None
            else QueueResource(model.fresh_gb_s * 1e9, name=f"{name} fresh memory".strip())
        )
        self.owed_fresh = 0  # bytes copied into fresh memory, not charged yet
        self._per_byte = {kind: 1 / (rate * 1e9) for kind, rate in model.gbps.items()}
        self._copy_per_byte: dict[int, float] = {}  # by size, where rates differ by size

    def add(self, kind: str, nbytes: int) -> None:
        super().add(kind, nbytes)
        if kind == "copy" and self.model.copy_sizes:
            per = self._copy_per_byte.get(nbytes)
            if per is None:
                per = self._copy_per_byte[nbytes] = 1 / (self.model.copy_gbps(nbytes) * 1e9)
            seconds = nbytes * per
        else:
            seconds = nbytes * self._per_byte[kind]
        self.owed += seconds
        if not self.threads:
            self.owed_loop += seconds
        if kind == "copy" and self.memory is not None:
            self.owed_fresh += nbytes

    def add_calls(self, n: int, *, replies: bool = False) -> None:
        super().add_calls(n, replies=replies)
        # on the loop, wherever the call was made from
        share = self.model.reply_share if replies else 1 - self.model.reply_share
        self._on_loop(n * self.model.call_s * share)

    def add_event(self, kind: str) -> None:
        super().add_event(kind)
        self._on_loop(self.model.python_s.get(kind, 0.0))  # as a call's Python is

    def _on_loop(self, seconds: float) -> None:
        """``seconds`` of the event loop's Python owed: a core's and the loop's."""
        self.owed += seconds
        self.owed_loop += seconds

    def claim(self) -> Awaitable[None]:
        jobs = [self.cores.begin(self.owed)]
        if self.owed_loop:
            jobs.append(self.loop.begin(self.owed_loop))
        if self.owed_fresh and self.memory is not None:
            jobs.append(self.memory.begin(self.owed_fresh))
        self.owed = self.owed_loop = 0.0
        self.owed_fresh = 0
        return jobs[0] if len(jobs) == 1 else use_all(jobs)


# A current server core, for presets without a measurement of their own. ASSUMED, not
# measured: about twice what CpuModel.measure() gives on this machine's cores (a small cloud
# VM, docs/simulate.md), for the same libraries.
ASSUMED_SERVER_CORE: Mapping[str, float] = {
    "crc32c": 20.0,
    "crc32c-pieces": 14.0,
    "rs-encode": 12.0,
    "rs-decode": 6.0,
    "blake2b": 1.0,
    "wire": 6.0,
    "copy": 3.0,
    "copy-warm": 6.0,
    "new-pages": 10.0,
}

# Each kind is measured on calls of _MEASURE_CALL bytes (a block, a chunk) taken in turn
# from _MEASURE_BYTES, twice this machine's 32 MiB L3: a checkpoint's state comes from
# memory, not the cache. On one 8 MiB buffer, warm in the cache, CRC32C measured 18-26
# GB/s and RS encode 34; over 64 MiB 12-14.4 and 17-21, and a real 1,024-rank save
# checksummed its small pieces at 11 (2026-12-06).
_MEASURE_BYTES = 64 << 20
_MEASURE_CALL = 8 << 20
# Copies by size (copy_rates): 512 MiB of each size measured within 2-4% from one process
# to the next, where 256 MiB spread by 8% (2026-12-06).
COPY_PROBE_BYTES = 512 << 20
COPY_SIZES = (64 << 10, 64 << 20)  # the sizes copy_rates measures, at least and at most


def fresh_memory_gb_s(data: bytes, *, threads: int, total: int = 256 << 20) -> float:
    """GB/s of copies of ``data`` into fresh memory, kept (as a load keeps its values),
    ``total`` bytes by ``threads`` threads at once: what the host gives a busy process,
    which on this kind of VM is no more than one thread gets (../shared/MACHINE.md).

    Each copy goes into its own anonymous ``mmap``, as a load's big values do (above
    glibc's mmap threshold), so every page is faulted in and zeroed by the kernel: copies
    into ``malloc``'s memory reused what earlier calls had freed, and measured 0.75-5 GB/s
    where these measure 1.3-1.7 (2026-12-03)."""
    src = np.frombuffer(data, dtype=np.uint8)
    per = max(1, total // threads // len(src))
    kept: list[list[Any]] = [[] for _ in range(threads)]

    def copies(out: list[Any]) -> None:
        for _ in range(per):
            dest = mmap.mmap(-1, len(src))
            np.copyto(np.frombuffer(dest, dtype=np.uint8), src)  # the GIL let go
            out.append(dest)

    pool = [threading.Thread(target=copies, args=(out,)) for out in kept]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - t0
    for out in kept:
        for dest in out:
            dest.close()
    return threads * per * len(src) / max(elapsed, 1e-9) / 1e9


def fresh_copy_gb_s(size: int, total: int = COPY_PROBE_BYTES) -> float:
    """GB/s of this thread's copies of ``size`` bytes into new ``bytes``, kept, ``total``
    bytes of them, as a load makes its values (``clients/ckpt_parts.as_bytes``): from a
    buffer of random bytes at offsets that move by ``size``, with malloc tuned as a
    cluster's process has it (``_malloc.py``). Meant for a new process (``copy_rates``):
    what the heap holds already decides what a copy costs."""
    from tectonic_emu._malloc import keep_freed_memory

    keep_freed_memory()
    src = memoryview(os.urandom(max(_MEASURE_BYTES, 2 * size)))
    count = max(1, total // size)
    kept: list[bytes] = []
    t0 = time.perf_counter()
    for k in range(count):
        at = k * size % (len(src) - size + 1)
        kept.append(bytes(src[at : at + size]))
    return count * size / max(time.perf_counter() - t0, 1e-9) / 1e9


def copy_rates(sizes: Iterable[int], total: int = COPY_PROBE_BYTES) -> dict[int, float]:
    """``fresh_copy_gb_s`` of each size, each in a new process (spawned: a fork would start
    with this one's heap). A size beyond ``COPY_SIZES`` is measured at the nearer end (a
    rate by size holds beyond its ends): smaller copies would take millions of calls,
    larger ones more memory than the probe's bytes."""
    lo, hi = COPY_SIZES
    spawn = multiprocessing.get_context("spawn")
    out = {}
    for size in sorted({min(max(n, lo), hi) for n in sizes}):
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            out[size] = pool.submit(fresh_copy_gb_s, size, total).result()
    return out


def _gbps(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm: tables, pages
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return _MEASURE_BYTES / max(best, 1e-9) / 1e9


def _measurements(data: bytes) -> dict[str, Callable[[], object]]:
    """One pass of each kind of work over ``data``, in calls of ``_MEASURE_CALL`` bytes as
    the data path makes them."""
    from tectonic_emu.bufpool import PAGE, copy_into, uninitialised
    from tectonic_emu.chunkstore._format import piece_table
    from tectonic_emu.chunkstore.auth import FrameMac
    from tectonic_emu.coding import Encoding, codec_for, crc32c

    view = memoryview(data)
    calls = [view[k : k + _MEASURE_CALL] for k in range(0, len(view), _MEASURE_CALL)]
    rs = codec_for(Encoding.parse("rs-6-3"))
    mac = FrameMac(bytes(32))
    # Each call's chunks but its first three data chunks, as a decode of three lost finds them.
    survivors = [{i: c for i, c in enumerate(rs.encode(p)) if i >= 3} for p in calls]
    # Copies into fresh memory, kept: a load's values and a node's page cache are new pages
    # (1.3 GB/s here, against 5-9 GB/s into memory just freed).
    kept: list[bytes] = []
    # And into memory in use: as many buffers of a call as the data has, each touched once
    # first, filled in turn, as a writer fills its recycled block buffers. One warm buffer
    # of 8 MiB stays in the 32 MiB L3: copies into it ran at 25 GB/s where a writer's
    # copies into its blocks ran at 10.6-13.8 (2026-12-06).
    warm = [uninitialised(_MEASURE_CALL) for _ in calls]
    for buf in warm:
        buf[:] = calls[0]
    turn = iter(range(1 << 62))

    def each(fn: Callable[[memoryview], object]) -> Callable[[], None]:
        def run() -> None:
            for p in calls:
                fn(p)  # its output let go, as a block's once written

        return run

    def decode() -> None:
        for chunks in survivors:
            rs.decode(chunks, _MEASURE_CALL)

    # New block buffers as a writer's recycler allocates them (``uninitialised``, as
    # ``bufpool.Recycler``), each page touched once: the kernel's faults and zeroing, huge
    # pages where it gives them. One buffer of the whole pass, above malloc's mmap
    # threshold, so that it is new memory each time (the heap may hand back memory touched
    # before); kept, as a writer keeps its blocks, so that giving it back is not timed.
    def new_pages() -> None:
        buf = uninitialised(_MEASURE_BYTES)
        np.frombuffer(buf, dtype=np.uint8)[::PAGE] = 0
        kept_new.append(buf)

    kept_new: list[object] = []

    return {
        "crc32c": each(crc32c),
        "crc32c-pieces": each(piece_table),
        "rs-encode": each(rs.encode),
        "rs-decode": decode,
        "blake2b": each(lambda p: hashlib.blake2b(p, digest_size=16).digest()),
        # a frame's MAC, and the copy a socket send makes
        "wire": each(lambda p: (mac.tag(mac.next_seq(), [p]), bytearray(p))),
        "copy": each(lambda p: kept.append(bytes(p))),
        "copy-warm": each(lambda p: copy_into(warm[next(turn) % len(warm)], 0, p)),
        "new-pages": new_pages,
    }


__all__ = [
    "ASSUMED_SERVER_CORE",
    "COPY_PROBE_BYTES",
    "COPY_SIZES",
    "CpuModel",
    "HostCpu",
    "copy_rates",
    "fresh_copy_gb_s",
    "fresh_memory_gb_s",
]
