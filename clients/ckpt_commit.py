"""Writing a step and committing it: ``StepWriter``, one per ``Checkpointer``.

Ranks staged for a step (``clients/ckpt_stage.py``) are written in batches: a batch's ranks
split by bytes over up to ``writers`` data files written at once, sealed (durable), then one
index file naming those ranks and where their parts lie. The ``Checkpointer`` holding rank 0
polls the step's index files and, once they cover every rank, publishes the manifest in one
atomic write (the commit), just after the step's retirement marker (``ckpt_gc``). The
others poll for the manifest. A rank that gives up leaves ``abort-<rank>`` (``abort``), and
the step fails everywhere at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clients.ckpt_catalog import Catalog, Index, Indexed
from clients.ckpt_format import (
    CheckpointAbortedError,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointTimeoutError,
    Entry,
    Manifest,
    Part,
    entry_text,
    manifest_name,
    step_dir,
)
from clients.ckpt_gc import mark_retirement
from clients.ckpt_reads import FileReaders
from clients.ckpt_stage import Staged, StagingPool
from tectonic_emu import buggify, clock
from tectonic_emu.coding import work
from tectonic_emu.coding.checksum import crc32c, crc32c_each
from tectonic_emu.coding.synthetic import Payload, Synthetic, nbytes
from tectonic_emu.errors import NotFoundError

WRITERS = 2  # data files a batch of ranks is written to at once
_POLL_FIRST, _POLL_MAX = 0.005, 0.1  # seconds between looks at the store, growing
_APPEND_GROUP = 16 << 20  # bytes of small parts handed to the writer at once

# The previous checkpoint's parts by (rank, name), then by (rows, length).
_Previous = dict[tuple[int, str], dict[tuple[int, int, int], Part]]


@dataclass(slots=True)
class Step:
    """What this Checkpointer does for one step."""

    step: int
    queue: list[Staged] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    writer: asyncio.Task[None] | None = None
    commit: asyncio.Task[None] | None = None
    batches: int = 0
    previous: int | None = None  # the latest committed step when this one began
    prepared: asyncio.Task[None] | None = None
    # Index files this instance wrote, by name, and a wake-up for the commit's wait: when
    # every rank is in this process, the step commits as its last index lands, not at the
    # next look at the store.
    indexes: dict[str, dict[str, Any]] = field(default_factory=dict)
    entries: dict[str, list[tuple[Entry, str]]] = field(default_factory=dict)  # and JSON
    indexed: asyncio.Event = field(default_factory=asyncio.Event)


class StepWriter:
    """Writes the batches of every step of one Checkpointer (data files named after
    ``writer_id``) and waits for each step's commit, publishing it when this Checkpointer
    holds rank 0. ``committed(step)`` is called right after a commit published here."""

    def __init__(
        self,
        catalog: Catalog,
        pool: StagingPool,
        *,
        world_size: int,
        encoding: str | None,
        keep_last: int | None,
        timeout: float,
        writers: int,
        writer_id: str,
        committed: Callable[[int], None],
    ) -> None:
        self.catalog = catalog
        self.client = catalog.client
        self.pool = pool
        self.world_size = world_size
        self.encoding = encoding
        self.keep_last = keep_last
        self.timeout = timeout
        self.writers = writers
        self.writer_id = writer_id
        self._committed = committed
        # A commit's retirement marker is chosen from the steps committed before it: one
        # publish at a time, so pipelined steps each see the one before (ckpt_retention).
        self._publishing = asyncio.Lock()

    def start(self, st: Step) -> None:
        """The step's writer (unless it is writing) and commit wait, started."""
        if st.writer is None or st.writer.done():
            st.writer = asyncio.ensure_future(self._write_batches(st))
        if st.commit is None:
            st.commit = asyncio.ensure_future(self._await_commit(st))

    # -- writing -----------------------------------------------------------------------------
    async def _write_batches(self, st: Step) -> None:
        """Write what ranks staged, a data file per batch, until nothing waits."""
        while st.queue:
            batch, st.queue = st.queue, []
            try:
                await self._write_batch(st, batch)
            except BaseException as exc:
                for s in batch:
                    if not s.written.done():
                        s.written.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            finally:
                for s in batch:
                    self.pool.give_back(s.buffers)

    async def _write_batch(self, st: Step, batch: list[Staged]) -> None:
        """The batch's ranks split by bytes over up to ``writers`` data files written at once
        (one writer streams 0.65 GB/s here, two 0.9), then one index file naming them all."""
        st.batches += 1
        previous: _Previous = {}
        if st.previous is not None and any(s.incremental for s in batch):
            with contextlib.suppress(CheckpointNotFoundError):  # deleted since: write it all
                previous = _parts_by_key(await self.catalog.manifest(st.previous))
        groups: list[list[Staged]] = [[] for _ in range(min(self.writers, len(batch)))]
        sizes = [0] * len(groups)
        for s in sorted(batch, key=lambda s: -s.nbytes):  # largest first, to the emptiest
            k = sizes.index(min(sizes))
            groups[k].append(s)
            sizes[k] += s.nbytes
        written = {s.rank: 0 for s in batch}
        names = [f"{step_dir(st.step)}/data-{self.writer_id}-{st.batches}"]
        names += [f"{names[0]}.{k}" for k in range(1, len(groups))]
        done = await asyncio.gather(
            *(
                self._write_data(name, group, previous, written)
                for name, group in zip(names, groups, strict=True)
            )
        )
        entries = [e for part in done for e in part]
        texts = [entry_text(e) for e in entries]  # the manifest is made of the same text
        ranks = sorted(written)
        body = (
            f'{{"ranks":{json.dumps(ranks, separators=(",", ":"))},"entries":[{",".join(texts)}]}}'
        )
        name = f"index-{self.writer_id}-{st.batches}.json"
        await self.client.write_file(self.catalog.path(step_dir(st.step), name), body.encode())
        st.indexes[name] = {"ranks": ranks}
        st.entries[name] = list(zip(entries, texts, strict=True))
        st.indexed.set()
        for s in batch:
            if not s.written.done():
                s.written.set_result(written[s.rank])

    async def _write_data(
        self, data: str, group: list[Staged], previous: _Previous, written: dict[int, int]
    ) -> list[Entry]:
        """The parts of ``group``'s ranks into the data file ``data``; their entries.

        Pieces are checksummed a group of ``_APPEND_GROUP`` bytes at a time, just before the
        group is appended, so that a group's checksums overlap the writing of the groups
        before it. With the whole file checksummed first, a real 1,024-rank save's first
        block started 0.07-0.09 s in (now 0.044 s), and a projected 112 GB save on four
        hosts waited about a second a file (docs/simulate.md)."""
        items: list[tuple[Entry, list[Part]]] = []
        pos = appended = 0
        path = self.catalog.path(data)
        async with self.client.open_writer(path, encoding=self.encoding, commit_at_flush=True) as w:
            # Appended together (one fencing check per group), each with where its Part is.
            pending: list[Payload] = []
            places: list[tuple[list[Part], int]] = []

            async def append(pieces: list[Payload], where: list[tuple[list[Part], int]]) -> None:
                for (parts, k), crc in zip(where, await _checksums(pieces), strict=True):
                    parts[k] = parts[k]._replace(crc32c=crc)
                await w.append_many(pieces)

            for s in group:
                for item in s.items:
                    parts: list[Part] = []
                    e = item.entry
                    old = previous.get((s.rank, e.name), {})
                    for piece, (r0, r1) in zip(item.pieces, item.rows, strict=True):
                        n = len(piece)
                        digest = await _digest(piece) if s.incremental else None
                        same = old.get((r0, r1, n))
                        if digest is not None and same is not None and same.digest == digest:
                            parts.append(same)  # unchanged since the previous checkpoint
                            continue
                        places.append((parts, len(parts)))
                        pending.append(piece)
                        parts.append(Part(data, pos, n, 0, r0, r1, digest))  # crc: append()
                        pos += n
                        written[s.rank] += n
                        if pos - appended >= _APPEND_GROUP:
                            await append(pending, places)
                            pending, places, appended = [], [], pos
                    items.append((e, parts))
            await append(pending, places)
        return [e._replace(parts=tuple(parts)) for e, parts in items]

    # -- committing --------------------------------------------------------------------------
    async def _await_commit(self, st: Step) -> None:
        """Poll the store until the step commits (publishing it, when this instance holds
        rank 0), a rank aborts, or ``timeout`` passes."""
        indexes: dict[str, dict[str, Any]] = {}
        delay = _POLL_FIRST
        deadline = clock.monotonic() + self.timeout
        sdir = self.catalog.path(step_dir(st.step))
        root = self.catalog.root
        while True:
            st.indexed.clear()  # before looking: an index written from now on wakes the wait
            # Only the names each look needs, each a range of keys: a listing of the whole
            # step directory by every host on every look costs hosts x files per round
            # (the 4,096-rank projection of docs/simulate.md spent half its time there).
            try:
                aborts = await self.client.listdir(sdir, prefix="abort-")
                names = await self.client.listdir(sdir, prefix="index-") if 0 in st.ranks else []
            except NotFoundError:
                aborts, names = [], []
            if 0 in st.ranks:
                for n in names:
                    if n not in indexes:
                        own = st.indexes.get(n)  # written here: no need to read it back
                        indexes[n] = (
                            own
                            if own is not None
                            else _parse_json(await self.client.read_file(f"{sdir}/{n}"), n)
                        )
                covered = {r for ix in indexes.values() for r in ix["ranks"]}
                if buggify.planted("manifest-before-data") and st.ranks <= covered:
                    covered |= set(range(self.world_size))  # a bug on purpose (docs/dst.md)
                if not aborts and len(covered) == self.world_size:
                    await self._publish(st, indexes)
                    return
                missing = sorted(set(range(self.world_size)) - covered)
            else:
                if await self.client.exists(self.catalog.path(manifest_name(st.step))):
                    return
                if st.step < (await self.catalog.view()).retired_before:
                    # A later step's commit retired this one (keep_last) and its clean-up
                    # may have deleted the manifest before this look: saves that overlap
                    # (save_async) commit tens of ms apart. Hidden either way: done.
                    return
                missing = []
            if aborts:
                reasons = [await self._reason(f"{sdir}/{n}") for n in aborts[:3]]
                raise CheckpointAbortedError(
                    f"step {st.step} cannot commit: {', '.join(aborts)} ({'; '.join(reasons)})",
                    root,
                )
            if clock.monotonic() > deadline:
                who = f"ranks {_ranges(missing)} did not finish" if missing else "no commit"
                raise CheckpointTimeoutError(
                    f"step {st.step}: {who} within {self.timeout:g} s", root
                )
            with contextlib.suppress(TimeoutError):  # or at once, when an index is written here
                await asyncio.wait_for(st.indexed.wait(), delay)
            delay = min(_POLL_MAX, delay * 1.5)

    async def _reason(self, path: str) -> str:
        try:
            return (await self.client.read_file(path)).decode(errors="replace")[:200]
        except OSError:
            return "?"

    async def _publish(self, st: Step, indexes: Mapping[str, Mapping[str, Any]]) -> None:
        """Write the step's manifest: the commit. Entries this instance wrote are taken as
        they are, the others decoded from their index files; the manifest is kept decoded,
        so loads here right after the commit do not read it back."""
        pairs = sorted(
            (
                pair
                for name, ix in indexes.items()
                for pair in (
                    st.entries[name]
                    if name in st.entries
                    else [(Entry.from_json(d), entry_text(d)) for d in ix["entries"]]
                )
            ),
            key=lambda pair: (pair[0].rank, pair[0].name),
        )
        entries = tuple(e for e, _ in pairs)
        manifest = Manifest(st.step, self.world_size, entries, clock.wall())
        path = self.catalog.path(manifest_name(st.step))
        async with self._publishing:
            await mark_retirement(self.catalog, st.step, self.keep_last)
            writer = await self.client.new_version(path)  # Client.write_file, keeping the id
            try:
                await writer.append(manifest.encode([text for _, text in pairs]))
                await writer.close()
            except BaseException:
                await asyncio.shield(writer.abort())
                raise
        self.catalog.keep(
            st.step, Indexed(writer.file_id, Index(manifest), FileReaders(self.client))
        )
        # Committed. Clean up behind the ranks rather than hold them: the ranks return now.
        self._committed(st.step)


