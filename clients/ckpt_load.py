"""The load path of a ``Checkpointer``: ``Loader``.

``load`` calls made in the same event-loop iteration are served together, as by
``load_many``: one manifest look-up (``clients/ckpt_catalog.py``), one plan, values laid out
in shared buffers and read in file order (``clients/ckpt_parts.py``). A rank's error stays its
own: when the joint load fails, each of its ranks is loaded alone. Loads at another world size
(resharding, ``clients/ckpt_region.py``) and regions of a global array (``read``) are planned
per rank and value.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import Any

from clients.ckpt_catalog import Catalog, Indexed
from clients.ckpt_format import (
    CheckpointError,
    CheckpointNotFoundError,
    Entry,
    Manifest,
    Shard,
    Value,
    rank_error,
)
from clients.ckpt_parts import (
    ARENA_BYTES,
    READS_IN_FLIGHT,
    Arena,
    PartReader,
    arenas,
    as_bytes,
    as_value,
    empty_value,
    runs_of,
)
from clients.ckpt_region import Box, even_rows, region
from clients.ckpt_select import box_destination, destination, not_saved_by, selected
from tectonic_emu.bufpool import recycled, uninitialised
from tectonic_emu.coding import work
from tectonic_emu.coding.synthetic import sliced
from tectonic_emu.errors import TectonicError

# Arenas of bytes values a load reads at once, each into a reused buffer (``_bytes_arena``):
# 256 MiB, and 8 x 4 chunk reads of 8 MiB in flight.
BYTES_ARENAS_IN_FLIGHT = 8

# A load waiting to be served with others: rank, the caller's future, its ``into``, its
# ``names``.
_LoadAsk = tuple[
    int, "asyncio.Future[dict[str, Value]]", "Mapping[str, Value] | None", "Collection[str] | None"
]


class Loader:
    """The loads and reads of one Checkpointer. ``Checkpointer``'s methods of the same names
    document what they return and raise."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.root = catalog.root
        self.parts = PartReader(catalog)
        # Loads waiting to be served together, by (step, world_size).
        self._loading: dict[tuple[int | None, int | None], list[_LoadAsk]] = {}
        self._load_tasks: set[asyncio.Task[None]] = set()

    def tasks(self) -> list[asyncio.Task[None]]:
        """The batched loads still running (for ``close`` to cancel)."""
        return list(self._load_tasks)

    async def load(
        self,
        rank: int,
        step: int | None = None,
        world_size: int | None = None,
        *,
        into: Mapping[str, Value] | None = None,
        names: Collection[str] | None = None,
    ) -> dict[str, Value]:
        """``Checkpointer.load``: queued with the other calls of this loop iteration."""
        loop = asyncio.get_running_loop()
        key = (step, world_size)
        batch = self._loading.get(key)
        if batch is None:
            batch = self._loading[key] = []
            loop.call_soon(self._serve_loads, key)  # after this iteration's other callers
        fut: asyncio.Future[dict[str, Value]] = loop.create_future()
        batch.append((rank, fut, into, names))
        return await fut

    def _serve_loads(self, key: tuple[int | None, int | None]) -> None:
        batch = self._loading.pop(key)
        task = asyncio.ensure_future(self._load_batch(*key, batch))
        self._load_tasks.add(task)
        task.add_done_callback(self._load_tasks.discard)

    async def _load_batch(
        self, step: int | None, world_size: int | None, batch: list[_LoadAsk]
    ) -> None:
        """Resolve each of ``batch``'s futures with its rank's state or its error."""
        outs: list[Any] = []
        try:
            ix = await self.catalog.indexed(step)
            m = ix.manifest
            ws = m.world_size if world_size is None else world_size
            for r, _, _, names in batch:
                try:
                    if (err := rank_error(r, ws)) is not None:
                        raise err
                    if names is not None:
                        selected(names, ix.by_name, m.step, self.root)
                    outs.append(None)
                except CheckpointError as exc:
                    outs.append(exc)
            joint: dict[int, int] = {}  # rank -> its first ask; a rank asked again goes alone
            for k, ask in enumerate(batch):
                if outs[k] is None:
                    joint.setdefault(ask[0], k)
            alone = [k for k, ask in enumerate(batch) if outs[k] is None and joint[ask[0]] != k]
            if ws == m.world_size and len(joint) > 1:
                try:
                    asks = [batch[k] for k in joint.values()]
                    got = await self._load_ranks(
                        ix, list(joint), [a[2] for a in asks], [a[3] for a in asks]
                    )
                    for k, out in zip(joint.values(), got, strict=True):
                        outs[k] = out
                except TectonicError:  # (a defect is not a rank's error: it is raised)
                    alone += joint.values()  # each alone: a rank's error is its own
            else:
                alone += joint.values()
            done = await asyncio.gather(
                *(self._load_one(ix, batch[k][0], ws, batch[k][2], batch[k][3]) for k in alone),
                return_exceptions=True,
            )
            for k, one in zip(alone, done, strict=True):
                outs[k] = one
        except Exception as exc:  # no manifest
            outs = [exc] * len(batch)
        except BaseException:  # cancelled (close): so are the loads waiting
            for ask in batch:
                ask[1].cancel()
            raise
        for ask, out in zip(batch, outs, strict=True):
            fut = ask[1]
            if fut.done():
                continue  # its caller was cancelled
            if isinstance(out, BaseException):
                fut.set_exception(out)
            else:
                fut.set_result(out)

    async def _load_one(
        self,
        ix: Indexed,
        rank: int,
        ws: int,
        into: Mapping[str, Value] | None = None,
        names: Collection[str] | None = None,
    ) -> dict[str, Value]:
        """``load`` of one rank alone, planning its own reads; every name and destination is
        checked before anything is read."""
        m = ix.manifest
        into = into or {}
        # (name, the entry to read or the first of a resharded Shard's, its box, where to)
        jobs: list[tuple[str, Entry, Box | None, Any]] = []
        # At the saved world size a rank reads only what it saved: its own names will do.
        mine = ws == m.world_size and names is None
        for name in ix.names_of(rank) if mine else selected(names, ix.by_name, m.step, self.root):
            entries = ix.by_name[name]
            first, given = entries[0], into.get(name)
            if ws == m.world_size:
                own = ix.own.get((name, rank))
                if own is not None:
                    jobs.append(
                        (name, own, None, None if given is None else destination(own, given))
                    )
                elif names is not None:
                    raise not_saved_by(rank, name, m.step, self.root)
            elif first.kind == "shard":
                g = first.global_shape
                box = (even_rows(g[0], ws, rank), *((0, n) for n in g[1:]))
                if given is not None:
                    shape = [hi - lo for lo, hi in box]
                    given = box_destination(name, rank, given, first.dtype, shape)
                jobs.append((name, first, box, given))
            elif _alike(entries):
                jobs.append(
                    (name, first, None, None if given is None else destination(first, given))
                )
            else:
                raise CheckpointError(
                    f"step {m.step}: {name!r} differs between ranks, so it cannot be loaded at "
                    f"world size {ws} (saved at {m.world_size}); leave it out with names=",
                    self.root,
                )
        out: dict[str, Value] = {}
        sem = asyncio.Semaphore(READS_IN_FLIGHT)
        for name, e, cut, dest in jobs:
            if cut is not None:
                arr = await self.parts.assemble(ix, ix.by_name[name], cut, sem, dest)
                out[name] = Shard(arr, e.global_shape, tuple(lo for lo, _ in cut))
            elif e.kind == "shard":
                value = await self.parts.value(ix, e, sem, dest)
                out[name] = Shard(value, e.global_shape, e.offset)
            else:
                out[name] = await self.parts.value(ix, e, sem, dest)
        return out

    async def read(
        self, step: int, name: str, index: Any = None, *, rank: int | None = None
    ) -> Value:
        """``Checkpointer.read``: only the rows of the parts the region meets are read."""
        ix = await self.catalog.indexed(step)
        entries = ix.by_name.get(name)
        if not entries:
            raise CheckpointNotFoundError(f"step {step} has no {name!r}", self.root)
        sem = asyncio.Semaphore(READS_IN_FLIGHT)
        if entries[0].kind != "shard":
            if rank is not None:
                entries = [e for e in entries if e.rank == rank]
                if not entries:
                    raise CheckpointNotFoundError(f"rank {rank} saved no {name!r}", self.root)
            elif not _alike(entries):
                raise CheckpointError(f"{name!r} differs between ranks: pass rank=", self.root)
            if entries[0].kind in ("bytes", "synthetic"):
                value = await self.parts.value(ix, entries[0], sem)
                return value if index is None else value[index]
            entries = entries[:1]
        shape = entries[0].global_shape if entries[0].kind == "shard" else entries[0].shape
        if not shape:  # a 0-d array
            value = await self.parts.value(ix, entries[0], sem)
            return value if index is None else value[index]
        box, inner = region(index, shape)
        arr = await self.parts.assemble(ix, entries, box, sem)
        return arr[inner]

    async def load_many(
        self,
        ranks: Sequence[int],
        step: int | None = None,
        *,
        into: Sequence[Mapping[str, Value] | None] | None = None,
        names: Collection[str] | None = None,
    ) -> list[dict[str, Value]]:
        """``Checkpointer.load_many``: every argument checked, then one plan."""
        ix = await self.catalog.indexed(step)
        m = ix.manifest
        for rank in ranks:
            if (err := rank_error(rank, m.world_size)) is not None:
                raise err
        if into is not None and len(into) != len(ranks):
            raise CheckpointError(f"into= has {len(into)} states for {len(ranks)} ranks")
        if names is not None:
            names = selected(names, ix.by_name, m.step, self.root)
        return await self._load_ranks(ix, ranks, into, [names] * len(ranks))

    async def _load_ranks(
        self,
        ix: Indexed,
        ranks: Sequence[int],
        into: Sequence[Mapping[str, Value] | None] | None = None,
        names: Sequence[Collection[str] | None] | None = None,
    ) -> list[dict[str, Value]]:
        m = ix.manifest
        outs: list[dict[str, Value]] = [{} for _ in ranks]
        wanted: list[tuple[dict[str, Value], str, Entry]] = []
        placed: list[tuple[Entry, tuple[Any, memoryview]]] = []  # read into the caller's
        for k, (out, rank) in enumerate(zip(outs, ranks, strict=True)):
            given = into[k] if into is not None else None
            chosen = names[k] if names is not None else None
            for name in ix.names_of(rank) if chosen is None else chosen:
                e = ix.own.get((name, rank))
                if e is None:
                    if chosen is not None:
                        raise not_saved_by(rank, name, m.step, self.root)
                    continue
                if given is not None and name in given:
                    dest = destination(e, given[name])
                    value = dest[0]
                    out[name] = (
                        Shard(value, e.global_shape, e.offset) if e.kind == "shard" else value
                    )
                    placed.append((e, dest))
                else:
                    wanted.append((out, name, e))
        sem = asyncio.Semaphore(READS_IN_FLIGHT)
        gate = asyncio.Semaphore(BYTES_ARENAS_IN_FLIGHT)
        # A projection's synthetic values: laid out as the others, read with no buffer.
        described = [w for w in wanted if w[2].kind == "synthetic"]
        reads = self._described(ix, described, sem, gate)
        wanted = [w for w in wanted if w[2].kind != "synthetic"]
        entries = [e for _, _, e in wanted]
        laid_out, scattered = arenas(entries)
        for arena in laid_out:
            members = [entries[k] for k, _ in arena.members]
            if all(e.kind == "bytes" for e in members):
                places = [
                    (wanted[k][0], wanted[k][1], at, entries[k].nbytes) for k, at in arena.members
                ]
                for out, name, _, _ in places:
                    out[name] = b""  # its place in the state's order, filled once read
                reads.append(self._bytes_arena(ix, arena, members, places, gate))
                continue
            buf = uninitialised(arena.length)
            for k, at in arena.members:
                out, name, e = wanted[k]
                out[name] = as_value(e, buf[at : at + e.nbytes])
            reads.append(self.parts.read_arena(ix, arena, members, buf))
        for k in scattered:  # parts in several files: run by run, as load does
            out, name, e = wanted[k]
            value, runs = empty_value(e)
            out[name] = Shard(value, e.global_shape, e.offset) if e.kind == "shard" else value
            reads += [self.parts.read_parts(ix, e, run, dest, sem) for run, dest in runs]
        for e, (_, view) in placed:
            runs = runs_of(e, view)
            reads += [self.parts.read_parts(ix, e, run, dest, sem) for run, dest in runs]
        await asyncio.gather(*reads)
        for out, name, _ in wanted:
            value = out[name]
            if isinstance(value, (bytearray, memoryview)):
                out[name] = as_bytes(value)
        await work.settle()  # the copies' CPU, in a projection (coding/work.py)
        return outs

    async def _bytes_arena(
        self,
        ix: Indexed,
        arena: Arena,
        members: list[Entry],
        places: list[tuple[dict[str, Value], str, int, int]],
        gate: asyncio.Semaphore,
    ) -> None:
        """An arena of bytes values only: read into a reused buffer, each value copied out as
        soon as it is checked, the buffer free for the next arena. (Bytes are copies of what
        was read in any case; a buffer of its own per arena made a load hold twice its size,
        all of it fresh memory, which this kind of VM touches at 0.3-1.5 GB/s.)"""
        async with gate:
            buf = (
                recycled(ARENA_BYTES)[: arena.length]
                if arena.length <= ARENA_BYTES
                else uninitialised(arena.length)  # one value alone (ckpt_parts.arenas)
            )
            await self.parts.read_arena(ix, arena, members, buf)
            for out, name, at, n in places:
                out[name] = as_bytes(buf[at : at + n])
            del buf  # free for the next arena while this one's CPU is charged
            await work.settle()  # the copies' CPU, in a projection (coding/work.py)

    def _described(
        self,
        ix: Indexed,
        wanted: list[tuple[dict[str, Value], str, Entry]],
        sem: asyncio.Semaphore,
        gate: asyncio.Semaphore,
    ) -> list[Coroutine[Any, Any, None]]:
        """The reads of ``_load_ranks``'s synthetic values (a projection's): arenas read
        with no buffer, each value a slice of what was read; the scattered value by value.
        A synthetic value stands for a bytes value, so its arenas take ``gate`` as
        ``_bytes_arena``'s do: without it a projected 16-rank load read all 32 arenas at
        once (80 chunk reads in flight where the real load had 20) and copied the values
        out only at the end, 10-20% after the real load (2026-12-06)."""
        entries = [e for _, _, e in wanted]
        laid_out, scattered = arenas(entries)

        async def arena_of(arena: Arena) -> None:
            members = [entries[k] for k, _ in arena.members]
            async with gate:
                data = await self.parts.read_arena(ix, arena, members, None)
                for k, at in arena.members:
                    out, name, e = wanted[k]
                    out[name] = as_bytes(sliced(data, at, at + e.nbytes))
                await work.settle()  # the copies' CPU, as _bytes_arena's

        async def one(k: int) -> None:
            out, name, e = wanted[k]
            out[name] = await self.parts.described(ix, e, sem)

        return [arena_of(a) for a in laid_out] + [one(k) for k in scattered]

    async def verify(
        self, step: int | None = None, *, progress: Callable[[int], None] | None = None
    ) -> Manifest:
        """``Checkpointer.verify``: every part read whole and checked."""
        ix = await self.catalog.indexed(step)
        m = ix.manifest
        sem = asyncio.Semaphore(READS_IN_FLIGHT)

        async def one(e: Entry) -> None:
            await self.parts.value(ix, e, sem)
            if progress is not None:
                progress(e.nbytes)

        await asyncio.gather(*(one(e) for e in m.entries))
        return m


def _alike(entries: Sequence[Entry]) -> bool:
    """Every rank saved the same value (same type, shape and checksums)."""

    def key(e: Entry) -> tuple[Any, ...]:
        return (e.kind, e.dtype, e.shape, tuple((p.length, p.crc32c) for p in e.parts))

    return len({key(e) for e in entries}) == 1


__all__ = ["Loader"]
