"""Seeded fault schedules, and their injection into a model cluster's servers.

A schedule is a list of ``Fault``s drawn from one ``random.Random``: when (virtual seconds
after the workload starts), what, on which server, for how long. ``Injector`` applies them
to a ``ModelCluster`` as the virtual clock reaches each one, and heals what heals:

- ``kill``: the server crashes, losing what a power cut loses (chunks written unsynced
  since their disk's last sync, ``MemoryNode.crash``), stops answering for a while, then
  comes back. No committed block may be left with fewer durable chunks than the quorum
  that acknowledged it (a straggler's chunk, written after the acknowledgment and not yet
  synced, may be lost), which the injector checks at every crash;
- ``slow``: every call to the server takes ``SLOW_S`` longer, then normal again;
- ``partition``: one client host cannot reach the server (the others can), then can
  again;
- ``full``: one of the server's disks refuses writes as a full disk does (ENOSPC), then
  has room again;
- ``meta-down``: the metadata store fails every transaction, as ``PostgresKV`` does when
  its connection resets (``ModelKV.down``: nothing of a failed one committed), then comes
  back; ``meta-slow``: each transaction's commit takes ``META_STALL_S`` longer;
- ``corrupt``: one stored chunk gets a flipped bit, as a failing disk's sector would;
- ``lose``: one stored chunk is gone, as with a disk replaced or a file removed.

Corrupt and lost chunks stay until repair rebuilds them. Damage (kills, corrupt and lost
chunks) falls only on ``victims`` servers chosen for the seed, no more than the encoding
tolerates, so every acknowledged byte stays readable throughout: a read that fails is
then a bug, not bad luck. Slow servers may be any.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tectonic_emu import clock
from tectonic_emu.coding import Encoding
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.sim.cluster import ModelCluster
from tectonic_emu.sim.fabric import Host
from tectonic_emu.sim.metadata import ModelKV

KINDS = ("kill", "slow", "partition", "full", "corrupt", "lose", "meta-down", "meta-slow")
DAMAGE = frozenset({"kill", "partition", "corrupt", "lose"})
HARMLESS = tuple(k for k in KINDS if k not in DAMAGE)  # what may fall on any server
HEALED = frozenset(  # each lasts its duration
    {"kill", "slow", "partition", "full", "meta-down", "meta-slow"}
)
SLOW_S = 0.05  # seconds a slow server adds to every call
META_STALL_S = 0.02  # seconds a stalled metadata store adds to each commit


@dataclass(frozen=True, slots=True)
class Fault:
    """``kind`` on server ``server`` at ``at`` virtual seconds, for ``duration`` (kill,
    slow, partition); ``pick`` chooses which stored chunk (corrupt and lose) among the
    server's, or which client host (partition)."""

    at: float
    kind: str
    server: int
    duration: float = 0.0
    pick: int = 0


def schedule(
    rng: random.Random, *, servers: int, victims: int, horizon: float, count: int
) -> list[Fault]:
    """``count`` faults within ``horizon`` seconds, in time order; damage only on
    ``victims`` servers drawn first (``victims`` at most what the encoding tolerates)."""
    chosen = rng.sample(range(servers), victims) if victims else []
    out: list[Fault] = []
    for _ in range(count):
        kind = rng.choice(KINDS if chosen else HARMLESS)
        server = rng.choice(chosen) if kind in DAMAGE else rng.randrange(servers)
        at = round(rng.uniform(0.0, horizon), 6)
        duration = round(rng.uniform(0.01, horizon / 2), 6) if kind in HEALED else 0.0
        out.append(Fault(at, kind, server, duration, rng.randrange(1 << 30)))
    out.sort(key=lambda f: (f.at, f.server, f.kind))
    return out