async def abort(catalog: Catalog, step: int, rank: int, exc: BaseException) -> None:
    """Leave ``abort-<rank>`` so the other ranks stop waiting (best effort)."""
    if isinstance(exc, CheckpointAbortedError):
        return  # the step failed elsewhere: already marked
    reason = "cancelled" if isinstance(exc, asyncio.CancelledError) else repr(exc)
    with contextlib.suppress(OSError):
        client = catalog.client
        await client.mkdir(catalog.path(step_dir(step)), parents=True, exist_ok=True)
        path = catalog.path(step_dir(step), f"abort-{rank}")
        await client.write_file(path, reason.encode()[:4096])


async def _checksums(pieces: list[Payload]) -> list[int]:
    """The CRC32C of each piece, all at once: each big one in a worker thread (it releases
    the GIL), the small ones together in one call, on a worker thread too once they add up
    to a big one. A 1,024-rank save's pieces are all small (550 KB); checksummed on the
    event loop they held it 0.05 s for each half of its 1.1 GB, before any block could
    start (2026-12-06)."""
    small = [k for k, p in enumerate(pieces) if len(p) < 1 << 20]
    big = [k for k, p in enumerate(pieces) if len(p) >= 1 << 20]
    out = [0] * len(pieces)
    few = [pieces[k] for k in small]
    if sum(len(p) for p in few) < 1 << 20:
        crcs = crc32c_each(few)
    else:
        crcs = await asyncio.to_thread(crc32c_each, few)
    for k, crc in zip(small, crcs, strict=True):
        out[k] = crc
    for k, crc in zip(
        big, await asyncio.gather(*(asyncio.to_thread(crc32c, pieces[k]) for k in big)), strict=True
    ):
        out[k] = crc
    return out


