"""Sharded Parquet datasets in the store: their index, writing them (``write_shards``, and
``generate`` for synthetic MLPerf-shaped ones), and reading and checking whole shards and row
groups (``docs/dataset.md`` has the layout and the guarantees).

A dataset at ``PATH``::

    PATH/part-00000.parquet   rows_per_shard rows (the last shard may hold fewer), one store
    PATH/part-00001.parquet   file each, in row groups of about ROW_GROUP_BYTES
    PATH/_index.json          written last, atomically: no index, no dataset

The index lists the schema and, per shard, its rows, bytes and CRC32C, and the byte range and
CRC32C of its footer and of each row group, so that a reader can fetch part of a shard and
check what it fetched. The leading underscore makes pyarrow and Spark skip it.

The deterministic, resumable, prefetching stream of a dataset's samples for each rank
(``ShardStream``, ``StreamStats``, ``rank_order``, ``default_shuffle_rows``) is in
``clients/shardstream.py``; this module re-exports those names.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from clients.workloads import Workload, workload_named
from tectonic_emu.chunkstore.base import BytesLike
from tectonic_emu.client import Client
from tectonic_emu.coding.checksum import crc32c
from tectonic_emu.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    TectonicError,
)
from tectonic_emu.paths import join_path, split_path

if TYPE_CHECKING:  # re-exported, on first use, by __getattr__ at the end
    from clients.shardstream import ShardStream, StreamStats, default_shuffle_rows, rank_order

INDEX_NAME = "_index.json"
FORMAT, VERSION = "tectonic-emu/shards", 1
ROW_GROUP_BYTES = 1 << 20  # default row group size: the unit of decoding
WRITES_IN_FLIGHT = 3  # shards being stored at once by write_shards
MIN_SHARD_BYTES = 8 << 20  # generate: no smaller shards, even of a workload's 1-sample files

T = TypeVar("T")
Progress = Callable[[int], None]
Int64s = np.ndarray[Any, np.dtype[np.int64]]


class DatasetCorruptError(TectonicError):
    """What was read does not match the dataset's index (CRC, size, rows or schema)."""


class DatasetIncompleteError(NotFoundError):
    """No ``_index.json``: the dataset was never finished, or this is not a dataset."""


class StreamClosedError(TectonicError):
    """A batch was asked of a closed, failed or cancelled ``ShardStream``."""

    default_errno = 9  # EBADF


# -- the client's thread -----------------------------------------------------------------------
_threads: weakref.WeakKeyDictionary[Client, ThreadPoolExecutor] = weakref.WeakKeyDictionary()


