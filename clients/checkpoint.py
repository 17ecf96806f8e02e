"""Synchronized multi-rank checkpoints in the store: ``Checkpointer``.

Every rank calls ``await ckpt.save(step, rank, state)``; it returns once the whole step is
committed. Ranks are coroutines of one process or ranks in other processes and hosts: they
meet only through the store (``clients/ckpt_format.py`` has the layout), so all work alike.

How a step commits (``docs/checkpoint.md`` has the failure cases):

1. A rank's state is *staged*: cut into parts of whole rows, copied into reused buffers by
   ``save_async`` (the caller may change its arrays once it returns), referenced by ``save``.
2. One writer per ``Checkpointer`` appends the parts of every rank it has staged into one data
   file of the step, seals it (durable), then writes an index file naming those ranks and
   where their parts lie. Ranks staged meanwhile go into the next data file.
3. The ``Checkpointer`` holding rank 0 polls the step's index files. Once they cover every
   rank, it publishes ``manifest-<step>.json`` in one atomic write: that is the commit. Every
   other ``Checkpointer`` polls for the manifest. A rank that fails or is cancelled before the
   commit leaves ``abort-<rank>``, and the step fails everywhere at once. Ranks that never
   come make it fail after ``timeout`` seconds.
4. Just before its manifest, the committer writes a marker retiring the checkpoints the
   commit leaves beyond ``keep_last`` (``clients/ckpt_retention.py``): they are hidden with
   the commit, everywhere at once. After it, the committer deletes them (never a data file a
   kept checkpoint references) and what failed steps before it left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clients.ckpt_format import (
    CheckpointAbortedError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTimeoutError,
    Entry,
    Kind,
    Manifest,
    Part,
    Shard,
    check_step,
    entry_text,
    manifest_name,
    step_dir,
)
from clients.ckpt_reads import FileReaders, MergedReader
from clients.ckpt_region import Box, RowRead, even_rows, plan, region
from clients.ckpt_retention import (
    Marker,
    RootView,
    commit_marker,
    stale_markers,
    store_closed,
    tidy,
    view_of,
)
from clients.ckpt_select import box_destination, destination, not_saved_by, selected
from tectonic_emu._malloc import MMAP_THRESHOLD
from tectonic_emu.bufpool import PAGE, uninitialised
from tectonic_emu.chunkstore.remote import aligned_buffer
from tectonic_emu.client import Client
from tectonic_emu.coding.checksum import crc32c, crc32c_each, crc32c_many
from tectonic_emu.errors import NotFoundError, TectonicError

log = logging.getLogger(__name__)

WRITERS = 2  # data files a batch of ranks is written to at once
PART_BYTES = 4 << 20  # values are cut into parts of whole rows of at most this many bytes
_POLL_FIRST, _POLL_MAX = 0.005, 0.1  # seconds between looks at the store, growing
_READS_IN_FLIGHT = 16
_APPEND_GROUP = 16 << 20  # bytes of small parts handed to the writer at once
_RUN_BYTES = 64 << 20  # adjacent parts read at once, at most
_MANIFESTS_KEPT = 4  # decoded manifests a Checkpointer keeps (the newest steps asked for)
# load_many's shared buffers: just under malloc's mmap threshold (tectonic_emu/_malloc.py;
# uninitialised adds a page for alignment), so a freed one comes back warm from the heap.
# At 64 MiB each was a fresh mapping, faulted in at 0.5-1 GB/s on this kind of VM: loads of
# 256 MiB by 4,096 ranks swung 0.17-0.41 s, 0.16-0.21 s with these.
ARENA_BYTES = MMAP_THRESHOLD - 2 * PAGE

Value = Any  # numpy array, bytes-like, or Shard
# A load waiting to be served with others: rank, the caller's future, its ``into``, its
# ``names``.
_LoadAsk = tuple[
    int, "asyncio.Future[dict[str, Value]]", "Mapping[str, Value] | None", "Collection[str] | None"
]


@dataclass(slots=True)
class SaveResult:
    """What one rank's save did. ``blocked_s``: how long the rank's call held it up;
    ``persist_s``: from the call to the commit."""

    step: int
    rank: int
    bytes_total: int  # this rank's state
    bytes_written: int  # of which written by this save (less when incremental)
    blocked_s: float
    persist_s: float


@dataclass(slots=True)
class PendingSave:
    """``save_async``'s answer: the state is staged; ``await pending.committed``."""

    committed: asyncio.Future[SaveResult]
    blocked_s: float


@dataclass(slots=True)
class _Item:
    """One named value of a rank, staged: its entry (parts still without places), the bytes
    of each part, and each part's rows."""

    entry: Entry
    pieces: list[memoryview]
    rows: list[tuple[int, int]]


@dataclass(slots=True)
class _Staged:
    rank: int
    items: list[_Item]
    incremental: bool
    started: float
    written: asyncio.Future[int]  # resolves once the rank's parts are durable: bytes written
    buffers: list[memoryview] = field(default_factory=list)  # staging copies to give back
    blocked_s: float | None = None  # save_async: how long staging held the caller

    @property
    def nbytes(self) -> int:
        return sum(len(p) for item in self.items for p in item.pieces)


@dataclass(slots=True)
class _SaveAsk:
    """A ``save`` call waiting to be served with the others of its loop iteration."""

    rank: int
    state: Mapping[str, Value]
    incremental: bool
    started: float
    done: asyncio.Future[SaveResult]


@dataclass(slots=True)
class _Step:
    """What this Checkpointer does for one step."""

    step: int
    queue: list[_Staged] = field(default_factory=list)
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