async def _digest(piece: Payload) -> str:
    def run() -> str:
        work.count("blake2b", nbytes(piece))
        if isinstance(piece, Synthetic):  # its structure names its bytes (coding/synthetic.py)
            return piece.digest().hex()
        return hashlib.blake2b(piece, digest_size=16).hexdigest()

    return await asyncio.to_thread(run) if len(piece) >= 1 << 20 else run()


def _parts_by_key(m: Manifest | None) -> _Previous:
    """The previous checkpoint's parts by (rank, name), then by (rows, length)."""
    out: _Previous = {}
    if m is None:
        return out
    for e in m.entries:
        out[(e.rank, e.name)] = {(p.row0, p.row1, p.length): p for p in e.parts}
    return out


def _parse_json(raw: bytes, where: str) -> dict[str, Any]:
    try:
        d = json.loads(raw)
    except ValueError as exc:
        raise CheckpointCorruptError(f"unreadable index: {exc}", where) from exc
    if not isinstance(d, dict):
        raise CheckpointCorruptError("unreadable index", where)
    return d


def _ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (at most 8 ranges)."""
    out: list[str] = []
    for r in ranks:
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out[:8]) + (" ..." if len(out) > 8 else "")


__all__ = ["WRITERS", "Step", "StepWriter", "abort"]