async def _in_thread(client: Client, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the one thread of ``client`` for encoding, decoding and shuffling,
    shared by its writers and streams (its heap stays warm: fresh memory is slow here)."""
    if client not in _threads:
        _threads[client] = ThreadPoolExecutor(1, thread_name_prefix="shard-stream")
    return await asyncio.get_running_loop().run_in_executor(_threads[client], fn, *args)


# -- the index ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RowGroup:
    rows: int
    offset: int  # byte range of the row group's column chunks in the shard
    length: int
    crc32c: int


@dataclass(frozen=True, slots=True)
class ShardInfo:
    name: str
    rows: int
    bytes: int
    crc32c: int  # of the whole shard
    footer_offset: int  # the footer runs from here to the end of the shard
    footer_crc32c: int
    row_groups: tuple[RowGroup, ...]


@dataclass(frozen=True)
class DatasetIndex:
    """A dataset's ``_index.json``."""

    path: str
    schema: pa.Schema
    shards: tuple[ShardInfo, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @cached_property
    def nbytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @cached_property
    def starts(self) -> Int64s:
        """The global sample number of each shard's first row (rows in shard order), and the
        total."""
        return np.cumsum([0] + [s.rows for s in self.shards], dtype=np.int64)

    @cached_property
    def _sequences(self) -> OrderedDict[tuple[int, int], tuple[Int64s, Int64s]]:
        return OrderedDict()

    def sequence(self, seed: int, epoch: int) -> tuple[Int64s, Int64s]:
        """The shards permuted for (seed, epoch), and the position in the epoch's sequence of
        samples where each starts (and the total). Shared by the streams of all ranks."""
        key = (seed, epoch)
        if key not in self._sequences:
            order = np.random.default_rng([seed, epoch]).permutation(len(self.shards))
            rows = np.diff(self.starts)[order]
            self._sequences[key] = (order, np.cumsum([0, *rows], dtype=np.int64))
            while len(self._sequences) > 4:
                self._sequences.popitem(last=False)
        return self._sequences[key]

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "rows": self.rows,
            "bytes": self.nbytes,
            "columns": [{"name": f.name, "type": str(f.type)} for f in self.schema],
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            "metadata": dict(self.metadata),
            "shards": [
                {
                    "name": s.name,
                    "rows": s.rows,
                    "bytes": s.bytes,
                    "crc32c": s.crc32c,
                    "footer": [s.footer_offset, s.footer_crc32c],
                    "row_groups": [[g.rows, g.offset, g.length, g.crc32c] for g in s.row_groups],
                }
                for s in self.shards
            ],
        }
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, path: str, raw: bytes) -> DatasetIndex:
        try:
            doc = json.loads(raw)
            if (doc.get("format"), doc.get("version")) != (FORMAT, VERSION):
                raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}")
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["schema"])))
            shards = tuple(
                ShardInfo(
                    s["name"],
                    s["rows"],
                    s["bytes"],
                    s["crc32c"],
                    s["footer"][0],
                    s["footer"][1],
                    tuple(RowGroup(*g) for g in s["row_groups"]),
                )
                for s in doc["shards"]
            )
            index = cls(path, schema, shards, doc.get("metadata", {}))
            if index.rows != doc["rows"]:
                raise ValueError("rows do not add up")
        except (ValueError, KeyError, TypeError, IndexError, pa.ArrowException) as exc:
            raise DatasetCorruptError(f"unreadable {INDEX_NAME} ({exc})", path) from None
        return index


async def load_index(client: Client, path: str) -> DatasetIndex:
    """The index of the dataset at ``path``. Raises DatasetIncompleteError (no index),
    DatasetCorruptError (an unreadable one), NotFoundError (no such directory)."""
    path = join_path(split_path(path))
    try:
        raw = await client.read(f"{path}/{INDEX_NAME}")
    except NotFoundError:
        if not await client.exists(path):
            raise
        raise DatasetIncompleteError(f"no {INDEX_NAME}: an incomplete dataset", path) from None
    return DatasetIndex.from_json(path, raw)


# -- writing -----------------------------------------------------------------------------------
def shard_name(i: int) -> str:
    return f"part-{i:05d}.parquet"