class Injector:
    """Applies ``faults`` to ``mc``'s servers in virtual time (``run``); ``injected``
    counts them by kind (a corrupt or lose on a server holding no chunk yet is skipped)."""

    def __init__(
        self,
        mc: ModelCluster,
        faults: list[Fault],
        violations: list[str],
        quorum: Callable[[Encoding], int],
        hosts: Sequence[Host],
        truth: Metadata,
    ) -> None:
        self.mc = mc
        self.truth = truth  # the metadata as stored, read past the store's faults
        self.hosts = list(hosts)  # the client hosts, which partitions cut off
        self.faults = faults
        self.violations = violations  # what the crashes' check finds
        self.quorum = quorum  # chunks durable before a block is acknowledged
        self._lost: set[tuple[int, int, str]] = set()  # (server, disk, chunk) lose faults took
        self.injected: Counter[str] = Counter()
        self._down: Counter[int] = Counter()  # kills in force per server
        self._slow: Counter[int] = Counter()
        self._cut: Counter[tuple[int, int]] = Counter()  # partitions: (server, host)
        self._full: Counter[tuple[int, int]] = Counter()  # full disks: (server, disk)
        self._meta: Counter[str] = Counter()  # metadata outages and stalls in force
        self._heals: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        start = clock.monotonic()
        for f in self.faults:
            wait = start + f.at - clock.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if await self._apply(f):
                self.injected[f.kind] += 1
        await asyncio.gather(*self._heals)

    async def _apply(self, f: Fault) -> bool:
        server = self.mc.servers[f.server]
        if f.kind == "kill":
            self._down[f.server] += 1
            server.available = False
            await self._crash(f.server)
        elif f.kind == "slow":
            self._slow[f.server] += 1
            server.delay = SLOW_S
        elif f.kind == "partition":
            host = f.pick % len(self.hosts)
            self._cut[(f.server, host)] += 1
            server.cut_off.add(self.hosts[host])
        elif f.kind in ("meta-down", "meta-slow"):
            self._meta[f.kind] += 1
            self._meta_now()
        elif f.kind == "full":
            disk = f.pick % len(server.disks)
            self._full[(f.server, disk)] += 1
            server.store.full.add(disk)
        else:
            chunks = [
                (d, info.chunk_id)
                for d in range(len(server.disks))
                for info in await server.store.list_chunks(d)
            ]
            if not chunks:
                return False
            disk, chunk_id = sorted(chunks)[f.pick % len(chunks)]
            if f.kind == "corrupt":
                server.store.corrupt(disk, chunk_id)
            else:
                await server.store.delete_chunk(disk, chunk_id)
                self._lost.add((f.server, disk, chunk_id))
            return True
        self._heals.append(asyncio.ensure_future(self._heal(f)))
        return True

    def _meta_now(self) -> None:
        kv = self.mc.kv
        assert isinstance(kv, ModelKV), "metadata faults need a modelled store"
        kv.down = self._meta["meta-down"] > 0
        kv.stall = META_STALL_S if self._meta["meta-slow"] > 0 else 0.0

    async def _crash(self, n: int) -> None:
        """Crash server ``n``: a violation for each committed block that it leaves with
        fewer durable chunks than acknowledged it (those lose faults took count: they were
        durable until then)."""
        lost = set(self.mc.servers[n].store.crash())
        if not lost:
            return
        servers = self.mc.servers
        async for rec in self.truth.iter_blocks():
            if not any(c.node == n and (c.disk, c.chunk_id) in lost for c in rec.chunks):
                continue
            durable = sum(
                (c.node, c.disk, c.chunk_id) in self._lost
                or servers[c.node].store.durable(c.disk, c.chunk_id)
                for c in rec.chunks
            )
            need = self.quorum(Encoding.parse(rec.encoding))
            if durable < need:
                self.violations.append(
                    f"a crash of server {n} left committed block {rec.block_id:016x} with "
                    f"{durable} durable chunks of the {need} that acknowledged it"
                )

    async def _heal(self, f: Fault) -> None:
        await asyncio.sleep(f.duration)
        server = self.mc.servers[f.server]
        if f.kind == "partition":
            key = (f.server, f.pick % len(self.hosts))
            self._cut[key] -= 1
            if self._cut[key] == 0:
                server.cut_off.discard(self.hosts[key[1]])
            return
        if f.kind in ("meta-down", "meta-slow"):
            self._meta[f.kind] -= 1
            self._meta_now()
            return
        if f.kind == "full":
            key = (f.server, f.pick % len(server.disks))
            self._full[key] -= 1
            if self._full[key] == 0:
                server.store.full.discard(key[1])
            return
        counts = self._down if f.kind == "kill" else self._slow
        counts[f.server] -= 1
        if counts[f.server] == 0:
            if f.kind == "kill":
                server.available = True
            else:
                server.delay = 0.0


__all__ = [
    "DAMAGE",
    "HARMLESS",
    "HEALED",
    "KINDS",
    "META_STALL_S",
    "SLOW_S",
    "Fault",
    "Injector",
    "schedule",
]
