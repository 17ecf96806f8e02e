"""A sharded Parquet dataset's index and the checks of what is read against it.

``PATH/_index.json`` (``DatasetIndex``) lists the schema and, per shard, its rows, bytes and
CRC32C, and the byte range and CRC32C of its footer and of each row group, so that a reader
can fetch part of a shard and check what it fetched. This module reads it (``load_index``),
reads whole shards (``read_shard``) and checks and decodes row groups and footers for the
per-rank streams (``clients/shardstream.py``); writing datasets is ``clients/dataset.py``'s.
Both use the client's one thread for encoding, decoding and shuffling (``in_thread``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from tectonic_emu.chunkstore.base import BytesLike
from tectonic_emu.client import Client
from tectonic_emu.coding import work
from tectonic_emu.coding.checksum import crc32c
from tectonic_emu.coding.synthetic import Synthetic, real_bytes, sliced
from tectonic_emu.errors import NotFoundError, TectonicError
from tectonic_emu.paths import join_path, split_path

INDEX_NAME = "_index.json"
FORMAT, VERSION = "tectonic-emu/shards", 1
DESCRIBED = "tectonic-emu/described-shard"  # a described shard's footer (DescribedFooter)

T = TypeVar("T")
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


async def in_thread(client: Client, fn: Callable[..., T], *args: Any) -> T:
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

    @property
    def described(self) -> bool:
        """Whether the shards are ``Synthetic`` payloads, described and never made (a
        projection's: ``dataset.generate_described``)."""
        return bool(self.metadata.get("described"))

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


# -- reading shards --------------------------------------------------------------------------------
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


def check_bytes(
    index: DatasetIndex, where: str, data: BytesLike | Synthetic, length: int, crc: int
) -> None:
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


def decode_groups(
    index: DatasetIndex,
    shard: ShardInfo,
    meta: pq.FileMetaData | DescribedFooter,
    held: memoryview | Synthetic,
    held_at: int,
    groups: range,
    rows: tuple[int, int],
) -> list[pa.Table]:
    """Row groups ``groups`` of ``shard`` from ``held`` (its bytes from ``held_at`` on), each
    checked against the index, trimmed to the shard's rows [rows[0], rows[1]). A described
    shard's (``meta`` a ``DescribedFooter``) decode to the rows they describe."""
    out = []
    first = sum(g.rows for g in shard.row_groups[: groups.start])
    for i in groups:
        rg, where = shard.row_groups[i], f"{shard.name} row group {i}"
        data = sliced(held, rg.offset - held_at, rg.offset - held_at + rg.length)
        check_bytes(index, where, data, rg.length, rg.crc32c)
        work.count("copy", rg.length)  # decoding copies the values into Arrow's arrays
        if isinstance(meta, DescribedFooter):
            table = meta.table(index, first, rg.rows)
        elif isinstance(data, Synthetic):
            raise DatasetCorruptError(f"{where}: described bytes, not Parquet", index.path)
        else:
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
    check_bytes(index, info.name, data, info.bytes, info.crc32c)
    if index.described:
        footer = parse_footer(index, info, sliced(data, info.footer_offset, len(data)))
        assert isinstance(footer, DescribedFooter)
        return footer.table(index, 0, info.rows)
    raw = real_bytes(data)
    return _decode(index, info.name, info.rows, lambda: pq.read_table(pa.BufferReader(raw)))


@dataclass(frozen=True, slots=True)
class DescribedFooter:
    """The footer of a described shard (``DatasetIndex.described``): real bytes, JSON, after
    the ``Synthetic`` bytes of its row groups. Its rows hold the ``index`` column alone, the
    sample numbers ``first`` to ``first + count - 1``: what a shard of ``dataset.generate``
    holds, less the label and the payload, whose bytes are described, not made."""

    first: int  # the sample number of the shard's first row
    count: int  # its rows

    def to_bytes(self) -> bytes:
        return json.dumps({"format": DESCRIBED, "first": self.first, "rows": self.count}).encode()

    def table(self, index: DatasetIndex, first: int, n: int) -> pa.Table:
        """Rows ``first`` to ``first + n - 1`` of the shard, in the dataset's schema."""
        values = np.arange(self.first + first, self.first + first + n, dtype=np.int64)
        return pa.Table.from_arrays([pa.array(values)], schema=index.schema)


def _described_footer(shard: ShardInfo, tail: BytesLike | Synthetic) -> DescribedFooter:
    if isinstance(tail, Synthetic):
        if any(seg.kind != "lit" for seg in tail.segments):
            raise ValueError("a described footer is literal bytes")
        tail = tail.materialize()
    doc = json.loads(bytes(tail))
    if doc.get("format") != DESCRIBED or doc["rows"] != shard.rows:
        raise ValueError(f"format {doc.get('format')!r}, {doc.get('rows')} rows")
    return DescribedFooter(int(doc["first"]), int(doc["rows"]))


def parse_footer(
    index: DatasetIndex, shard: ShardInfo, tail: BytesLike | Synthetic
) -> pq.FileMetaData | DescribedFooter:
    """The parsed footer of ``shard`` from bytes that end with it (a ``DescribedFooter`` for
    a described dataset's)."""
    try:
        if index.described:
            return _described_footer(shard, tail)
        if isinstance(tail, Synthetic):
            raise ValueError("described bytes, not Parquet")
        return pq.read_metadata(pa.BufferReader(pa.py_buffer(tail)))
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        raise DatasetCorruptError(f"{shard.name}: bad footer ({exc})", index.path) from None


__all__ = [
    "DESCRIBED",
    "INDEX_NAME",
    "VERSION",
    "DatasetCorruptError",
    "DatasetIncompleteError",
    "DatasetIndex",
    "DescribedFooter",
    "Int64s",
    "RowGroup",
    "ShardInfo",
    "StreamClosedError",
    "check_bytes",
    "decode_groups",
    "in_thread",
    "load_index",
    "parse_footer",
    "read_shard",
]