def _encode_shard(
    name: str, table: pa.Table, row_group_rows: int, options: Mapping[str, Any]
) -> tuple[pa.Buffer, ShardInfo]:
    """One shard's Parquet bytes, and its index entry."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, **options) as writer:
        writer.write_table(table, row_group_size=row_group_rows)
    buf = sink.getvalue()
    meta = pq.read_metadata(pa.BufferReader(buf))
    view = memoryview(buf)
    groups = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        cols = [rg.column(j) for j in range(rg.num_columns)]
        lo = min(
            c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in cols
        )
        hi = lo + sum(c.total_compressed_size for c in cols)
        groups.append(RowGroup(rg.num_rows, lo, hi - lo, crc32c(view[lo:hi])))
    (footer_len,) = struct.unpack("<I", view[-8:-4])
    at = len(view) - 8 - footer_len
    info = ShardInfo(
        name, table.num_rows, len(view), crc32c(view), at, crc32c(view[at:]), tuple(groups)
    )
    return buf, info


async def _batches_of(
    client: Client, data: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch]
) -> AsyncGenerator[pa.RecordBatch, None]:
    """The record batches of ``data``; an iterable is drawn off the event loop (it may
    compute them)."""
    if isinstance(data, pa.Table | pa.RecordBatch):
        for batch in data.to_batches() if isinstance(data, pa.Table) else [data]:
            yield batch
        return
    it, cpu = iter(data), partial(_in_thread, client)
    while (batch := await cpu(next, it, None)) is not None:
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidArgumentError(f"expected pyarrow RecordBatches, got {type(batch)}")
        yield batch


async def write_shards(
    client: Client,
    path: str,
    data: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch],
    *,
    rows_per_shard: int,
    row_group_rows: int | None = None,
    compression: str = "snappy",
    use_dictionary: bool | Sequence[str] = True,
    write_statistics: bool | Sequence[str] = True,
    encoding: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> DatasetIndex:
    """Write ``data`` as a dataset at ``path``: Parquet shards of ``rows_per_shard`` rows in
    row groups of ``row_group_rows`` (default: about ROW_GROUP_BYTES), columns as given, then
    ``_index.json``. ``metadata`` (JSON-able) goes into the index; ``progress(n)`` is called
    with each shard's bytes once it is stored.

    Raises AlreadyExistsError (a dataset is there and not ``overwrite``), InvalidArgumentError
    (bad sizes, batches of differing schemas, no data and no schema) and the store's errors.
    On error or cancellation the dataset has no index: readers see it as incomplete.
    """
    if rows_per_shard < 1 or (row_group_rows is not None and row_group_rows < 1):
        raise InvalidArgumentError("rows_per_shard and row_group_rows must be at least 1")
    path = join_path(split_path(path))
    await client.mkdir(path, parents=True, exist_ok=True)
    index_path = f"{path}/{INDEX_NAME}"
    if await client.exists(index_path):
        if not overwrite:
            raise AlreadyExistsError("a dataset is already here", path)
        await client.delete(index_path)  # incomplete from here until the new index
    options = {
        "compression": compression,
        "use_dictionary": _columns(use_dictionary),
        "write_statistics": _columns(write_statistics),
    }
    schema = data.schema if isinstance(data, pa.Table | pa.RecordBatch) else None
    shards: list[ShardInfo] = []
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    storing: list[asyncio.Task[None]] = []  # shards being stored, oldest first

    async def store(name: str, buf: pa.Buffer) -> None:
        await client.write_file(f"{path}/{name}", buf, encoding=encoding)
        if progress is not None:
            progress(buf.size)

    async def emit(batches: list[pa.RecordBatch]) -> None:
        nonlocal row_group_rows
        table = pa.Table.from_batches(batches, schema=schema)
        if row_group_rows is None:
            per_row = max(1, table.nbytes // max(1, table.num_rows))
            row_group_rows = max(1, min(rows_per_shard, ROW_GROUP_BYTES // per_row))
        name = shard_name(len(shards))
        # Encode this shard while earlier ones are being stored (in one thread of the client's,
        # whose heap stays warm).
        buf, info = await _in_thread(client, _encode_shard, name, table, row_group_rows, options)
        while len(storing) >= WRITES_IN_FLIGHT:
            await storing.pop(0)
        shards.append(info)
        storing.append(asyncio.create_task(store(name, buf)))

    try:
        async for batch in _batches_of(client, data):
            schema = batch.schema if schema is None else schema
            if not batch.schema.equals(schema):
                raise InvalidArgumentError(f"a batch of schema {batch.schema}, not {schema}", path)
            pending.append(batch)
            pending_rows += batch.num_rows
            while pending_rows >= rows_per_shard:
                head, pending = _split(pending, rows_per_shard)
                pending_rows -= rows_per_shard
                await emit(head)
        if pending_rows:
            await emit(pending)
        while storing:
            await storing.pop(0)
    finally:
        for task in storing:  # after an error or cancellation
            task.cancel()
        await asyncio.gather(*storing, return_exceptions=True)
    if schema is None:
        raise InvalidArgumentError("no batches and no schema: nothing to write", path)
    keep = {s.name for s in shards}
    for name in await client.listdir(path):  # shards of an earlier, larger dataset
        if name.startswith("part-") and name.endswith(".parquet") and name not in keep:
            await client.delete(f"{path}/{name}")
    index = DatasetIndex(path, schema, tuple(shards), dict(metadata or {}))
    await client.write_file(index_path, index.to_json())
    return index


def _columns(choice: bool | Sequence[str]) -> bool | list[str]:
    return choice if isinstance(choice, bool) else list(choice)


def _split(
    batches: list[pa.RecordBatch], rows: int
) -> tuple[list[pa.RecordBatch], list[pa.RecordBatch]]:
    """The first ``rows`` rows of ``batches`` and the rest (zero-copy slices)."""
    head: list[pa.RecordBatch] = []
    for i, b in enumerate(batches):
        if b.num_rows >= rows:
            head.append(b.slice(0, rows))
            rest = [b.slice(rows)] if b.num_rows > rows else []
            return head, rest + batches[i + 1 :]
        head.append(b)
        rows -= b.num_rows
    return head, []


# -- reading -----------------------------------------------------------------------------------
class _RowGroupFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``data``, at ``start``, is here:
    pyarrow may read only there (``pq.ParquetFile`` given the footer reads one row group)."""

    def __init__(self, size: int, start: int, data: BytesLike) -> None:
        super().__init__()
        self._size, self._start, self._data, self._pos = size, start, memoryview(data), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = offset + {io.SEEK_CUR: self._pos, io.SEEK_END: self._size}.get(whence, 0)
        return self._pos

    def read(self, size: int = -1) -> memoryview:
        size = self._size - self._pos if size < 0 else size
        lo = self._pos - self._start
        if lo < 0 or lo + size > len(self._data):
            raise OSError(f"read of [{self._pos}, {self._pos + size}) outside the row group")
        self._pos += size
        return self._data[lo : lo + size]


