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
        # Faults in force, by what they switch: (kind, server, host or disk); a switch is
        # on while any of its faults lasts (overlapping ones heal at the last one's end).
        self._in_force: Counter[tuple[str, int, int]] = Counter()
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
        if f.kind in HEALED:
            self._switch(f, +1)
            if f.kind == "kill":
                await self._crash(f.server)
            self._heals.append(asyncio.ensure_future(self._heal(f)))
            return True
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

    async def _heal(self, f: Fault) -> None:
        await asyncio.sleep(f.duration)
        self._switch(f, -1)

    def _switch(self, f: Fault, by: int) -> None:
        """Count ``f`` in (+1) or out (-1) of force, and set what it switches to match."""
        server = self.mc.servers[f.server]
        target = 0  # the host a partition cuts off, the disk a full fault fills
        if f.kind == "partition":
            target = f.pick % len(self.hosts)
        elif f.kind == "full":
            target = f.pick % len(server.disks)
        key = (f.kind, -1 if f.kind.startswith("meta") else f.server, target)
        self._in_force[key] += by
        on = self._in_force[key] > 0
        kv = self.mc.kv
        if f.kind == "kill":
            server.available = not on
        elif f.kind == "slow":
            server.delay = SLOW_S if on else 0.0
        elif f.kind == "partition":
            (server.cut_off.add if on else server.cut_off.discard)(self.hosts[target])
        elif f.kind == "full":
            (server.store.full.add if on else server.store.full.discard)(target)
        else:
            assert isinstance(kv, ModelKV), "metadata faults need a modelled store"
            if f.kind == "meta-down":
                kv.down = on
            else:
                kv.stall = META_STALL_S if on else 0.0

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
