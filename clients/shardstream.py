"""The deterministic, resumable, prefetching stream of a dataset's samples for each rank:
``ShardStream`` gives one rank its share of an epoch in batches, shards shuffled globally, rows
shuffled again in a window within each rank's share (``_Plan`` has the scheme; ``rank_order``
computes the order without reading). The streams of a client share a bound on reads in
flight, caches of indexes, footers and small shards, and one thread (``_Share``).

A dataset's index and the checks of what is read are below this module, in
``clients/dataset_index.py``; writing datasets is above it, in ``clients/dataset.py``, which
also re-exports this module's public names (``docs/dataset.md`` has the layout and the
guarantees).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Self, TypeAlias, TypeVar

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from clients.dataset_index import (
    INDEX_NAME,
    VERSION,
    DatasetCorruptError,
    DatasetIndex,
    DescribedFooter,
    Int64s,
    ShardInfo,
    StreamClosedError,
    check_bytes,
    decode_groups,
    in_thread,
    load_index,
    parse_footer,
)
from tectonic_emu import clock
from tectonic_emu.argcheck import int_arg, optional_int_arg
from tectonic_emu.buffers import BytesLike
from tectonic_emu.chunkstore.remote import aligned_buffer
from tectonic_emu.client import Client
from tectonic_emu.coding import work
from tectonic_emu.coding.synthetic import Synthetic, joined, sliced
from tectonic_emu.errors import InvalidArgumentError, NotFoundError
from tectonic_emu.paths import join_path, split_path
from tectonic_emu.qos.groups import TrafficGroup, grouped

WINDOW_BYTES = 16 << 20  # default shuffle window (buffer) of a stream, in the dataset's rows
READ_CHUNKS = 2  # a stream reads this many chunks of the store at a time (a smaller shard whole)
READAHEAD = 1  # reads a stream has ready ahead of its shuffle window (and one under way)
READS_IN_FLIGHT = 16  # store reads in flight per client, shared by all its streams
_THREAD_FROM = 1 << 20  # decode and shuffle more bytes than this off the event loop
_CACHED = 4096  # parsed indexes and shard footers kept per client
SHARD_CACHE_BYTES = 256 << 20  # small shards (at most READ_CHUNKS chunks) kept per client

T = TypeVar("T")
Footer: TypeAlias = "pq.FileMetaData | DescribedFooter"


# -- shared by the streams of a client ---------------------------------------------------------
class _Memo:
    """The last ``limit`` results of loads by key, shared by every stream of a client: one load
    per key even when thousands of streams ask at once; a failed load is tried again by the
    next asker. A load runs in a task of its own, which one asker's cancellation spares."""

    def __init__(self, limit: int) -> None:
        self._tasks: OrderedDict[object, asyncio.Task[Any]] = OrderedDict()
        self._limit = limit

    async def get(self, key: object, load: Callable[[], Awaitable[Any]]) -> Any:
        task = self._tasks.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._tasks[key] = asyncio.ensure_future(load())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # mark as seen
            while len(self._tasks) > self._limit:
                self._tasks.popitem(last=False)
        self._tasks.move_to_end(key)
        return await asyncio.shield(task)