def _check(index: DatasetIndex, where: str, data: BytesLike, length: int, crc: int) -> None:
    if len(data) != length:
        raise DatasetCorruptError(
            f"{where}: {len(data)} bytes, the index says {length}", index.path
        )
    if crc32c(data) != crc:
        raise DatasetCorruptError(f"{where}: CRC32C mismatch", index.path)


def _decode(index: DatasetIndex, where: str, rows: int, read: Callable[[], pa.Table]) -> pa.Table:
    try:
        table = read()
    except (OSError, pa.ArrowException) as exc:
        raise DatasetCorruptError(f"{where}: undecodable ({exc})", index.path) from None
    if table.num_rows != rows or not table.schema.equals(index.schema):
        raise DatasetCorruptError(f"{where}: rows or schema differ from the index", index.path)
    return table


def _read_group(file: _RowGroupFile, meta: pq.FileMetaData, i: int) -> pa.Table:
    return pq.ParquetFile(file, metadata=meta).read_row_group(i)


def _decode_groups(
    index: DatasetIndex,
    shard: ShardInfo,
    meta: pq.FileMetaData,
    held: memoryview,
    held_at: int,
    groups: range,
    rows: tuple[int, int],
) -> list[pa.Table]:
    """Row groups ``groups`` of ``shard`` from ``held`` (its bytes from ``held_at`` on), each
    checked against the index, trimmed to the shard's rows [rows[0], rows[1])."""
    out = []
    first = sum(g.rows for g in shard.row_groups[: groups.start])
    for i in groups:
        rg, where = shard.row_groups[i], f"{shard.name} row group {i}"
        data = held[rg.offset - held_at : rg.offset - held_at + rg.length]
        _check(index, where, data, rg.length, rg.crc32c)
        file = _RowGroupFile(shard.bytes, rg.offset, data)
        table = _decode(index, where, rg.rows, partial(_read_group, file, meta, i))
        lo, hi = max(rows[0] - first, 0), min(rows[1] - first, rg.rows)
        out.append(table.slice(lo, hi - lo))
        first += rg.rows
    return out


async def read_shard(client: Client, index: DatasetIndex, shard: int | str) -> pa.Table:
    """One whole shard (by position or name), its CRC32C checked. Raises DatasetCorruptError,
    NotFoundError and the store's errors (DataUnavailableError...): never wrong data."""
    info = index.shards[shard] if isinstance(shard, int) else None
    info = info or next((s for s in index.shards if s.name == shard), None)
    if info is None:
        raise NotFoundError("no such shard in the index", f"{index.path}/{shard}")
    data = await client.read(f"{index.path}/{info.name}")
    _check(index, info.name, data, info.bytes, info.crc32c)
    return _decode(index, info.name, info.rows, lambda: pq.read_table(pa.BufferReader(data)))


