"""torch.distributed.checkpoint (DCP) storage in a tectonic-emu cluster, through the native client.

``TectonicStorageWriter`` and ``TectonicStorageReader`` plug into ``dcp.save`` and ``dcp.load``.
A checkpoint is a directory of the store (the checkpoint id, e.g. ``/ckpt/step-100``)::

    /ckpt/step-100/.metadata          torch's Metadata, pickled; written last, by rank 0
    /ckpt/step-100/<save>-<rank>.distcp   one data file per rank: its items back to back

Each rank streams its items, as raw bytes (tensors) or torch.save bytes (other objects), into
one data file written as a new version (nameless until it is sealed, deleted if the save
fails), and reports where each item landed (``StoredItem``). The coordinator then writes
``.metadata`` under a temporary name and renames it into place: a reader sees no checkpoint
or a complete one. Loads read only the byte ranges the load plan asks for, so loading a
subset of keys or a reshard of a tensor does not read whole files. See ``docs/torch-dcp.md``.

Every process (gloo rank) opens the cluster itself, on an event-loop thread of its own; the
embedded cluster's SQLite metadata is shared safely by processes on one host.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import io
import math
import os
import pickle
import secrets
import uuid
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from clients.ckpt_format import CheckpointCorruptError
from clients.ckpt_reads import FileReaders
from tectonic_emu import Client
from tectonic_emu.bridge import Bridge
from tectonic_emu.coding import Encoding, crc32c
from tectonic_emu.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    InvalidPathError,
    NotADirectoryError_,
    NotFoundError,
)
from tectonic_emu.paths import join_path, split_path

T = TypeVar("T")

SCHEME = "tectonic://"
METADATA_NAME = ".metadata"
DATA_SUFFIX = ".distcp"
# Items start at multiples of this in a data file, so a tensor read back lands aligned for
# its dtype and is used in place instead of copied.
ITEM_ALIGN = 64


# -- checkpoint ids ----------------------------------------------------------------------------
def store_path(checkpoint_id: str | os.PathLike[str]) -> str:
    """The store directory named by a checkpoint id, normalised (``/ckpt/step-100``).

    Accepted: ``"tectonic:///ckpt/step-100"`` and the absolute store path ``"/ckpt/step-100"``.
    Rejected, with InvalidPathError: anything not a ``str`` (a ``pathlib.Path`` names a local
    directory), relative paths, other schemes, a host in the URI, the root, and names the store
    refuses (``.``, ``..``, NUL, over 255 bytes).
    """
    if not isinstance(checkpoint_id, str):
        raise InvalidPathError(
            f"a tectonic checkpoint id is a str, not {type(checkpoint_id).__name__}",
            str(checkpoint_id),
        )
    path = checkpoint_id.removeprefix(SCHEME)
    if not path.startswith("/"):
        raise InvalidPathError(
            f"not an absolute store path or a {SCHEME}/<path> URI (no host)", checkpoint_id
        )
    parts = split_path(path)
    if not parts:
        raise InvalidPathError("a checkpoint cannot be the root directory", checkpoint_id)
    return join_path(parts)


def _is_store_path(checkpoint_id: str | os.PathLike[str]) -> bool:
    try:
        store_path(checkpoint_id)
    except InvalidPathError:
        return False
    return True


# -- what the metadata records per item --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StoredItem:
    """Where one item of the checkpoint lives (``Metadata.storage_data[index]``).

    ``dtype`` and ``shape`` are set for tensors, stored raw (row-major, native byte order);
    other objects are the bytes of ``torch.save``. ``crc32c`` covers the item's bytes.
    """

    relative_path: str
    offset: int
    length: int
    crc32c: int
    dtype: str | None = None  # "float32", "bfloat16"...
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class _DataFile:
    """``SavePlan.storage_data``: the name of the data file a rank writes."""

    name: str


def _close_quietly(thread: Bridge) -> None:
    # At garbage collection or interpreter exit nobody is left to hear an error.
    with contextlib.suppress(BaseException):
        thread.close()


class _TectonicStorage:
    """What the writer and the reader share: the checkpoint's store path and the cluster,
    opened on first use and kept until ``close`` (or garbage collection)."""

    def __init__(
        self, cluster_dir: str | os.PathLike[str], checkpoint_id: str | os.PathLike[str] | None
    ) -> None:
        self.cluster_dir = os.fspath(cluster_dir)
        self.path: str | None = None if checkpoint_id is None else store_path(checkpoint_id)
        self._thread: Bridge | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _set_checkpoint_id(self, checkpoint_id: str | os.PathLike[str] | None) -> None:
        if checkpoint_id is not None:
            self.path = store_path(checkpoint_id)

    @property
    def checkpoint_id(self) -> str | None:
        """The checkpoint as a ``tectonic://`` URI (None until one is set)."""
        return None if self.path is None else SCHEME + self.path

    def _dir(self) -> str:
        if self.path is None:
            raise InvalidArgumentError(
                "no checkpoint id: pass one to the constructor or to dcp.save/dcp.load"
            )
        return self.path

    def _cluster(self) -> Bridge:
        if self._thread is None:
            self._thread = Bridge(self.cluster_dir, name="tectonic-dcp")
            self._finalizer = weakref.finalize(self, _close_quietly, self._thread)
        return self._thread

    def close(self) -> None:
        """Close the cluster connection. The object can be used again: it reopens it."""
        thread, self._thread = self._thread, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if thread is not None:
            thread.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Picklable (async_save may send the writer to another process): the cluster is reopened
    # there on first use.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_thread"] = state["_finalizer"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


