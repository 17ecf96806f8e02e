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

This module writes datasets; it re-exports the names of the two below it:

- ``clients/dataset_index.py``: the index (``DatasetIndex``, ``load_index``), reading and
  checking whole shards (``read_shard``) and row groups, the errors;
- ``clients/shardstream.py``: the deterministic, resumable, prefetching stream of a
  dataset's samples for each rank (``ShardStream``, ``StreamStats``, ``rank_order``,
  ``default_shuffle_rows``).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from clients.dataset_index import (
    INDEX_NAME,
    DatasetCorruptError,
    DatasetIncompleteError,
    DatasetIndex,
    DescribedFooter,
    RowGroup,
    ShardInfo,
    StreamClosedError,
    in_thread,
    load_index,
    read_shard,
)
from clients.shardstream import ShardStream, StreamStats, default_shuffle_rows, rank_order
from clients.workloads import Workload, workload_named
from tectonic_emu.client import Client
from tectonic_emu.coding.checksum import crc32c
from tectonic_emu.coding.synthetic import Synthetic
from tectonic_emu.errors import AlreadyExistsError, InvalidArgumentError
from tectonic_emu.paths import join_path, split_path

ROW_GROUP_BYTES = 1 << 20  # default row group size: the unit of decoding
WRITES_IN_FLIGHT = 3  # shards being stored at once by write_shards
MIN_SHARD_BYTES = 8 << 20  # generate: no smaller shards, even of a workload's 1-sample files

Progress = Callable[[int], None]


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
    it, cpu = iter(data), partial(in_thread, client)
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
    path = await _begin(client, path, overwrite)
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
        buf, info = await in_thread(client, _encode_shard, name, table, row_group_rows, options)
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
    return await _finish(client, DatasetIndex(path, schema, tuple(shards), dict(metadata or {})))


async def _begin(client: Client, path: str, overwrite: bool) -> str:
    """Make the dataset's directory, its index gone (unless there is one and not
    ``overwrite``): the dataset is incomplete until ``_finish``. Its normalized path."""
    path = join_path(split_path(path))
    await client.mkdir(path, parents=True, exist_ok=True)
    index_path = f"{path}/{INDEX_NAME}"
    if await client.exists(index_path):
        if not overwrite:
            raise AlreadyExistsError("a dataset is already here", path)
        await client.delete(index_path)  # incomplete from here until the new index
    return path


async def _finish(client: Client, index: DatasetIndex) -> DatasetIndex:
    """Delete the shards of an earlier, larger dataset there, then write ``index``."""
    keep = {s.name for s in index.shards}
    for name in await client.listdir(index.path):
        if name.startswith("part-") and name.endswith(".parquet") and name not in keep:
            await client.delete(f"{index.path}/{name}")
    await client.write_file(f"{index.path}/{INDEX_NAME}", index.to_json())
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


# -- synthetic MLPerf-shaped datasets ----------------------------------------------------------
def _layout(
    base: Workload, record_bytes: int, samples: int, rows_per_shard: int | None
) -> tuple[int, int]:
    """Rows per shard (the workload's samples per file, or more to reach MIN_SHARD_BYTES,
    unless given) and per row group (ROW_GROUP_BYTES of samples, at least one)."""
    if rows_per_shard is None:
        rows_per_shard = max(base.samples_per_file, -(-MIN_SHARD_BYTES // record_bytes))
    rows_per_shard = max(1, min(rows_per_shard, samples))
    return rows_per_shard, max(1, min(rows_per_shard, ROW_GROUP_BYTES // record_bytes))


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


def _described_as(
    workload: Workload, record_bytes: int, samples: int, seed: int, **more: object
) -> dict[str, object]:
    """A generated dataset's index metadata: what it was made as."""
    return {
        "workload": workload.name,
        "record_bytes": record_bytes,
        "samples": samples,
        "seed": seed,
        **more,
    }


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
    rows_per_shard, group = _layout(base, sized.record_bytes, sized.samples, rows_per_shard)
    meta = _described_as(base, sized.record_bytes, sized.samples, seed, scale=scale)
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


async def generate_described(
    client: Client,
    workload: str | Workload,
    path: str,
    *,
    samples: int,
    record_bytes: int,
    seed: int = 0,
    rows_per_shard: int | None = None,
    encoding: str | None = None,
    overwrite: bool = False,
    writes: int = WRITES_IN_FLIGHT,
    progress: Progress | None = None,
) -> DatasetIndex:
    """A dataset laid out as ``generate`` lays out ``workload``'s (``samples`` samples of
    ``record_bytes``), whose shards are ``Synthetic`` payloads: described by a seed, never
    made (a projection's, docs/simulate.md). A shard is its row groups' seed-random bytes,
    then a ``DescribedFooter`` (real bytes); the index gives each the CRC32C its structure
    derives, so a stream checks what it read as it checks real bytes, and decodes the rows
    to their ``index`` column alone. ``writes`` shards are stored at once. Raises as
    ``generate``."""
    base = workload if isinstance(workload, Workload) else workload_named(workload)
    if samples < 1 or record_bytes < 1 or writes < 1:
        raise InvalidArgumentError("samples, record_bytes and writes must be at least 1")
    rows_per_shard, group = _layout(base, record_bytes, samples, rows_per_shard)
    path = await _begin(client, path, overwrite)
    gate = asyncio.Semaphore(writes)

    async def shard(i: int) -> ShardInfo:
        first = i * rows_per_shard
        rows = min(rows_per_shard, samples - first)
        body = Synthetic.random((seed << 32 | i) % 2**64, rows * record_bytes)
        payload = Synthetic.join([body, DescribedFooter(first, rows).to_bytes()])
        groups = []
        for at in range(0, rows, group):
            n = min(group, rows - at)
            offset, length = at * record_bytes, n * record_bytes
            groups.append(RowGroup(n, offset, length, payload[offset : offset + length].crc32c()))
        async with gate:
            await client.write_file(f"{path}/{shard_name(i)}", payload, encoding=encoding)
        if progress is not None:
            progress(len(payload))
        tail = payload[len(body) :]
        return ShardInfo(
            shard_name(i),
            rows,
            len(payload),
            payload.crc32c(),
            len(body),
            tail.crc32c(),
            tuple(groups),
        )

    shards = await asyncio.gather(*(shard(i) for i in range(-(-samples // rows_per_shard))))
    meta = _described_as(base, record_bytes, samples, seed, described=True)
    schema = pa.schema([("index", pa.int64())])
    return await _finish(client, DatasetIndex(path, schema, tuple(shards), meta))


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
    "generate_described",
    "load_index",
    "rank_order",
    "read_shard",
    "shard_name",
    "write_shards",
]