class _Share:
    """What all streams of one client share: a bound on reads in flight; indexes and footers
    (with the other clients of its metadata store) and small shards (the ranks sharing a
    shard read it at about the same time); and the client's one thread for decoding and
    shuffling (``dataset_index.in_thread``, which the dataset's writers use too)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.reads = asyncio.Semaphore(READS_IN_FLIGHT)
        # Parsed indexes and footers are shared by every client of one metadata store (a
        # projection's hosts: one parsed index, not one per host).
        store = getattr(client, "meta", client)  # other sources: their own
        self.memo = _parsed.setdefault(store, _Memo(_CACHED))
        self.shards = _Memo(max(1, SHARD_CACHE_BYTES // (READ_CHUNKS * client.config.block_size)))

    async def cpu(self, fn: Callable[..., T], *args: Any) -> T:
        return await in_thread(self.client, fn, *args)

    async def index(self, path: str) -> DatasetIndex:
        try:
            st = await self.client.stat(f"{path}/{INDEX_NAME}")
        except NotFoundError:
            return await load_index(self.client, path)  # raises the right error
        return await self.memo.get((path, st.id), lambda: load_index(self.client, path))  # type: ignore[no-any-return]

    async def footer(self, index: DatasetIndex, shard: ShardInfo) -> Footer:
        async def load() -> Footer:
            async with self.reads:
                data = await self.client.read(f"{index.path}/{shard.name}", shard.footer_offset)
            size = shard.bytes - shard.footer_offset
            check_bytes(index, f"{shard.name} footer", data, size, shard.footer_crc32c)
            return parse_footer(index, shard, data)

        return await self.memo.get((index.path, shard.name, shard.crc32c), load)

    async def shard(
        self, index: DatasetIndex, shard: ShardInfo, job: tuple[int, ...], stats: StreamStats
    ) -> tuple[bytes | Synthetic, Footer]:
        """A whole shard, checked, and its parsed footer. Kept for the ranks of one ``job``
        (seed, epoch, world size) only: one read for the ranks that share it, and no cache
        hiding the store from the next epoch."""

        async def load() -> tuple[bytes | Synthetic, Footer]:
            async with self.reads:
                data = await self.client.read(f"{index.path}/{shard.name}")
            stats.bytes_read += len(data)
            check_bytes(index, shard.name, data, shard.bytes, shard.crc32c)
            return data, parse_footer(index, shard, sliced(data, shard.footer_offset, len(data)))

        key = (index.path, shard.name, shard.crc32c, job)
        return await self.shards.get(key, load)  # type: ignore[no-any-return]


_shares: weakref.WeakKeyDictionary[Client, _Share] = weakref.WeakKeyDictionary()
_parsed: weakref.WeakKeyDictionary[object, _Memo] = weakref.WeakKeyDictionary()


def _share(client: Client) -> _Share:
    if client not in _shares:
        _shares[client] = _Share(client)
    return _shares[client]


# -- sampling ----------------------------------------------------------------------------------
class _Plan:
    """Which samples one rank gets in an epoch, and in what order.

    1. The shards are permuted by ``default_rng([seed, epoch])`` and their rows concatenated in
       that order: a sequence of all N samples of the epoch.
    2. Rank r of W takes positions [r*N//W, (r+1)*N//W) of it: disjoint, covering, sizes
       differing by at most one (nothing dropped, nothing padded).
    3. The rank's share is cut into windows of ``window`` positions, each permuted by
       ``default_rng([seed, epoch, W, r, window number])``: the shuffle buffer.

    The order is a pure function of (the dataset's shard sizes, seed, epoch, W, r, window), and
    a rank reads each shard it needs front to back (at most two shared with its neighbours).
    """

    def __init__(
        self, index: DatasetIndex, rank: int, world_size: int, seed: int, epoch: int, window: int
    ) -> None:
        self.key, self.window, self.starts = (seed, epoch, world_size, rank), window, index.starts
        order, at = index.sequence(seed, epoch)
        lo, hi = rank * index.rows // world_size, (rank + 1) * index.rows // world_size
        self.samples = hi - lo
        self.slices: list[tuple[int, int, int]] = []  # (shard, first row in it, rows)
        k = max(0, int(np.searchsorted(at, lo, side="right")) - 1)
        while k < len(order) and at[k] < hi:
            a, b = max(lo, int(at[k])), min(hi, int(at[k + 1]))
            if b > a:
                self.slices.append((int(order[k]), a - int(at[k]), b - a))
            k += 1
        self.slice_at = np.cumsum([0] + [n for *_, n in self.slices])  # rank-local positions

    @property
    def windows(self) -> int:
        return -(-self.samples // self.window)

    def window_range(self, w: int) -> tuple[int, int]:
        return w * self.window, min(self.samples, (w + 1) * self.window)

    def window_order(self, w: int) -> Int64s:
        a, b = self.window_range(w)
        return np.random.default_rng([*self.key, w]).permutation(b - a)

    def slices_from(self, pos: int) -> Iterator[tuple[int, int, int]]:
        """The slices holding this rank's positions from ``pos`` on, the first one trimmed."""
        k = int(np.searchsorted(self.slice_at, pos, side="right")) - 1
        for shard, first, n in self.slices[k:]:
            skip = max(0, pos - int(self.slice_at[k]))
            yield shard, first + skip, n - skip
            k += 1

    def order(self) -> Int64s:
        """Global sample numbers (row positions in shard order) in the order yielded."""
        seq = [np.arange(n, dtype=np.int64) + self.starts[s] + f for s, f, n in self.slices]
        flat = np.concatenate([np.zeros(0, np.int64), *seq])
        parts = [
            flat[slice(*self.window_range(w))][self.window_order(w)] for w in range(self.windows)
        ]
        return np.concatenate([np.zeros(0, np.int64), *parts])


def default_shuffle_rows(index: DatasetIndex) -> int:
    """The rows of WINDOW_BYTES of the dataset (on average), at least one."""
    return max(1, WINDOW_BYTES * index.rows // max(index.nbytes, 1))


def rank_order(
    index: DatasetIndex,
    *,
    rank: int,
    world_size: int,
    seed: int,
    epoch: int,
    shuffle_rows: int | None = None,
) -> Int64s:
    """The global sample numbers (row positions in shard order) that a ``ShardStream`` of these
    arguments yields, in order, computed without reading any data."""
    _check_args(rank, world_size, 1, seed, epoch, 0, shuffle_rows)
    window = shuffle_rows or default_shuffle_rows(index)
    return _Plan(index, rank, world_size, seed, epoch, window).order()


def _check_args(
    rank: int, world_size: int, batch: int, seed: int, epoch: int, prefetch: int, window: int | None
) -> None:
    named = {"rank": rank, "world_size": world_size, "batch_size": batch, "seed": seed}
    for name, value in {**named, "epoch": epoch, "prefetch": prefetch}.items():
        int_arg("ShardStream", name, value)
    optional_int_arg("ShardStream", "shuffle_rows", window)
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank {rank} of world size {world_size}")
    if batch < 1 or (window is not None and window < 1):
        raise InvalidArgumentError(f"batch_size {batch} and shuffle_rows {window} must be >= 1")
    if min(seed, epoch, prefetch) < 0:
        raise InvalidArgumentError(f"seed {seed}, epoch {epoch}, prefetch {prefetch} must be >= 0")


# -- prefetching and batching ------------------------------------------------------------------
async def _ahead(source: AsyncGenerator[T, None], depth: int) -> AsyncGenerator[T, None]:
    """``source``'s items, produced up to ``depth`` ahead by a task of their own; closing this
    cancels and awaits that task."""
    queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue(depth)

    async def fill() -> None:
        try:
            async for item in source:
                await queue.put((True, item))
            await queue.put((False, None))
        except Exception as exc:
            await queue.put((False, exc))

    task = asyncio.create_task(fill())
    try:
        while True:
            more, item = await queue.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.aclose()


class _Batcher:
    """Cuts a sequence of tables into record batches of ``size`` rows."""

    def __init__(self, size: int) -> None:
        self.size, self.held, self.rows = size, list[pa.Table](), 0

    def add(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        at = 0
        if self.rows:
            at = min(self.size - self.rows, table.num_rows)
            self.held.append(table.slice(0, at))
            self.rows += at
            if self.rows == self.size:
                yield self.rest()
        while table.num_rows - at >= self.size:
            yield _as_batch(table.slice(at, self.size))
            at += self.size
        if at < table.num_rows:
            self.held, self.rows = [table.slice(at)], table.num_rows - at

    def rest(self) -> pa.RecordBatch | None:
        if not self.rows:
            return None
        batch = _as_batch(pa.concat_tables(self.held))
        self.held, self.rows = [], 0
        return batch


def _as_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.to_batches()
    return batches[0] if len(batches) == 1 else table.combine_chunks().to_batches()[0]


def _shuffle(tables: list[pa.Table], order: Int64s) -> pa.Table:
    return pa.concat_tables(tables).take(pa.array(order)).combine_chunks()


# -- the stream --------------------------------------------------------------------------------
@dataclass(slots=True)
class StreamStats:
    """What a stream did: batches and samples handed out, bytes fetched from the store, and
    time its consumer spent waiting in ``__anext__`` (I/O the prefetch did not hide)."""

    batches: int = 0
    samples: int = 0
    bytes_read: int = 0
    wait_s: float = 0.0


class ShardStream:
    """One rank's batches (``pyarrow.RecordBatch``, the dataset's columns) of one epoch.

    Each epoch every sample goes to exactly one of the ``world_size`` ranks, in an order that
    depends only on ``seed`` and ``epoch`` (given the dataset, ``world_size``, ``rank`` and
    ``shuffle_rows``, by default the rows of WINDOW_BYTES; ``_Plan`` has the scheme). Shares
    differ by at most one sample: ranks' batch counts may differ by one, and the last batch
    may be short.

    A task keeps ``prefetch`` batches ready and another reads READAHEAD pieces ahead of the
    shuffle buffer while the consumer works; ``prefetch=0`` reads on demand, nothing ahead.
    Reads are of whole chunks of the store, each read once, at most READS_IN_FLIGHT per
    client (all its streams together), in the TrafficGroup ``group`` (None: the caller's;
    a data loader's is a gold one, docs/qos.md). ``state_dict()`` and
    ``ShardStream(..., state=...)`` resume exactly after the last batch handed out. Use
    ``async with`` or ``aclose()``.

    Raises DatasetCorruptError, DatasetIncompleteError, InvalidArgumentError (arguments, or a
    state of another stream or dataset) and the store's errors. After an error, a cancelled
    ``__anext__`` or ``aclose``: StreamClosedError (a new stream resumes from ``state_dict()``).
    """

    def __init__(
        self,
        client: Client,
        path: str,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        seed: int,
        epoch: int,
        prefetch: int = 2,
        shuffle_rows: int | None = None,
        state: Mapping[str, Any] | None = None,
        group: TrafficGroup | None = None,
    ) -> None:
        _check_args(rank, world_size, batch_size, seed, epoch, prefetch, shuffle_rows)
        self.client, self.path = client, join_path(split_path(path))
        self.group = group
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.seed, self.epoch, self.prefetch = seed, epoch, prefetch
        self.stats = StreamStats()
        self.index: DatasetIndex | None = None
        self._window, self._rows, self._position = shuffle_rows, None, 0
        if state is not None:
            self._resume(state)
        self._plan: _Plan | None = None
        self._share = _share(client)
        self._batches: AsyncGenerator[pa.RecordBatch, None] | None = None
        self._ended: BaseException | None = None  # StopAsyncIteration or StreamClosedError

    def _resume(self, state: Mapping[str, Any]) -> None:
        keys = ("version", "seed", "epoch", "rank", "world_size")
        mine = (VERSION, self.seed, self.epoch, self.rank, self.world_size)
        theirs = tuple(state.get(k) for k in keys)
        if theirs != mine:
            raise InvalidArgumentError(f"a state of {keys} = {theirs}, not {mine}", self.path)
        window = state.get("shuffle_rows")
        if None not in (window, self._window) and window != self._window:
            raise InvalidArgumentError(f"a state of shuffle_rows {window}", self.path)
        self._window = self._window or window
        self._rows, self._position = state.get("rows"), int(state["position"])
        if self._position < 0:
            raise InvalidArgumentError(f"a state at position {self._position}", self.path)

    def state_dict(self) -> dict[str, Any]:
        """Where this stream is (JSON-able): as ``state`` of a new stream of the same seed,
        epoch, rank and world size, it yields exactly the samples this one has not handed out
        yet, in the same order."""
        return {
            "version": VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "shuffle_rows": self._window,  # None until open, if left to the default
            "rows": self.index.rows if self.index is not None else self._rows,
            "position": self._position,
        }

    @grouped
    async def open(self) -> Self:
        """Read the index and plan the epoch (the first batch does it otherwise)."""
        if self._plan is not None or self._ended is not None:
            return self
        index = await self._share.index(self.path)
        window = self._window or default_shuffle_rows(index)
        plan = _Plan(index, self.rank, self.world_size, self.seed, self.epoch, window)
        if self._rows not in (None, index.rows) or self._position > plan.samples:
            raise InvalidArgumentError("a state of another dataset", self.path)
        self.index, self._plan, self._window = index, plan, window
        batches = self._generate(plan)
        self._batches = _ahead(batches, self.prefetch) if self.prefetch else batches
        return self

    async def aclose(self) -> None:
        """Stop: cancel and await the reads in the background. Idempotent."""
        if self._ended is None:
            self._ended = StreamClosedError("stream is closed", self.path)
        if self._batches is not None:
            await self._batches.aclose()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def samples(self) -> int:
        """This rank's samples in the epoch (after ``open``)."""
        if self._plan is None:
            raise InvalidArgumentError("open the stream first", self.path)
        return self._plan.samples

    def __len__(self) -> int:
        """Batches this rank gets in the whole epoch (after ``open``)."""
        return -(-self.samples // self.batch_size)

    def __aiter__(self) -> Self:
        return self

    @grouped
    async def __anext__(self) -> pa.RecordBatch:
        start = clock.monotonic()
        try:
            await self.open()
            if self._ended is not None:
                raise self._ended
            assert self._batches is not None
            batch = await anext(self._batches)
        except StopAsyncIteration as end:
            self._ended = end
            raise
        except BaseException as exc:
            if self._ended is None:  # the batch generator is gone, whatever the error
                self._ended = StreamClosedError(f"stream failed: {exc!r}", self.path)
            raise
        finally:
            self.stats.wait_s += clock.monotonic() - start
        self._position += batch.num_rows
        self.stats.batches += 1
        self.stats.samples += batch.num_rows
        return batch

    # -- the work --------------------------------------------------------------------------
    async def _generate(self, plan: _Plan) -> AsyncGenerator[pa.RecordBatch, None]:
        """This rank's batches from ``self._position`` on: the rows, window by window,
        shuffled, cut into batches."""
        w = self._position // plan.window
        skip = self._position - w * plan.window
        pieces = self._pieces(plan, w * plan.window)
        if self.prefetch:
            pieces = _ahead(pieces, READAHEAD)
        batcher, window, held = _Batcher(self.batch_size), list[pa.Table](), 0
        async with contextlib.aclosing(pieces):
            async for tables in pieces:
                for table in tables:
                    while table.num_rows:
                        a, b = plan.window_range(w)
                        take = min(table.num_rows, b - a - held)
                        window.append(table.slice(0, take))
                        held, table = held + take, table.slice(take)
                        if held < b - a:
                            continue
                        order = plan.window_order(w)[skip:]
                        if sum(t.nbytes for t in window) >= _THREAD_FROM:
                            shuffled = await self._share.cpu(_shuffle, window, order)
                        else:
                            shuffled = _shuffle(window, order)
                        for batch in batcher.add(shuffled):
                            yield batch
                        w, skip, window, held = w + 1, 0, [], 0
        if (last := batcher.rest()) is not None:
            yield last

    async def _pieces(self, plan: _Plan, pos: int) -> AsyncGenerator[list[pa.Table], None]:
        """This rank's rows from position ``pos`` on, unshuffled: the tables of each read."""
        for shard, first, rows in plan.slices_from(pos):
            async with contextlib.aclosing(self._read_rows(shard, first, first + rows)) as reads:
                async for tables in reads:
                    yield tables

    async def _read_rows(
        self, shard_no: int, lo: int, hi: int
    ) -> AsyncGenerator[list[pa.Table], None]:
        """Rows [lo, hi) of a shard, front to back: a small shard in one read (footer
        included), a large one in reads of whole chunks of the store, each chunk read once."""
        index = self.index
        assert index is not None
        shard = index.shards[shard_no]
        path, chunk = f"{self.path}/{shard.name}", self.client.config.block_size
        bounds = np.cumsum([0] + [g.rows for g in shard.row_groups])
        first = int(np.searchsorted(bounds, lo, side="right")) - 1
        end_group = int(np.searchsorted(bounds, hi, side="left"))
        small = shard.bytes <= READ_CHUNKS * chunk
        if small:
            job = (self.seed, self.epoch, self.world_size)
            whole, meta = await self._share.shard(index, shard, job, self.stats)
            held = _view(whole)
            held_at = 0
        else:
            meta = await self._share.footer(index, shard)
            held, held_at = memoryview(b""), shard.row_groups[first].offset
        groups = shard.row_groups
        end = groups[end_group - 1].offset + groups[end_group - 1].length
        while first < end_group:
            if not small:  # the next chunks, after what is held of the row group begun
                at = held_at + len(held)
                need = groups[first].offset + groups[first].length
                upto = min(end, _align(max(need, at - at % chunk + READ_CHUNKS * chunk), chunk))
                held = await self._read_more(path, held, at, upto)
                if len(held) != upto - held_at:
                    raise DatasetCorruptError(f"{shard.name}: shorter than the index says", path)
            done, held_end = first, held_at + len(held)
            while done < end_group and groups[done].offset + groups[done].length <= held_end:
                done += 1
            args = (index, shard, meta, held, held_at, range(first, done), (lo, hi))
            big = sum(g.length for g in groups[first:done]) >= _THREAD_FROM
            if not big:
                yield decode_groups(*args)
            elif not isinstance(held, Synthetic):
                yield await self._share.cpu(decode_groups, *args)
            else:  # described: cheap to decode, no hop to a thread, but counted as the
                with work.on_thread():  # thread's work the bytes it describes would be
                    tables = decode_groups(*args)
                yield tables
            if done < end_group:  # keep the bytes of the row group begun
                held, held_at = held[groups[done].offset - held_at :], groups[done].offset
            first = done

    async def _read_more(
        self, path: str, held: memoryview | Synthetic, at: int, upto: int
    ) -> memoryview | Synthetic:
        """``held`` (the file's bytes up to ``at``) and the bytes [at, upto) after it: read
        into a fresh aligned buffer, or for a described dataset read as the ``Synthetic``
        they are (no buffer: its bytes are never made)."""
        async with self._share.reads:
            if self.index is not None and self.index.described:
                got = await self.client.read(path, at, upto - at)
                self.stats.bytes_read += len(got)
                return _view(joined([held, got]))
            buf = aligned_buffer(len(held) + upto - at)
            buf[: len(held)] = held  # type: ignore[assignment]  # a memoryview: not described
            n = await self.client.read_into(path, at, buf[len(held) :])
        self.stats.bytes_read += n
        return buf[: len(held) + n]


def _view(data: BytesLike | Synthetic) -> memoryview | Synthetic:
    return data if isinstance(data, Synthetic) else memoryview(data)


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


__all__ = [
    "ShardStream",
    "StreamStats",
    "default_shuffle_rows",
    "rank_order",
]