class Checkpointer:
    """Checkpoints of ``world_size`` ranks under the store directory ``root``.

    One instance serves every rank of its process; other processes (and hosts) make their own
    over the same cluster. Use it as an async context manager, or ``await close()``.
    """

    def __init__(
        self,
        client: Client,
        root: str,
        *,
        world_size: int,
        encoding: str | None = None,
        keep_last: int | None = None,
        timeout: float = 300.0,
        part_bytes: int = PART_BYTES,
        writers: int = WRITERS,
    ) -> None:
        if world_size < 1:
            raise CheckpointError(f"world_size must be at least 1, not {world_size}")
        if writers < 1:
            raise CheckpointError(f"writers must be at least 1, not {writers}")
        if keep_last is not None and keep_last < 1:
            raise CheckpointError(f"keep_last must be at least 1, not {keep_last}")
        self.client = client
        self.root = root.rstrip("/") or "/"
        self.world_size = world_size
        self.encoding = encoding
        self.keep_last = keep_last
        self.timeout = timeout
        self.part_bytes = part_bytes
        self.writers = writers
        self._writer_id = secrets.token_hex(4)
        self._steps: dict[int, _Step] = {}
        self._pool: dict[int, list[memoryview]] = {}  # staging buffers by size
        self._made_root = False
        self._cleanup: asyncio.Future[None] | None = None  # retention after the last commit
        # A commit's retirement marker is chosen from the steps committed before it: one
        # publish at a time, so pipelined steps each see the one before (ckpt_retention).
        self._publishing = asyncio.Lock()
        self._manifests: dict[int, _Indexed] = {}  # decoded, by step
        self._reader = MergedReader(client)  # the reads of ranks loading at once, merged
        self._fetching: dict[int, asyncio.Future[_Indexed]] = {}
        # Loads waiting to be served together, by (step, world_size).
        self._loading: dict[tuple[int | None, int | None], list[_LoadAsk]] = {}
        self._load_tasks: set[asyncio.Task[None]] = set()
        self._saving: dict[int, list[_SaveAsk]] = {}  # save calls waiting, by step
        self._save_tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Checkpointer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_cleanup(self) -> None:
        """Wait until the clean-up after the last commit here (``keep_last``, failed steps'
        leftovers) is done; a save returns as soon as its step commits, before that."""
        if self._cleanup is not None:
            await asyncio.gather(self._cleanup, return_exceptions=True)

    async def close(self) -> None:
        """Finish cleaning up after the last commit; cancel what is still running for
        unfinished steps and wait for it."""
        await self.wait_cleanup()
        tasks = [
            t
            for s in self._steps.values()
            for t in (s.prepared, s.writer, s.commit)
            if t is not None
        ]
        tasks += self._load_tasks
        tasks += self._save_tasks
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._steps.clear()

    def _path(self, *names: str) -> str:
        return "/".join([self.root.rstrip("/"), *names])

    # -- saving ------------------------------------------------------------------------------
    async def save(
        self, step: int, rank: int, state: Mapping[str, Value], *, incremental: bool = False
    ) -> SaveResult:
        """Save ``rank``'s ``state`` for ``step``; return once the whole step is committed.

        ``state`` maps names to numpy arrays, bytes-likes and ``Shard``s; arrays are read in
        place, so leave them alone until this returns. ``incremental``: parts whose content
        equals the latest committed checkpoint's are referenced, not written again.

        Raises CheckpointError (bad arguments, a step already committed or not after the
        latest), CheckpointAbortedError (another rank gave up), CheckpointTimeoutError (ranks
        missing after ``timeout`` seconds), and the store's errors. If it raises or is
        cancelled, the step does not commit anywhere; its files are collected later.

        Ranks of this process that call in the same event-loop iteration are staged and
        waited for together, as by ``save_many``, where 4,096 ranks each opening the step,
        waiting for their parts and for the commit cost 0.06 ms of Python apiece. Each rank
        still gets its own answer (a bad rank number or state is that rank's error).
        """
        loop = asyncio.get_running_loop()
        ask = _SaveAsk(rank, state, incremental, time.perf_counter(), loop.create_future())
        batch = self._saving.get(step)
        if batch is None:
            batch = self._saving[step] = []
            loop.call_soon(self._serve_saves, step)  # after this iteration's other callers
        batch.append(ask)
        try:
            return await ask.done
        except asyncio.CancelledError as exc:
            st = self._steps.get(step)
            if st is None or not _succeeded(st.commit):  # the step must not commit without it
                await asyncio.shield(self._abort(step, rank, exc))
            raise

    def _serve_saves(self, step: int) -> None:
        asks = self._saving.pop(step)
        task = asyncio.ensure_future(self._save_batch(step, asks))
        self._save_tasks.add(task)
        task.add_done_callback(self._save_tasks.discard)

    async def _save_batch(self, step: int, asks: list[_SaveAsk]) -> None:
        """Stage the ranks of ``asks`` for ``step``, wait for their parts and the commit, and
        answer each (a rank that cannot be staged gets its own error and aborts the step, as
        its own ``save`` would)."""
        for a in asks:  # before the step is opened, as a single save checks
            if (err := _rank_error(a.rank, self.world_size)) is not None:
                _settle(a.done, err)
        asks = [a for a in asks if not a.done.done()]  # (a cancelled one marked the abort)
        if not asks:
            return
        try:
            check_step(step)
            st = await self._step_state(step)
            if _succeeded(st.commit):
                raise CheckpointError(f"step {step} is already committed", self.root)
        except BaseException as exc:
            for a in asks:
                _settle(a.done, exc)
            if isinstance(exc, asyncio.CancelledError):
                await asyncio.shield(self._abort(step, asks[0].rank, exc))
                raise
            return
        staged: list[tuple[_SaveAsk, _Staged]] = []
        try:
            for a in asks:
                if a.done.done():
                    continue  # cancelled while the step opened (its save marked the abort)
                if a.rank in st.ranks:
                    _settle(a.done, CheckpointError(f"rank {a.rank} already saved step {step}"))
                    continue
                try:
                    s = self._staged(a.rank, a.state, a.incremental, False, a.started)
                except BaseException as exc:
                    _settle(a.done, exc)
                    await asyncio.shield(self._abort(step, a.rank, exc))
                    continue
                st.ranks.add(a.rank)
                staged.append((a, s))
            if not staged:
                return
            st.queue += [s for _, s in staged]
            self._start(st)
            written = await asyncio.gather(*(s.written for _, s in staged), return_exceptions=True)
            bad = next((n for n in written if isinstance(n, BaseException)), None)
            if bad is not None:  # the step cannot commit: say so now, not at the timeout
                await asyncio.shield(self._abort(step, staged[0][0].rank, bad))
            assert st.commit is not None
            failed: BaseException | None = None
            try:
                await asyncio.shield(st.commit)
            except Exception as exc:
                failed = exc
                if bad is None:
                    await asyncio.shield(self._abort(step, staged[0][0].rank, exc))
            now = time.perf_counter()
            for (a, s), n in zip(staged, written, strict=True):
                if isinstance(n, BaseException):
                    _settle(a.done, n)
                elif failed is not None:
                    _settle(a.done, failed)
                elif not a.done.done():
                    elapsed = now - a.started
                    a.done.set_result(SaveResult(step, a.rank, s.nbytes, n, elapsed, elapsed))
        except BaseException as exc:  # cancelled (close): so are the saves waiting
            for a in asks:
                _settle(a.done, exc)
            raise

    async def save_async(
        self, step: int, rank: int, state: Mapping[str, Value], *, incremental: bool = False
    ) -> PendingSave:
        """Stage ``rank``'s state (a copy) and return; ``await pending.committed`` for the
        commit. The caller may change its arrays as soon as this returns."""
        st, staged = await self._submit(step, rank, state, incremental=incremental, copy=True)
        committed = asyncio.ensure_future(self._finish(st, staged))
        return PendingSave(committed, staged.blocked_s or 0.0)

    async def _submit(
        self,
        step: int,
        rank: int,
        state: Mapping[str, Value],
        *,
        incremental: bool,
        copy: bool,
    ) -> tuple[_Step, _Staged]:
        """Stage ``rank``'s state for ``step`` and start the step's writer and commit."""
        started = time.perf_counter()
        st = await self._open_step(step, [rank])
        staged = await self._stage_rank(st, rank, state, incremental, copy, started)
        self._start(st)
        if copy:
            staged.blocked_s = time.perf_counter() - started
        return st, staged

    async def _open_step(self, step: int, ranks: Iterable[int]) -> _Step:
        """The step's state, once ``ranks`` are known to be valid for it; on cancellation
        the step is marked aborted (by the first of ``ranks``)."""
        check_step(step)
        ranks = list(ranks)
        for rank in ranks:
            if (err := _rank_error(rank, self.world_size)) is not None:
                raise err
        if len(set(ranks)) != len(ranks):
            raise CheckpointError(f"a rank is given twice: {sorted(ranks)}")
        try:
            st = await self._step_state(step)
        except asyncio.CancelledError as exc:
            if ranks:
                await asyncio.shield(self._abort(step, ranks[0], exc))
            raise
        if _succeeded(st.commit):
            raise CheckpointError(f"step {step} is already committed", self.root)
        for rank in ranks:
            if rank in st.ranks:
                raise CheckpointError(f"rank {rank} already saved step {step}")
        return st

    def _staged(
        self, rank: int, state: Mapping[str, Value], incremental: bool, copy: bool, started: float
    ) -> _Staged:
        """``rank``'s state staged (its staging copies given back if it fails)."""
        staged = _Staged(rank, [], incremental, started, asyncio.get_running_loop().create_future())
        try:
            for name, value in state.items():
                staged.items.append(self._stage(rank, name, value, copy, staged.buffers))
        except BaseException:
            self._give_back(staged.buffers)
            raise
        return staged

    async def _stage_rank(
        self,
        st: _Step,
        rank: int,
        state: Mapping[str, Value],
        incremental: bool,
        copy: bool,
        started: float,
    ) -> _Staged:
        """``rank``'s state staged and queued for the step's writer. If staging fails, the
        step is marked aborted: this rank will not save it, so neither will the others."""
        try:
            staged = self._staged(rank, state, incremental, copy, started)
        except BaseException as exc:
            await asyncio.shield(self._abort(st.step, rank, exc))
            raise
        st.ranks.add(rank)
        st.queue.append(staged)
        return staged

    def _start(self, st: _Step) -> None:
        """The step's writer (unless it is writing) and commit wait, started."""
        if st.writer is None or st.writer.done():
            st.writer = asyncio.ensure_future(self._write_batches(st))
        if st.commit is None:
            st.commit = asyncio.ensure_future(self._await_commit(st))

    async def save_many(
        self,
        step: int,
        states: Mapping[int, Mapping[str, Value]],
        *,
        incremental: bool = False,
    ) -> list[SaveResult]:
        """``save`` for many ranks of this process in one call (``states`` by rank): the
        same checkpoint, but one coroutine stages them all and waits once, where each
        ``save`` costs its own coroutines and futures (``bench scale``: about 0.1 ms of
        Python per rank at 4,096 ranks). Returns once the step is committed, a result per
        rank in the order of ``states``; raises what ``save`` raises."""
        started = time.perf_counter()
        st = await self._open_step(step, states)
        staged_all = []
        for rank, state in states.items():  # all staged before any is queued
            try:
                staged_all.append(self._staged(rank, state, incremental, False, started))
            except BaseException as exc:
                await asyncio.shield(self._abort(st.step, rank, exc))
                raise
        st.ranks.update(s.rank for s in staged_all)
        st.queue += staged_all
        self._start(st)
        try:
            written = await asyncio.gather(*(s.written for s in staged_all))
            assert st.commit is not None
            await asyncio.shield(st.commit)
        except BaseException as exc:
            if not _succeeded(st.commit) and staged_all:
                await asyncio.shield(self._abort(st.step, staged_all[0].rank, exc))
            raise
        elapsed = time.perf_counter() - started
        return [
            SaveResult(step, s.rank, s.nbytes, n, elapsed, elapsed)
            for s, n in zip(staged_all, written, strict=True)
        ]

    async def _step_state(self, step: int) -> _Step:
        st = self._steps.get(step)
        if st is None:
            for old in [s for s in self._steps.values() if _succeeded(s.commit) and not s.queue]:
                del self._steps[old.step]  # committed: a late save of it is refused by the store
            st = self._steps[step] = _Step(step)
            st.prepared = asyncio.ensure_future(self._prepare(st))
        assert st.prepared is not None
        try:
            await asyncio.shield(st.prepared)
        except BaseException:
            if self._steps.get(step) is st and st.prepared.done():
                del self._steps[step]  # let a later call try again
            raise
        return st

    async def _prepare(self, st: _Step) -> None:
        """Once per step and Checkpointer: check the step may be saved, note the previous
        checkpoint (for incremental saves), make the step's directory."""
        if not self._made_root:
            await self.client.mkdir(self.root, parents=True, encoding=self.encoding)
            self._made_root = True
        view = await self._view()
        committed = view.visible
        if st.step in committed:
            raise CheckpointError(f"step {st.step} is already committed", self.root)
        if committed and st.step < committed[-1]:
            raise CheckpointError(
                f"step {st.step} comes before the latest committed step {committed[-1]}",
                self.root,
            )
        if committed:
            st.previous = committed[-1]
        elif st.step < view.retired_before:
            await self._forget_retirement(view)
        await self.client.mkdir(self._path(step_dir(st.step)), exist_ok=True)

    async def _forget_retirement(self, view: RootView) -> None:
        """Every checkpoint was deleted or retired, and a new series starts below the steps
        retired: delete the retired ones, then the markers, which would hide the new one.
        Once no manifest lies below them they hide nothing, so a crash in between is safe."""
        await self._drop(view.retired, view)
        for m in (await self._view()).markers:
            with contextlib.suppress(NotFoundError):
                await self.client.delete(self._path(m.name))

    def _stage(
        self, rank: int, name: str, value: Value, copy: bool, buffers: list[memoryview]
    ) -> _Item:
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"state names are non-empty strings, not {name!r}")
        kind: Kind
        if isinstance(value, Shard):
            arr, kind = value.array, "shard"
            at: tuple[tuple[int, ...], tuple[int, ...]] = (value.global_shape, value.offset)
        elif isinstance(value, np.ndarray):
            arr, kind, at = value, "array", ((), ())
        elif isinstance(value, (bytes, bytearray, memoryview)):
            raw = memoryview(value).cast("B")
            if copy:
                raw = self._copy(raw, buffers)
            return _Item(Entry(rank, name, "bytes"), [raw], [(0, 0)])
        else:
            raise CheckpointError(
                f"{name!r}: a state value is a numpy array, bytes or a Shard, "
                f"not {type(value).__name__}"
            )
        if arr.dtype.hasobject:
            raise CheckpointError(f"{name!r}: arrays of Python objects cannot be stored")
        shape = tuple(arr.shape)  # ascontiguousarray makes a 0-d array 1-d
        arr = np.ascontiguousarray(arr)
        flat = arr.reshape(-1).view(np.uint8).data if arr.size else memoryview(b"")
        if copy:
            flat = self._copy(flat, buffers)
        rows = arr.shape[0] if arr.ndim else 1
        row_bytes = arr.nbytes // rows if rows else 0
        step_rows = max(1, self.part_bytes // row_bytes) if row_bytes else max(rows, 1)
        pieces, bounds = [], []
        for r0 in range(0, max(rows, 1), step_rows):
            r1 = min(rows, r0 + step_rows)
            pieces.append(flat[r0 * row_bytes : r1 * row_bytes])
            bounds.append((r0, r1))
        entry = Entry(rank, name, kind, arr.dtype.str, shape, *at)
        return _Item(entry, pieces, bounds)

    def _copy(self, src: memoryview, buffers: list[memoryview]) -> memoryview:
        """A copy of ``src`` in a reused, page-aligned staging buffer (fresh memory is slow
        to touch on this kind of machine, ../shared/MACHINE.md)."""
        free = self._pool.get(len(src))
        buf = free.pop() if free else aligned_buffer(len(src))
        buf[:] = src
        buffers.append(buf)
        return buf

    def _give_back(self, buffers: list[memoryview]) -> None:
        for buf in buffers:
            free = self._pool.setdefault(len(buf), [])
            if len(free) < 4096:
                free.append(buf)
        buffers.clear()

    async def _write_batches(self, st: _Step) -> None:
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
                    self._give_back(s.buffers)

    async def _write_batch(self, st: _Step, batch: list[_Staged]) -> None:
        """The batch's ranks split by bytes over up to ``writers`` data files written at once
        (one writer streams 0.65 GB/s here, two 0.9), then one index file naming them all."""
        st.batches += 1
        previous: dict[tuple[int, str], dict[tuple[int, int, int], Part]] = {}
        if st.previous is not None and any(s.incremental for s in batch):
            with contextlib.suppress(CheckpointNotFoundError):  # deleted since: write it all
                previous = _parts_by_key(await self.manifest(st.previous))
        groups: list[list[_Staged]] = [[] for _ in range(min(self.writers, len(batch)))]
        sizes = [0] * len(groups)
        for s in sorted(batch, key=lambda s: -s.nbytes):  # largest first, to the emptiest
            k = sizes.index(min(sizes))
            groups[k].append(s)
            sizes[k] += s.nbytes
        written = {s.rank: 0 for s in batch}
        names = [f"{step_dir(st.step)}/data-{self._writer_id}-{st.batches}"]
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
        name = f"index-{self._writer_id}-{st.batches}.json"
        await self.client.write_file(self._path(step_dir(st.step), name), body.encode())
        st.indexes[name] = {"ranks": ranks}
        st.entries[name] = list(zip(entries, texts, strict=True))
        st.indexed.set()
        for s in batch:
            if not s.written.done():
                s.written.set_result(written[s.rank])

    async def _write_data(
        self,
        data: str,
        group: list[_Staged],
        previous: dict[tuple[int, str], dict[tuple[int, int, int], Part]],
        written: dict[int, int],
    ) -> list[Entry]:
        """The parts of ``group``'s ranks into the data file ``data``; their entries."""
        entries: list[Entry] = []
        pos = appended = 0
        crcs = await _checksums([p for s in group for item in s.items for p in item.pieces])
        k = 0  # the next piece's place in crcs
        async with self.client.open_writer(self._path(data), encoding=self.encoding) as w:
            pending: list[memoryview] = []  # appended together: one fencing check per group
            for s in group:
                for item in s.items:
                    parts = []
                    e = item.entry
                    old = previous.get((s.rank, e.name), {})
                    item_crcs = crcs[k : k + len(item.pieces)]
                    k += len(item.pieces)
                    for piece, (r0, r1), crc in zip(item.pieces, item.rows, item_crcs, strict=True):
                        n = len(piece)
                        digest = await _digest(piece) if s.incremental else None
                        same = old.get((r0, r1, n))
                        if digest is not None and same is not None and same.digest == digest:
                            parts.append(same)  # unchanged since the previous checkpoint
                            continue
                        pending.append(piece)
                        parts.append(Part(data, pos, n, crc, r0, r1, digest))
                        pos += n
                        written[s.rank] += n
                        if pos - appended >= _APPEND_GROUP:
                            await w.append_many(pending)
                            pending, appended = [], pos
                    entries.append(e._replace(parts=tuple(parts)))
            await w.append_many(pending)
        return entries

    async def _finish(self, st: _Step, staged: _Staged) -> SaveResult:
        """One rank's wait: its parts durable, then the step committed."""
        try:
            bytes_written = await staged.written
            assert st.commit is not None
            await asyncio.shield(st.commit)
        except BaseException as exc:
            if not _succeeded(st.commit):
                await asyncio.shield(self._abort(st.step, staged.rank, exc))
            raise
        total = staged.nbytes
        elapsed = time.perf_counter() - staged.started
        blocked = elapsed if staged.blocked_s is None else staged.blocked_s
        return SaveResult(st.step, staged.rank, total, bytes_written, blocked, elapsed)

    async def _abort(self, step: int, rank: int, exc: BaseException) -> None:
        """Leave ``abort-<rank>`` so the other ranks stop waiting (best effort)."""
        if isinstance(exc, CheckpointAbortedError):
            return  # the step failed elsewhere: already marked
        reason = "cancelled" if isinstance(exc, asyncio.CancelledError) else repr(exc)
        with contextlib.suppress(OSError):
            await self.client.mkdir(self._path(step_dir(step)), parents=True, exist_ok=True)
            path = self._path(step_dir(step), f"abort-{rank}")
            await self.client.write_file(path, reason.encode()[:4096])

    async def _await_commit(self, st: _Step) -> None:
        """Poll the store until the step commits (publishing it, when this instance holds
        rank 0), a rank aborts, or ``timeout`` passes."""
        indexes: dict[str, dict[str, Any]] = {}
        delay = _POLL_FIRST
        deadline = time.monotonic() + self.timeout
        sdir = self._path(step_dir(st.step))
        while True:
            st.indexed.clear()  # before looking: an index written from now on wakes the wait
            try:
                names = await self.client.listdir(sdir)
            except NotFoundError:
                names = []
            aborts = sorted(n for n in names if n.startswith("abort-"))
            if 0 in st.ranks:
                for n in names:
                    if n.startswith("index-") and n not in indexes:
                        own = st.indexes.get(n)  # written here: no need to read it back
                        indexes[n] = (
                            own
                            if own is not None
                            else _parse_json(await self.client.read_file(f"{sdir}/{n}"), n)
                        )
                covered = {r for ix in indexes.values() for r in ix["ranks"]}
                if not aborts and len(covered) == self.world_size:
                    await self._publish(st, indexes)
                    return
                missing = sorted(set(range(self.world_size)) - covered)
            else:
                if await self.client.exists(self._path(manifest_name(st.step))):
                    return
                missing = []
            if aborts:
                reasons = [await self._reason(f"{sdir}/{n}") for n in aborts[:3]]
                raise CheckpointAbortedError(
                    f"step {st.step} cannot commit: {', '.join(aborts)} ({'; '.join(reasons)})",
                    self.root,
                )
            if time.monotonic() > deadline:
                who = f"ranks {_ranges(missing)} did not finish" if missing else "no commit"
                raise CheckpointTimeoutError(
                    f"step {st.step}: {who} within {self.timeout:g} s", self.root
                )
            with contextlib.suppress(TimeoutError):  # or at once, when an index is written here
                await asyncio.wait_for(st.indexed.wait(), delay)
            delay = min(_POLL_MAX, delay * 1.5)

    async def _reason(self, path: str) -> str:
        try:
            return (await self.client.read_file(path)).decode(errors="replace")[:200]
        except OSError:
            return "?"

    async def _publish(self, st: _Step, indexes: Mapping[str, Mapping[str, Any]]) -> None:
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
        manifest = Manifest(st.step, self.world_size, entries, time.time())
        path = self._path(manifest_name(st.step))
        async with self._publishing:
            await self._mark_retirement(st.step)
            writer = await self.client.new_version(path)  # Client.write_file, keeping the id
            try:
                await writer.append(manifest.encode([text for _, text in pairs]))
                await writer.close()
            except BaseException:
                await asyncio.shield(writer.abort())
                raise
        self._keep_manifest(st.step, _Indexed(writer.file_id, manifest, FileReaders(self.client)))
        # Committed. Clean up behind the ranks rather than hold them: the ranks return now.
        previous = self._cleanup
        self._cleanup = asyncio.ensure_future(self._retain(st.step, after=previous))

    async def _mark_retirement(self, step: int) -> None:
        """Before ``step``'s manifest: the marker by which its commit retires the steps
        beyond ``keep_last``, at once for every process (``ckpt_retention``); markers that
        an earlier, failed attempt at this step left are deleted first."""
        view = await self._view()
        marker = commit_marker(view, step, self.keep_last)
        for m in stale_markers(view, step, marker):
            with contextlib.suppress(NotFoundError):
                await self.client.delete(self._path(m.name))
        if marker is not None and marker not in view.markers:
            await self.client.write_file(self._path(marker.name), b"")

    async def _retain(self, newest: int, *, after: asyncio.Future[None] | None = None) -> None:
        """Delete retired checkpoints and failed steps' leftovers (after the clean-up before
        it, if any). Errors are logged: the checkpoint is committed either way, and what is
        left stays hidden until the next clean-up. A store closed under it (the cluster
        closed first) is no error: the next commit or ``collect_garbage`` finishes it."""
        if after is not None:
            with contextlib.suppress(Exception):
                await after
        try:
            await self.collect_garbage(before=newest)
        except OSError as exc:
            if store_closed(exc):
                log.debug("checkpoint clean-up after step %d left to the next: %s", newest, exc)
            else:
                log.warning("checkpoint clean-up after step %d failed: %s", newest, exc)

    # -- reading -----------------------------------------------------------------------------
    async def steps(self) -> list[int]:
        """Committed steps, oldest first, but for those retired (``keep_last``): a step is
        retired by the commit that leaves it beyond ``keep_last``, for every process at
        once, though its files are deleted behind the commit."""
        return (await self._view()).visible

    async def _view(self) -> RootView:
        """The root's manifests, retirement markers and step directories, in one listing."""
        try:
            entries = await self.client.scandir(self.root)
        except NotFoundError:
            return RootView()
        return view_of((e.name, e.id) for e in entries)

    async def latest(self) -> int | None:
        done = await self.steps()
        return done[-1] if done else None

    async def manifest(self, step: int | None = None) -> Manifest:
        """The manifest of ``step`` (default: the latest). Raises CheckpointNotFoundError."""
        return (await self._indexed(step)).manifest

    async def _indexed(self, step: int | None) -> _Indexed:
        """The manifest of ``step`` (default: the latest) with its entries indexed; raises
        CheckpointNotFoundError for a step not committed or retired. Callers that ask while
        it is being fetched share one fetch, and a manifest already decoded is reused while
        its file is the same (one listing of the root): 4,096 ranks loading at once read and
        decode it once."""
        key = -1 if step is None else step
        flight = self._fetching.get(key)
        if flight is None:
            flight = asyncio.ensure_future(self._fetch_manifest(step))
            self._fetching[key] = flight
            flight.add_done_callback(lambda _: self._fetching.pop(key, None))
        return await asyncio.shield(flight)

    async def _fetch_manifest(self, step: int | None) -> _Indexed:
        view = await self._view()
        if step is None:
            if not view.visible:
                raise CheckpointNotFoundError("no committed checkpoint", self.root)
            step = view.visible[-1]
        file_id = view.manifests.get(step)
        if step < view.retired_before:  # its files may be deleted already, or not yet
            how = "is retired" if file_id is not None else "is not committed, or was retired"
            raise CheckpointNotFoundError(
                f"step {step} {how} (beyond keep_last: steps before {view.retired_before} are)",
                self.root,
            )
        cached = self._manifests.get(step)
        if file_id is not None and cached is not None and cached.file_id == file_id:
            return cached
        path = self._path(manifest_name(step))
        try:
            if file_id is None:
                raise NotFoundError("no manifest", path)
            st = await self.client.stat(path)
            raw = bytearray(st.size)
            await self.client.read_id_into(st.id, 0, raw)  # the version stat named
        except NotFoundError:
            raise CheckpointNotFoundError(f"step {step} is not committed", self.root) from None
        indexed = _Indexed(st.id, Manifest.decode(bytes(raw), path), FileReaders(self.client))
        self._keep_manifest(step, indexed)
        return indexed

    def _keep_manifest(self, step: int, indexed: _Indexed) -> None:
        self._manifests[step] = indexed
        while len(self._manifests) > _MANIFESTS_KEPT:
            del self._manifests[min(self._manifests)]

    async def load(
        self,
        rank: int,
        step: int | None = None,
        world_size: int | None = None,
        *,
        into: Mapping[str, Value] | None = None,
        names: Collection[str] | None = None,
    ) -> dict[str, Value]:
        """``rank``'s state at ``step`` (default: the latest) for ``world_size`` ranks
        (default: as saved). At another world size, ``Shard``s are cut anew, evenly along
        axis 0; a value every rank saved alike comes back as saved; a value that differs
        between ranks raises CheckpointError. Every part read whole is checked against its
        CRC32C: CheckpointCorruptError names the rank, the value and the step.

        ``names``: load only these values (as DCP's ``load`` loads the state dict it is
        given), e.g. the sharded ones when resharding, leaving out per-rank values (RNG and
        data-loader state) that cannot be. A name the step does not hold, or (at the world
        size saved) that this rank did not save, raises CheckpointNotFoundError naming it.

        ``into``: values to read into in place, by name, instead of allocating new ones (a
        trainer restoring into the arrays it has, as DCP's ``load`` does): a writable,
        C-contiguous numpy array of the dtype and shape to be loaded (or a Shard of one; at
        another world size, this rank's new box of a Shard), or a writable buffer of the
        saved length for bytes; the values returned for those names are these arrays (bytes:
        the buffer). A mismatch is a CheckpointError before anything is read; on a failed
        check the array holds the bytes read.

        Ranks of this process that ask in the same event-loop iteration are served together,
        as by ``load_many`` (one manifest look-up, one plan, merged reads and checks), where
        4,096 ranks each doing their own cost 0.1 ms of Python apiece; so the arrays of ranks
        loaded together may be views of one shared buffer. A rank's error is its own: when
        a joint load fails, each of its ranks is loaded alone."""
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
            ix = await self._indexed(step)
            m = ix.manifest
            ws = m.world_size if world_size is None else world_size
            for r, _, _, names in batch:
                try:
                    if (err := _rank_error(r, ws)) is not None:
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
                except Exception:
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
        ix: _Indexed,
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
        for name in selected(names, ix.by_name, m.step, self.root):
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
        sem = asyncio.Semaphore(_READS_IN_FLIGHT)
        for name, e, cut, dest in jobs:
            if cut is not None:
                arr = await self._assemble(ix, ix.by_name[name], cut, sem, dest)
                out[name] = Shard(arr, e.global_shape, tuple(lo for lo, _ in cut))
            elif e.kind == "shard":
                out[name] = Shard(await self._value(ix, e, sem, dest), e.global_shape, e.offset)
            else:
                out[name] = await self._value(ix, e, sem, dest)
        return out

    async def read(
        self, step: int, name: str, index: Any = None, *, rank: int | None = None
    ) -> Value:
        """A region of the global array ``name`` at ``step``: ``index`` is a numpy basic
        index (ints, slices, ...), and only the rows it needs are read. For a value saved per
        rank, ``rank`` picks whose (needed when they differ)."""
        ix = await self._indexed(step)
        entries = ix.by_name.get(name)
        if not entries:
            raise CheckpointNotFoundError(f"step {step} has no {name!r}", self.root)
        sem = asyncio.Semaphore(_READS_IN_FLIGHT)
        if entries[0].kind != "shard":
            if rank is not None:
                entries = [e for e in entries if e.rank == rank]
                if not entries:
                    raise CheckpointNotFoundError(f"rank {rank} saved no {name!r}", self.root)
            elif not _alike(entries):
                raise CheckpointError(f"{name!r} differs between ranks: pass rank=", self.root)
            if entries[0].kind == "bytes":
                value = await self._value(ix, entries[0], sem)
                return value if index is None else value[index]
            entries = entries[:1]
        shape = entries[0].global_shape if entries[0].kind == "shard" else entries[0].shape
        if not shape:  # a 0-d array
            value = await self._value(ix, entries[0], sem)
            return value if index is None else value[index]
        box, inner = region(index, shape)
        arr = await self._assemble(ix, entries, box, sem)
        return arr[inner]

    async def _value(
        self,
        ix: _Indexed,
        e: Entry,
        sem: asyncio.Semaphore,
        dest: tuple[Any, memoryview] | None = None,
    ) -> Value:
        """One rank's whole value, every part checked; read into ``dest`` (see
        ``destination``) when given."""
        value, runs = _empty_value(e) if dest is None else (dest[0], _runs(e, dest[1]))
        await asyncio.gather(*(self._read_parts(ix, e, run, dest, sem) for run, dest in runs))
        return bytes(value) if dest is None and isinstance(value, bytearray) else value

    async def load_many(
        self,
        ranks: Sequence[int],
        step: int | None = None,
        *,
        into: Sequence[Mapping[str, Value] | None] | None = None,
        names: Collection[str] | None = None,
    ) -> list[dict[str, Value]]:
        """``[load(r, step, names=names) for r in ranks]`` at the world size saved, for a
        process hosting many ranks: the same values, but one call plans every read and
        checks every part, where each ``load`` costs its own coroutines and futures (``bench
        scale``: about 0.1 ms of Python per rank at 4,096 ranks).

        Values whose parts lie back to back in a file (the usual case) are laid out in
        file order in shared buffers of up to ARENA_BYTES and read straight into place:
        one read per buffer, no copy. So the arrays returned may be views of one buffer,
        which stays allocated while any of them lives. ``into``: for each rank, values to
        read into in place, as ``load``'s; ``names``: the values to load, for every rank.
        Raises what ``load`` raises; nothing is returned unless every part read checks."""
        ix = await self._indexed(step)
        m = ix.manifest
        for rank in ranks:
            if (err := _rank_error(rank, m.world_size)) is not None:
                raise err
        if into is not None and len(into) != len(ranks):
            raise CheckpointError(f"into= has {len(into)} states for {len(ranks)} ranks")
        if names is not None:
            names = selected(names, ix.by_name, m.step, self.root)
        return await self._load_ranks(ix, ranks, into, [names] * len(ranks))

    async def _load_ranks(
        self,
        ix: _Indexed,
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
            for name in ix.by_name if chosen is None else chosen:
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
        entries = [e for _, _, e in wanted]
        arenas, scattered = _arenas(entries)
        reads = []
        for arena in arenas:
            buf = uninitialised(arena.length)
            for k, at in arena.members:
                out, name, e = wanted[k]
                out[name] = _as_value(e, buf[at : at + e.nbytes])
            reads.append(self._read_arena(ix, arena, [entries[k] for k, _ in arena.members], buf))
        sem = asyncio.Semaphore(_READS_IN_FLIGHT)
        for k in scattered:  # parts in several files: run by run, as load does
            out, name, e = wanted[k]
            value, runs = _empty_value(e)
            out[name] = Shard(value, e.global_shape, e.offset) if e.kind == "shard" else value
            reads += [self._read_parts(ix, e, run, dest, sem) for run, dest in runs]
        for e, (_, view) in placed:
            reads += [self._read_parts(ix, e, run, dest, sem) for run, dest in _runs(e, view)]
        await asyncio.gather(*reads)
        for out, name, _ in wanted:
            value = out[name]
            if isinstance(value, (bytearray, memoryview)):
                out[name] = bytes(value)
        return outs

    async def _read_arena(
        self, ix: _Indexed, arena: _Arena, entries: list[Entry], buf: memoryview
    ) -> None:
        """The values ``entries`` lying back to back from ``arena.start``, read into ``buf``
        at once, then every part checked (pinned once: thousands of small parts cost one
        pass, in a worker thread when the arena is big)."""
        m = ix.manifest
        try:
            n = await self._reader.read(self._path(arena.file), arena.start, buf, ix.files)
        except TectonicError as exc:
            raise CheckpointCorruptError(
                f"step {m.step}: cannot read {arena.file} at {arena.start}: {exc}", self.root
            ) from exc
        parts = [(e, p) for e in entries for p in e.parts]
        spans, at = [], 0
        for _, p in parts:
            spans.append((at, p.length))
            at += p.length
        if len(buf) >= 1 << 20:
            crcs = await asyncio.to_thread(crc32c_many, buf, spans)
        else:
            crcs = crc32c_many(buf, spans)
        for (e, p), (at, length), crc in zip(parts, spans, crcs, strict=True):
            if at + length > n or crc != p.crc32c:
                raise self._corrupt(m, e, p)

    async def _read_part(
        self, ix: _Indexed, e: Entry, p: Part, dest: memoryview, sem: asyncio.Semaphore
    ) -> None:
        await self._read_parts(ix, e, [p], dest, sem)

    async def _read_parts(
        self, ix: _Indexed, e: Entry, parts: list[Part], dest: memoryview, sem: asyncio.Semaphore
    ) -> None:
        """Parts that lie back to back in one file, read at once into ``dest`` (a part cut
        short of its block would make the store read that block whole for each part), then
        each checked against its CRC32C."""
        first, m = parts[0], ix.manifest
        async with sem:
            try:
                n = await self._reader.read(self._path(first.file), first.pos, dest, ix.files)
            except TectonicError as exc:
                raise CheckpointCorruptError(
                    f"step {m.step}, rank {e.rank}, {e.name!r}: cannot read {first.file}: {exc}",
                    self.root,
                ) from exc
        await self._check_parts(m, e, parts, dest, n)

    async def _check_parts(
        self, m: Manifest, e: Entry, parts: list[Part], dest: memoryview, n: int
    ) -> None:
        """Each of ``parts``, read back to back into ``dest`` (``n`` bytes of it), against
        its CRC32C; CheckpointCorruptError names the first that does not match."""
        if len(dest) >= 1 << 20:
            bad = await asyncio.to_thread(_first_bad, parts, dest, n)
        else:
            bad = _first_bad(parts, dest, n)
        if bad is not None:
            raise self._corrupt(m, e, bad)

    def _corrupt(self, m: Manifest, e: Entry, bad: Part) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"step {m.step}, rank {e.rank}, {e.name!r}: rows {bad.row0}-{bad.row1} in "
            f"{bad.file} do not match their checksum",
            self.root,
        )

    async def _assemble(
        self,
        ix: _Indexed,
        entries: Sequence[Entry],
        box: Box,
        sem: asyncio.Semaphore,
        out: np.ndarray[Any, Any] | None = None,
    ) -> np.ndarray[Any, Any]:
        """The array ``box`` of a global array from the values (boxes) ``entries``, in
        ``out`` when given (of the box's shape and the values' dtype)."""
        dtype = np.dtype(entries[0].dtype)
        if out is None:
            out = np.empty(tuple(hi - lo for lo, hi in box), dtype=dtype)
        if out.size == 0:
            return out

        async def one(r: RowRead) -> None:
            # Rows that fill their place in ``out`` whole (full width, as resharding along
            # axis 0 cuts) are read straight into it; others through a buffer of their own.
            target = out[r.dest]
            direct = target.shape == r.rows_shape and target.flags.c_contiguous
            rows = target if direct else np.empty(r.rows_shape, dtype=dtype)
            dest = rows.reshape(-1).view(np.uint8).data
            if r.whole_part:
                await self._read_part(ix, r.entry, r.part, dest, sem)
            else:  # part of a part: the store's chunk checksums cover these bytes
                async with sem:
                    await self._reader.read(self._path(r.file), r.pos, dest, ix.files)
            if not direct:
                target[...] = rows[r.source]

        await asyncio.gather(*(one(r) for r in plan(_distinct(entries), box)))
        return out

    async def verify(
        self, step: int | None = None, *, progress: Callable[[int], None] | None = None
    ) -> Manifest:
        """Read every part of a checkpoint and check it; raises CheckpointCorruptError.
        ``progress(nbytes)`` is called as values are checked."""
        ix = await self._indexed(step)
        m = ix.manifest
        sem = asyncio.Semaphore(_READS_IN_FLIGHT)

        async def one(e: Entry) -> None:
            await self._value(ix, e, sem)
            if progress is not None:
                progress(e.nbytes)

        await asyncio.gather(*(one(e) for e in m.entries))
        return m

    # -- deleting ----------------------------------------------------------------------------
    async def delete(self, step: int) -> None:
        """Delete a committed checkpoint (its manifest first, then the data files no other
        checkpoint references). Raises CheckpointNotFoundError, for a retired step too (it
        is deleted already, or will be by the next clean-up)."""
        await self.manifest(step)
        await self._drop([step], await self._view())

    async def collect_garbage(self, before: int | None = None) -> int:
        """Delete retired checkpoints (``keep_last``), and what steps that never committed
        left behind for steps before ``before`` (default: the latest committed), keeping
        data files a checkpoint references. Returns how many steps it cleaned."""
        view = await self._view()
        if before is None:
            before = view.visible[-1] if view.visible else view.retired_before
        stale = [s for s in view.step_dirs if s < before and s not in view.manifests]
        retired = view.retired
        await self._drop(retired, view, before)
        if stale:
            kept = await self._files_of(await self.steps())
            for s in stale:
                await self._remove_step_dir(s, kept)
        return len(stale) + len(retired)

    async def _drop(self, steps: Sequence[int], view: RootView, before: int | None = None) -> None:
        """Delete the manifests of ``steps``, then their data files that no checkpoint left
        references. Retirement markers go first (``ckpt_retention.tidy``): the one
        in force is made unconditional if it waits on one of ``steps``, those it supersedes
        and those of steps before ``before`` that never committed are deleted."""
        plan = tidy(view, steps, before)
        if plan.confirm is not None:
            done = self._path(Marker(plan.confirm.before).name)
            with contextlib.suppress(NotFoundError):
                await self.client.rename(self._path(plan.confirm.name), done)
        for m in plan.remove:
            with contextlib.suppress(NotFoundError):
                await self.client.delete(self._path(m.name))
        if not steps:
            return
        for s in steps:
            with contextlib.suppress(NotFoundError):
                await self.client.delete(self._path(manifest_name(s)))
        files = await self._files_of(await self.steps())
        for s in steps:
            await self._remove_step_dir(s, files)

    async def _files_of(self, steps: Iterable[int]) -> set[str]:
        """The data files the checkpoints of ``steps`` reference (one already deleted: none)."""
        files: set[str] = set()
        for s in steps:
            with contextlib.suppress(CheckpointNotFoundError):
                files |= (await self.manifest(s)).files()
        return files

    async def _remove_step_dir(self, step: int, kept: set[str]) -> None:
        sdir = step_dir(step)
        try:
            names = await self.client.listdir(self._path(sdir))
        except NotFoundError:
            return
        for n in names:
            if f"{sdir}/{n}" not in kept:
                with contextlib.suppress(NotFoundError):
                    await self.client.delete(self._path(sdir, n))
        if not any(f"{sdir}/{n}" in kept for n in names):
            with contextlib.suppress(NotFoundError, OSError):
                await self.client.delete(self._path(sdir))


# -- helpers ---------------------------------------------------------------------------------
def _settle(fut: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail ``fut`` with ``exc`` (cancel it for a cancellation), unless it is done."""
    if fut.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        fut.cancel()
    else:
        fut.set_exception(exc)


def _succeeded(task: asyncio.Future[Any] | None) -> bool:
    return task is not None and task.done() and not task.cancelled() and not task.exception()


@dataclass(slots=True)
class _Arena:
    """Values lying back to back in ``file`` from ``start``: one buffer, one read."""

    file: str
    start: int
    length: int = 0
    members: list[tuple[int, int]] = field(default_factory=list)  # (value index, offset)


def _in_one_piece(e: Entry) -> bool:
    """Whether ``e``'s parts lie back to back in one file (and it has bytes at all)."""
    if not e.parts or e.nbytes == 0:
        return False
    return all(
        q.file == p.file and q.pos == p.pos + p.length for p, q in itertools.pairwise(e.parts)
    )


def _arenas(entries: Sequence[Entry]) -> tuple[list[_Arena], list[int]]:
    """The values in one piece, in file order, grouped into arenas of adjacent values of at
    most ARENA_BYTES (a value longer than that has one of its own); and the indexes of the
    others (read run by run into buffers of their own)."""
    whole: list[int] = []
    scattered: list[int] = []
    for i, e in enumerate(entries):
        (whole if _in_one_piece(e) else scattered).append(i)
    order = sorted(whole, key=lambda i: (entries[i].parts[0].file, entries[i].parts[0].pos))
    arenas: list[_Arena] = []
    for i in order:
        first, n = entries[i].parts[0], entries[i].nbytes
        last = arenas[-1] if arenas else None
        if (
            last is None
            or last.file != first.file
            or last.start + last.length != first.pos
            or last.length + n > ARENA_BYTES
        ):
            last = _Arena(first.file, first.pos)
            arenas.append(last)
        last.members.append((i, last.length))
        last.length += n
    return arenas, scattered


def _as_value(e: Entry, view: memoryview) -> Value:
    """``e``'s value over the bytes ``view`` (filled later): an array view, a Shard of one,
    or the view itself for bytes (made ``bytes`` once read)."""
    if e.kind == "bytes":
        return view
    arr = np.frombuffer(view, dtype=np.dtype(e.dtype)).reshape(e.shape)
    return Shard(arr, e.global_shape, e.offset) if e.kind == "shard" else arr


def _empty_value(e: Entry) -> tuple[Any, list[tuple[list[Part], memoryview]]]:
    """A value to read ``e`` into (a numpy array, or a bytearray for bytes), and its runs
    (``_runs``)."""
    if e.kind == "bytes":
        value: Any = bytearray(e.nbytes)
        view = memoryview(value)
    else:
        value = np.empty(e.shape, dtype=np.dtype(e.dtype))
        view = memoryview(value.reshape(-1).view(np.uint8)).cast("B")
    return value, _runs(e, view)


def _runs(e: Entry, view: memoryview) -> list[tuple[list[Part], memoryview]]:
    """``e``'s parts in runs that lie back to back in one file (one read each, at most
    _RUN_BYTES), each with the slice of ``view`` (the value's bytes) it fills."""
    runs: list[list[Part]] = []
    for p in e.parts:
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and last.file == p.file
            and last.pos + last.length == p.pos
            and sum(q.length for q in runs[-1]) + p.length <= _RUN_BYTES
        ):
            runs[-1].append(p)
        else:
            runs.append([p])
    out = []
    at = 0
    for run in runs:
        n = sum(p.length for p in run)
        out.append((run, view[at : at + n]))
        at += n
    return out


def _first_bad(parts: list[Part], dest: memoryview, n: int) -> Part | None:
    """The first of ``parts`` (back to back in ``dest``, ``n`` bytes of it read) that is
    short or does not match its CRC32C."""
    at = 0
    for p in parts:
        if n < at + p.length or crc32c(dest[at : at + p.length]) != p.crc32c:
            return p
        at += p.length
    return None


def _rank_error(rank: object, world_size: int) -> CheckpointError | None:
    """The error for ``rank`` unless it is a rank number (an int, numpy's too) in
    [0, world_size)."""
    if (
        not isinstance(rank, bool)
        and isinstance(rank, (int, np.integer))
        and 0 <= rank < world_size
    ):
        return None
    return CheckpointError(f"rank {rank} is not in [0, {world_size})")


async def _checksums(pieces: list[memoryview]) -> list[int]:
    """The CRC32C of each piece: the small ones in one call, each big one in a worker thread
    (it releases the GIL), all at once."""
    small = [k for k, p in enumerate(pieces) if len(p) < 1 << 20]
    big = [k for k, p in enumerate(pieces) if len(p) >= 1 << 20]
    out = [0] * len(pieces)
    for k, crc in zip(small, crc32c_each([pieces[k] for k in small]), strict=True):
        out[k] = crc
    for k, crc in zip(
        big, await asyncio.gather(*(asyncio.to_thread(crc32c, pieces[k]) for k in big)), strict=True
    ):
        out[k] = crc
    return out


async def _digest(piece: memoryview) -> str:
    def run() -> str:
        return hashlib.blake2b(piece, digest_size=16).hexdigest()

    return await asyncio.to_thread(run) if len(piece) >= 1 << 20 else run()


def _parts_by_key(m: Manifest | None) -> dict[tuple[int, str], dict[tuple[int, int, int], Part]]:
    """The previous checkpoint's parts by (rank, name), then by (rows, length)."""
    out: dict[tuple[int, str], dict[tuple[int, int, int], Part]] = {}
    if m is None:
        return out
    for e in m.entries:
        out[(e.rank, e.name)] = {(p.row0, p.row1, p.length): p for p in e.parts}
    return out


class _Indexed:
    """A committed manifest, the file id it was read from, its entries by name and by
    (name, rank), and readers of the data files it names (immutable once it is committed)."""

    def __init__(self, file_id: int, manifest: Manifest, files: FileReaders) -> None:
        self.file_id = file_id
        self.manifest = manifest
        self.files = files
        self.by_name: dict[str, list[Entry]] = {}
        self.own: dict[tuple[str, int], Entry] = {}
        for e in manifest.entries:
            self.by_name.setdefault(e.name, []).append(e)
            self.own.setdefault((e.name, e.rank), e)


def _alike(entries: Sequence[Entry]) -> bool:
    """Every rank saved the same value (same type, shape and checksums)."""

    def key(e: Entry) -> tuple[Any, ...]:
        return (e.kind, e.dtype, e.shape, tuple((p.length, p.crc32c) for p in e.parts))

    return len({key(e) for e in entries}) == 1


def _distinct(entries: Sequence[Entry]) -> list[Entry]:
    """One entry per box: ranks that saved the same shard (data-parallel replicas) are read
    once."""
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    out = []
    for e in entries:
        box = (e.offset, e.shape)
        if box not in seen:
            seen.add(box)
            out.append(e)
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


__all__ = ["Checkpointer", "PendingSave", "SaveResult", "Shard"]