# -- saving ------------------------------------------------------------------------------------
class TectonicStorageWriter(_TectonicStorage, StorageWriter):
    """Saves a DCP checkpoint into the directory ``checkpoint_id`` of the cluster at
    ``cluster_dir``; ``encoding`` (``r3``, ``rs-6-3``...) for its files, else they inherit the
    directory's.

    A save into a directory that already holds a committed checkpoint (a ``.metadata``) fails
    with AlreadyExistsError (wrapped by dcp in a CheckpointException) and changes nothing:
    committed checkpoints are immutable; delete one to reuse its id. Use as a context manager,
    or call ``close``, to close the cluster when done.
    """

    def __init__(
        self,
        cluster_dir: str | os.PathLike[str],
        checkpoint_id: str | os.PathLike[str] | None = None,
        *,
        encoding: str | None = None,
    ) -> None:
        super().__init__(cluster_dir, checkpoint_id)
        self.encoding = None if encoding is None else Encoding.parse(encoding).name
        self.save_id = str(uuid.uuid4())
        self._token: str | None = None  # this save's data file prefix, chosen by rank 0

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._set_checkpoint_id(checkpoint_id)
        self.save_id = str(uuid.uuid4())
        self._token = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("use_collectives", True):
            raise InvalidArgumentError(
                "use_collectives=False (per-rank metadata) is not supported", self.path
            )
        self._dir()  # fail before planning without a checkpoint id

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Create the checkpoint directory, refuse one that holds a committed checkpoint, and
        name each rank's data file. Runs on the coordinator before any rank writes."""
        path = self._dir()

        async def check(client: Client) -> None:
            await client.mkdir(path, parents=True, exist_ok=True)
            if await client.exists(f"{path}/{METADATA_NAME}"):
                raise AlreadyExistsError("a committed checkpoint is already here", path)

        cluster = self._cluster()
        cluster.call(check(cluster.client))
        # New names for every save: leftovers of a failed save to this id are never reused.
        self._token = secrets.token_hex(6)
        return [
            dataclasses.replace(plan, storage_data=_DataFile(f"{self._token}-{rank}{DATA_SUFFIX}"))
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Stream this rank's items into its data file; the file appears (sealed) only once
        every item is durable, and is deleted on error."""
        assert isinstance(plan.storage_data, _DataFile), "prepare_global_plan names the file"
        results = self._write_file(plan.storage_data.name, plan.items, planner)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _write_file(
        self, name: str, items: list[WriteItem], planner: SavePlanner
    ) -> list[WriteResult]:
        if not items:
            return []
        path = f"{self._dir()}/{name}"
        cluster = self._cluster()
        # A new version: nameless until sealed, so a failed save leaves no half-written file.
        writer = cluster.call(cluster.client.new_version(path, encoding=self.encoding))
        results: list[WriteResult] = []
        try:
            for item in items:
                payload, dtype, shape = _payload(planner.resolve_data(item))
                if pad := -writer.offset % ITEM_ALIGN:
                    cluster.call(writer.append(bytes(pad)))
                offset = writer.offset
                # owned: nothing changes these bytes before close() has drained them.
                cluster.call(writer.append(payload, owned=True))
                stored = StoredItem(name, offset, payload.nbytes, crc32c(payload), dtype, shape)
                results.append(WriteResult(item.index, payload.nbytes, stored))
            cluster.call(writer.close())
        except BaseException:
            with contextlib.suppress(Exception):
                cluster.call(writer.abort())
            raise
        return results

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit: write ``.metadata`` under a temporary name, then rename it into place, so
        readers see no checkpoint or all of it. Raises AlreadyExistsError if another save
        committed this id meanwhile; on any error the temporary file is removed."""
        path = self._dir()
        assert self._token is not None, "prepare_global_plan ran on the coordinator"
        metadata.storage_data = {wr.index: wr.storage_data for rank in results for wr in rank}
        metadata.storage_meta = self.storage_meta()
        blob = pickle.dumps(metadata)
        tmp, final = f"{path}/{METADATA_NAME}.{self._token}.tmp", f"{path}/{METADATA_NAME}"

        async def commit(client: Client) -> None:
            await client.write_file(tmp, blob, encoding=self.encoding)
            try:
                if await client.exists(final):
                    raise AlreadyExistsError("a committed checkpoint is already here", path)
                await client.rename(tmp, final)
            except BaseException:
                await asyncio.shield(_delete_quietly(client, tmp))
                raise

        cluster = self._cluster()
        cluster.call(commit(cluster.client))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """True for ``tectonic:///<path>`` and absolute store paths (see ``store_path``)."""
        return _is_store_path(checkpoint_id)


def _payload(
    data: torch.Tensor | io.BytesIO,
) -> tuple[memoryview, str | None, tuple[int, ...] | None]:
    """The bytes to store for a resolved item, with its dtype and shape if a tensor."""
    if isinstance(data, io.BytesIO):
        return memoryview(data.getvalue()), None, None
    t = data.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.layout != torch.strided or t.is_quantized:
        raise InvalidArgumentError(
            f"cannot store a {t.layout} tensor (quantized: {t.is_quantized})"
        )
    return _bytes_of(t.contiguous()), str(t.dtype).removeprefix("torch."), tuple(t.shape)


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, not copied (numpy lends its buffer)."""
    array: Any = t.reshape(-1).view(torch.uint8).numpy()
    return memoryview(array)


async def _delete_quietly(client: Client, path: str) -> None:
    with contextlib.suppress(OSError):
        await client.delete(path)


# -- loading -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Want:
    """One ReadItem's bytes: file bytes [start, stop) of ``item``'s data file."""

    req: ReadItem
    item: StoredItem
    start: int
    stop: int
    strides: tuple[int, ...]  # the stored tensor's, in elements (row-major)


@dataclass(frozen=True, slots=True)
class _Span:
    """One read: bytes [offset, offset + length) of a data file, serving ``wants``."""

    file: str
    offset: int
    length: int
    wants: tuple[_Want, ...]


class TectonicStorageReader(_TectonicStorage, StorageReader):
    """Loads a DCP checkpoint saved by ``TectonicStorageWriter`` from the directory
    ``checkpoint_id`` of the cluster at ``cluster_dir``.

    Reads only the bytes the load plan needs. A whole tensor of at least ``direct_bytes``
    whose destination is a contiguous CPU tensor of its dtype and shape is read straight into
    that tensor (then checked; after a failed check it holds the bytes read); other ranges
    that touch within a file are merged into one read (up to ``max_span_bytes``) into a
    buffer, and copied into place from there. Up to ``read_window_bytes`` of reads (at most
    ``max_reads_in_flight``) run concurrently on the loop while the caller's thread checks
    and copies finished ones.
    """

    direct_bytes = 8 << 20  # a chunk: below it, merged reads of neighbours cost less
    max_span_bytes = 64 << 20
    read_window_bytes = 256 << 20
    max_reads_in_flight = 16

    def __init__(
        self,
        cluster_dir: str | os.PathLike[str],
        checkpoint_id: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(cluster_dir, checkpoint_id)
        self.load_id = str(uuid.uuid4())
        self.storage_data: dict[MetadataIndex, StoredItem] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._set_checkpoint_id(checkpoint_id)
        self.load_id = str(uuid.uuid4())
        self.storage_data = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The committed checkpoint's Metadata. Raises NotFoundError when there is none (no
        ``.metadata``: never saved, or a save that failed), CheckpointCorruptError when it is
        not a checkpoint written by TectonicStorageWriter."""
        path = self._dir()
        if kwargs.get("rank") is not None:  # dcp's fallback when .metadata is missing
            raise NotFoundError("no per-rank metadata: this plugin writes one .metadata", path)

        cluster = self._cluster()
        try:
            blob = cluster.call(cluster.client.read_file(f"{path}/{METADATA_NAME}"))
        except (NotFoundError, NotADirectoryError_):
            raise NotFoundError(
                f"no committed checkpoint here (no {METADATA_NAME})", path
            ) from None
        try:
            metadata = pickle.loads(blob)  # trusted input, as for torch's FileSystemReader
        except Exception as e:
            raise CheckpointCorruptError(f"unreadable {METADATA_NAME} ({e!r})", path) from e
        if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
            raise CheckpointCorruptError(f"{METADATA_NAME} is not DCP metadata", path)
        if not all(isinstance(v, StoredItem) for v in metadata.storage_data.values()):
            raise CheckpointCorruptError("not a checkpoint of TectonicStorageWriter", path)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the byte ranges of ``plan`` and hand them to ``planner`` (``load_bytes``,
        ``resolve_tensor``/``commit_tensor``) on this thread. Raises CheckpointCorruptError (no
        record for an item, a box outside its tensor, a short data file, a checksum mismatch),
        InvalidArgumentError (a destination of the wrong shape) and the store's read errors;
        reads still in flight are cancelled first."""
        direct: list[tuple[_Span, torch.Tensor | None]] = []
        merged: list[_Want] = []
        for want in map(self._want, plan.items):
            dest = self._direct_dest(want, planner)
            if dest is None:
                merged.append(want)
            else:
                span = _Span(want.item.relative_path, want.start, want.stop - want.start, (want,))
                direct.append((span, dest))
        reads = direct + [(span, None) for span in self._spans(merged)]
        path = self._dir()
        cluster = self._cluster()
        pending: deque[
            tuple[_Span, torch.Tensor, torch.Tensor | None, concurrent.futures.Future[int]]
        ] = deque()
        in_flight = 0
        files = FileReaders(cluster.client)  # a data file's block map looked up once

        def finish_oldest() -> None:
            nonlocal in_flight
            span, buf, dest, future = pending.popleft()
            in_flight -= span.length
            got = future.result()
            if got != span.length:
                raise CheckpointCorruptError(
                    f"data file ends at byte {span.offset + got}; the metadata says it holds "
                    f"{span.offset + span.length}",
                    f"{path}/{span.file}",
                )
            if dest is not None:  # read in place: check it, hand it over
                _check(span.wants[0], buf)
                planner.commit_tensor(span.wants[0].req, dest)
                return
            for want in span.wants:
                _deliver(want, buf[want.start - span.offset : want.stop - span.offset], planner)

        try:
            for span, dest in reads:
                while pending and (
                    in_flight + span.length > self.read_window_bytes
                    or len(pending) >= self.max_reads_in_flight
                ):
                    finish_oldest()
                if dest is None:
                    buf = torch.empty(span.length, dtype=torch.uint8)
                else:
                    buf = dest.reshape(-1).view(torch.uint8)
                read = files.read_into(f"{path}/{span.file}", span.offset, _bytes_of(buf))
                future = cluster.submit(read)
                pending.append((span, buf, dest, future))
                in_flight += span.length
            while pending:
                finish_oldest()
        except BaseException:
            for *_, future in pending:
                future.cancel()
            concurrent.futures.wait([f for *_, f in pending])
            raise
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _want(self, req: ReadItem) -> _Want:
        """The file bytes ``req`` needs: a whole item for bytes; for a tensor, from the
        first to the last element of the box ``req`` asks for."""
        item = self.storage_data.get(req.storage_index)
        if item is None:
            raise CheckpointCorruptError(
                f"the metadata has no storage record for {req.storage_index.fqn!r}", self.path
            )
        if req.type == LoadItemType.BYTE_IO or item.shape is None:
            if req.type != LoadItemType.BYTE_IO or item.shape is not None:
                raise CheckpointCorruptError(
                    f"{req.storage_index.fqn!r}: tensor and object records mixed up", self.path
                )
            return _Want(req, item, item.offset, item.offset + item.length, ())
        itemsize = _dtype(item, self.path).itemsize
        offsets, lengths = tuple(req.storage_offsets), tuple(req.lengths)
        if math.prod(item.shape) * itemsize != item.length:
            raise CheckpointCorruptError(
                f"{req.storage_index.fqn!r}: {item.length} bytes stored for a "
                f"{item.shape} {item.dtype} tensor",
                self.path,
            )
        try:
            first, stop, strides = box_range(item.shape, offsets, lengths, itemsize)
        except ValueError as e:
            raise CheckpointCorruptError(f"{req.storage_index.fqn!r}: {e}", self.path) from None
        return _Want(req, item, item.offset + first, item.offset + stop, strides)

    def _direct_dest(self, want: _Want, planner: LoadPlanner) -> torch.Tensor | None:
        """The tensor to read ``want`` straight into: the planner's destination, when ``want``
        is a whole stored tensor of at least ``direct_bytes`` and the destination is a
        contiguous CPU tensor of its dtype and shape; else None (read into a buffer)."""
        req, item = want.req, want.item
        if (
            req.type == LoadItemType.BYTE_IO
            or item.length < self.direct_bytes
            or (want.start, want.stop) != (item.offset, item.offset + item.length)
            or tuple(req.lengths) != tuple(item.shape or ())
        ):
            return None
        dest = planner.resolve_tensor(req).detach()
        if (
            dest.device.type != "cpu"
            or dest.dtype != _dtype(item, self.path)
            or tuple(dest.shape) != tuple(req.lengths)
            or not dest.is_contiguous()
            or dest.layout != torch.strided
        ):
            return None
        return dest

    def _spans(self, wants: list[_Want]) -> list[_Span]:
        """Reads per file in offset order, each merging wants whose ranges touch or overlap."""
        by_file: dict[str, list[_Want]] = {}
        for w in wants:
            by_file.setdefault(w.item.relative_path, []).append(w)
        spans: list[_Span] = []
        for file, group in by_file.items():
            group.sort(key=lambda w: (w.start, w.stop))
            start, stop, members = group[0].start, group[0].stop, [group[0]]
            for w in group[1:]:
                if w.start <= stop and max(stop, w.stop) - start <= self.max_span_bytes:
                    stop = max(stop, w.stop)
                    members.append(w)
                    continue
                spans.append(_Span(file, start, stop - start, tuple(members)))
                start, stop, members = w.start, w.stop, [w]
            spans.append(_Span(file, start, stop - start, tuple(members)))
        return spans

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """True for ``tectonic:///<path>`` and absolute store paths (see ``store_path``)."""
        return _is_store_path(checkpoint_id)


def box_range(
    shape: Sequence[int], offsets: Sequence[int], lengths: Sequence[int], itemsize: int
) -> tuple[int, int, tuple[int, ...]]:
    """(first byte, end byte, element strides) of the box ``offsets``+``lengths`` inside a
    row-major tensor of ``shape``: the smallest contiguous range that holds the box. A box
    of whole rows is exactly its bytes; an empty box is (0, 0). Raises ValueError for a box
    outside the tensor."""
    if (
        len(offsets) != len(shape)
        or len(lengths) != len(shape)
        or any(o < 0 or n < 0 or o + n > s for o, n, s in zip(offsets, lengths, shape, strict=True))
    ):
        raise ValueError(f"box {tuple(offsets)}+{tuple(lengths)} outside {tuple(shape)}")
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    if any(n == 0 for n in lengths):
        return 0, 0, tuple(strides)
    first = sum(o * st for o, st in zip(offsets, strides, strict=True))
    last = sum((o + n - 1) * st for o, n, st in zip(offsets, lengths, strides, strict=True))
    return first * itemsize, (last + 1) * itemsize, tuple(strides)


def _dtype(item: StoredItem, path: str | None) -> torch.dtype:
    dtype = getattr(torch, item.dtype or "", None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointCorruptError(f"unknown dtype {item.dtype!r} in the metadata", path)
    return dtype


def _check(want: _Want, raw: torch.Tensor) -> None:
    """``raw`` (the bytes of ``want``) against the item's CRC32C, when it is the whole item
    (a box of it is covered by the store's chunk checksums)."""
    item = want.item
    whole = (want.start, want.stop) == (item.offset, item.offset + item.length)
    if whole and crc32c(_bytes_of(raw)) != item.crc32c:
        raise CheckpointCorruptError(
            f"{want.req.storage_index.fqn!r}: checksum mismatch", item.relative_path
        )


def _deliver(want: _Want, raw: torch.Tensor, planner: LoadPlanner) -> None:
    """Check ``raw`` (the bytes of ``want``) and hand it to the planner."""
    req, item = want.req, want.item
    _check(want, raw)
    if req.type == LoadItemType.BYTE_IO:
        planner.load_bytes(req, io.BytesIO(_bytes_of(raw).tobytes()))
        return
    dtype = _dtype(item, None)
    if raw.data_ptr() % dtype.itemsize:
        raw = raw.clone()  # a box that starts unaligned in its read: copy to view it
    src = raw.view(dtype).as_strided(tuple(req.lengths), want.strides)
    dest = planner.resolve_tensor(req).detach()
    if dest.shape != src.shape:
        raise InvalidArgumentError(
            f"{req.dest_index.fqn!r}: the state dict wants {tuple(dest.shape)}, the checkpoint "
            f"has {tuple(src.shape)}"
        )
    dest.copy_(src)
    planner.commit_tensor(req, dest)


__all__ = [
    "CheckpointCorruptError",
    "METADATA_NAME",
    "SCHEME",
    "StoredItem",
    "TectonicStorageReader",
    "TectonicStorageWriter",
    "box_range",
    "store_path",
]