def _footer(index: DatasetIndex, shard: ShardInfo, tail: BytesLike) -> pq.FileMetaData:
    """The parsed footer of ``shard`` from bytes that end with it."""
    try:
        return pq.read_metadata(pa.BufferReader(pa.py_buffer(tail)))
    except (OSError, pa.ArrowException) as exc:
        raise DatasetCorruptError(f"{shard.name}: bad footer ({exc})", index.path) from None


# -- synthetic MLPerf-shaped datasets ----------------------------------------------------------
LABELS = 1000  # the label column: a random class in [0, LABELS)


def _synthetic_batches(
    record_bytes: int, samples: int, batch_rows: int, seed: int
) -> Iterator[pa.RecordBatch]:
    """Batches of (index, label, payload) rows; payloads are ``record_bytes`` random bytes,
    so that no compression can shrink them."""
    bits = np.random.PCG64(seed)
    labels = np.random.default_rng([seed, 1])
    for first in range(0, samples, batch_rows):
        n = min(batch_rows, samples - first)
        raw = bits.random_raw(-(-n * record_bytes // 8)).view(np.uint8)[: n * record_bytes]
        offsets = np.arange(0, (n + 1) * record_bytes, record_bytes, dtype=np.int32)
        payload = pa.Array.from_buffers(
            pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw)]
        )
        index = pa.array(np.arange(first, first + n, dtype=np.int64))
        label = pa.array(labels.integers(0, LABELS, n, dtype=np.int32))
        yield pa.RecordBatch.from_arrays([index, label, payload], ["index", "label", "payload"])


async def generate(
    client: Client,
    workload: str | Workload,
    scale: float,
    path: str,
    *,
    seed: int = 0,
    rows_per_shard: int | None = None,
    encoding: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> DatasetIndex:
    """Write a synthetic dataset shaped like MLPerf Storage's ``workload`` (``unet3d``,
    ``resnet50``, ``cosmoflow``) scaled by ``scale`` (``Workload.scaled``): that many samples,
    columns ``index`` (int64, 0..n-1), ``label`` (int32) and ``payload`` (binary: random
    bytes of the scaled record size). A shard holds the workload's samples per file, or more
    to reach MIN_SHARD_BYTES, unless ``rows_per_shard`` says otherwise; a row group holds
    ROW_GROUP_BYTES of samples (at least one). ``progress(n)``: n more bytes stored.
    Raises as ``write_shards``, and InvalidArgumentError (unknown workload, bad scale).
    """
    base = workload if isinstance(workload, Workload) else workload_named(workload)
    sized = base.scaled(scale)
    if rows_per_shard is None:
        rows_per_shard = max(base.samples_per_file, -(-MIN_SHARD_BYTES // sized.record_bytes))
    rows_per_shard = max(1, min(rows_per_shard, sized.samples))
    group = max(1, min(rows_per_shard, ROW_GROUP_BYTES // sized.record_bytes))
    meta = {
        "workload": base.name,
        "scale": scale,
        "record_bytes": sized.record_bytes,
        "samples": sized.samples,
        "seed": seed,
    }
    return await write_shards(
        client,
        path,
        _synthetic_batches(sized.record_bytes, sized.samples, group, seed),
        rows_per_shard=rows_per_shard,
        row_group_rows=group,
        compression="none",  # random bytes: nothing to gain
        use_dictionary=["label"],
        write_statistics=["index", "label"],
        encoding=encoding,
        metadata=meta,
        overwrite=overwrite,
        progress=progress,
    )


# The per-rank stream: clients/shardstream.py imports this module, so its names are looked up
# there on first use (a module-level import here would be circular).
_STREAM_NAMES = frozenset({"ShardStream", "StreamStats", "default_shuffle_rows", "rank_order"})


def __getattr__(name: str) -> Any:
    if name in _STREAM_NAMES:
        from clients import shardstream

        return getattr(shardstream, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "INDEX_NAME",
    "DatasetCorruptError",
    "DatasetIncompleteError",
    "DatasetIndex",
    "RowGroup",
    "ShardInfo",
    "ShardStream",
    "StreamClosedError",
    "StreamStats",
    "default_shuffle_rows",
    "generate",
    "load_index",
    "rank_order",
    "read_shard",
    "shard_name",
    "write_shards",
]
