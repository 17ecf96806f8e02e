"""An fsspec filesystem for tectonic-emu clusters: ``tectonic://`` URLs for pyarrow, pandas, dask
and torch DCP's ``FsspecWriter``/``FsspecReader``.

Registered through the ``fsspec.specs`` entry point, so ``fsspec.filesystem("tectonic",
cluster=DIR)`` and ``fsspec.open("tectonic:///data/x.parquet", cluster=DIR)`` find it. URLs:

    tectonic:///data/x.parquet                 the cluster comes from ``cluster=``
    tectonic://%2Ftmp%2Fc1/data/x.parquet      the cluster directory, percent-encoded, as host

The async core (``_ls``, ``_cat_file``, ``_pipe_file``...) runs on one event loop (fsspec's IO
thread, or the caller's loop with ``asynchronous=True``); the sync face is fsspec's wrapper over
that loop. The cluster is opened there on first use and kept open until ``close()``. Every error
is an ``OSError`` with an errno (``tectonic_emu.errors``): FileNotFoundError, FileExistsError,
IsADirectoryError, NotADirectoryError, PermissionError (a sealed file), OSError(ENOTEMPTY)...

Write semantics (docs/fsspec.md): ``"wb"``/``"xb"`` write a new version, nameless until
``close`` swaps it in atomically; ``"ab"`` is the store's single, append-only writer, visible
while it writes and sealed on close. Nothing can be written in place (``"r+b"``).

The file objects are in ``clients/fsspec_file.py`` (``TectonicFile``), the cluster's opening
and closing on the filesystem's loop in ``clients/fsspec_session.py``; this module has the
URLs and the filesystem, and re-exports ``TectonicFile``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import weakref
from collections import defaultdict
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from datetime import UTC, datetime
from glob import has_magic
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast
from urllib.parse import quote, unquote

import aiofiles  # type: ignore[import-untyped]
import aiofiles.os  # type: ignore[import-untyped]
from fsspec.asyn import (  # type: ignore[import-untyped]
    AsyncFileSystem,
    _run_coros_in_chunks,
    get_loop,
    sync,
)
from fsspec.callbacks import DEFAULT_CALLBACK, Callback  # type: ignore[import-untyped]

from clients.fsspec_file import Info, TectonicFile
from clients.fsspec_session import CLOSE_TIMEOUT as CLOSE_TIMEOUT
from clients.fsspec_session import Session, close_session
from tectonic_emu import Client, FileWriter, Stat, attrs
from tectonic_emu.chunkstore.base import BytesLike
from tectonic_emu.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    IsADirectoryError_,
    NotADirectoryError_,
    NotFoundError,
    first_error,
)
from tectonic_emu.localfile import atomic_output
from tectonic_emu.qos.groups import TrafficGroup

T = TypeVar("T")
P = ParamSpec("P")

PROTOCOL = "tectonic"
SCHEME = PROTOCOL + "://"
# Files in flight per batch operation (cp, put, get, rm, pipe/cat of many paths). A file being
# written holds up to Client.write_depth + 1 store blocks (5 x 48 MiB for rs-6-3).
DEFAULT_BATCH_SIZE = 8
LIST_STATS_IN_FLIGHT = 16  # stats per ls(detail=True)
TRANSFER_CHUNK = 16 << 20  # bytes per read of a copy or download

READ_MODES = ("rb",)
WRITE_MODES = ("wb", "xb", "ab")


# -- URLs ----------------------------------------------------------------------------------------
def split_url(url: str) -> tuple[str | None, str]:
    """(cluster directory named in the URL or None, store path) of a ``tectonic://`` URL or a
    bare path. Raises InvalidArgumentError for a host that is not a percent-encoded absolute
    directory (``tectonic://data/x`` is ambiguous: write ``tectonic:///data/x``)."""
    cluster = None
    if url.startswith(SCHEME):
        rest = url[len(SCHEME) :]
        if rest and not rest.startswith("/"):
            host, _, rest = rest.partition("/")
            cluster = unquote(host)
            if not cluster.startswith("/"):
                raise InvalidArgumentError(
                    f"{url!r}: the host of a tectonic URL is the cluster directory, "
                    "percent-encoded and absolute (tectonic://%2Ftmp%2Fc1/path); "
                    "for a path alone write tectonic:///path",
                )
        url = rest
    return cluster, "/" + "/".join(p for p in url.split("/") if p)


def cluster_url(cluster_dir: str, path: str = "/") -> str:
    """The URL naming ``path`` in the cluster at ``cluster_dir`` (an absolute directory)."""
    return SCHEME + quote(cluster_dir, safe="") + split_url(path)[1]


def _join(parent: str, name: str) -> str:
    return parent.rstrip("/") + "/" + name


# fsspec's names of the kinds (its SFTP filesystem's "link"; LocalFileSystem's "other").
_TYPES = {"file": "file", "dir": "directory", "symlink": "link"}


def _info_of(st: Stat) -> Info:
    """fsspec's info of ``st``: LocalFileSystem's fields (``mode`` with the type bits, as
    lstat's st_mode; ``islink``, and a symlink's ``destination``), never following a
    symlink, and the store's own (``encoding``, ``sealed``, the version ``id``)."""
    info: Info = {
        "name": st.path,
        "size": st.size,
        "type": _TYPES.get(st.kind, "other"),
        "mode": attrs.st_mode(st.kind, st.mode),
        "uid": st.uid,
        "gid": st.gid,
        "nlink": st.nlink,
        "mtime": st.mtime,
        "atime": st.atime,
        "ctime": st.ctime,
        "created": st.ctime,
        "islink": st.kind == "symlink",
        "encoding": st.encoding,
        "sealed": st.sealed,
        "id": st.id,
    }
    if st.target is not None:
        info["destination"] = st.target
    return info


def _regular(st: Stat) -> Stat:
    """``st``, if it is a regular file's: IsADirectoryError for a directory, the store's
    InvalidArgumentError for a symlink (never followed), a fifo, a device or a socket."""
    if st.kind == "dir":
        raise IsADirectoryError_("is a directory", st.path)
    if st.kind != "file":
        raise InvalidArgumentError(f"not a regular file (a {st.kind})", st.path)
    return st


def _outermost(paths: list[str]) -> list[str]:
    """The paths not inside another of them."""
    chosen = set(paths)
    out = []
    for p in sorted(chosen):
        parent = posixpath.dirname(p)
        while parent not in chosen and parent != "/":
            parent = posixpath.dirname(parent)
        if p == "/" or parent not in chosen:
            out.append(p)
    return out


async def _stream_into(
    writer: FileWriter,
    pieces: AsyncGenerator[BytesLike, None],
    callback: Callback = DEFAULT_CALLBACK,
) -> None:
    """Append every piece, then close (seal, or publish a new version). On any error or
    cancellation the writer is aborted: a new version leaves nothing behind."""
    try:
        async with aclosing(pieces):
            async for piece in pieces:
                await writer.append(piece)
                callback.relative_update(len(piece))
        await writer.close()
    except BaseException:
        await asyncio.shield(writer.abort())
        raise


# -- the filesystem ------------------------------------------------------------------------------
class TectonicFileSystem(AsyncFileSystem):  # type: ignore[misc]  # fsspec ships no type hints
    """fsspec filesystem over a tectonic-emu cluster (protocol ``tectonic``).

    ``cluster``: the cluster directory (``Cluster.create``); it may come from the URL instead.
    ``auto_mkdir``: writes create missing parent directories (as object stores behave).
    ``batch_size``: files in flight in batch operations. ``group``: the TrafficGroup of its
    requests to served nodes, as ``TrafficGroup`` or ``"NAME[:CLASS[:SHARE[:RATE]]]"``
    (docs/qos.md; None: the process's). ``asynchronous``/``loop``: fsspec's.
    Instances are cached by fsspec per arguments and pickle by those arguments; a copy in
    another process (or a forked child) opens the cluster itself on first use.
    """

    protocol = PROTOCOL
    root_marker = "/"
    _pid: int
    _loop: Any

    def __init__(
        self,
        cluster: str | os.PathLike[str] | None = None,
        *,
        auto_mkdir: bool = True,
        batch_size: int | None = None,
        group: str | TrafficGroup | None = None,
        asynchronous: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        **storage_options: Any,
    ) -> None:
        if cluster is None:
            raise InvalidArgumentError(
                "no cluster: pass cluster=DIR, or name it in the URL "
                "(tectonic://<percent-encoded absolute dir>/path)"
            )
        super().__init__(
            asynchronous=asynchronous,
            loop=loop,
            batch_size=batch_size or DEFAULT_BATCH_SIZE,
            **storage_options,
        )
        self.cluster_dir = os.path.abspath(os.fspath(cluster))
        self.auto_mkdir = auto_mkdir
        if isinstance(group, str):
            group = TrafficGroup.parse(group)
        self.group = group
        self._session = Session(self.cluster_dir, group)
        weakref.finalize(self, close_session, self._session)

    # -- URLs, loop and lifecycle --------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return split_url(os.fspath(path))[1]

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        cluster, _ = split_url(path)
        return {} if cluster is None else {"cluster": cluster}

    def unstrip_protocol(self, name: str) -> str:
        """A URL naming ``name`` together with this filesystem's cluster."""
        return cluster_url(self.cluster_dir, name)

    @property
    def loop(self) -> Any:
        if self._pid != os.getpid():
            # Forked: fsspec's IO thread did not survive the fork; get_loop starts the child's.
            self._pid = os.getpid()
            if not self.asynchronous:
                self._loop = get_loop()
        return self._loop

    def _run(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the filesystem's loop and wait (the sync face)."""
        return cast(T, sync(self.loop, fn, *args, **kwargs))

    async def _client(self) -> Client:
        return await self._session.client()

    async def _close(self) -> None:
        """Close the cluster. The filesystem stays usable: the next call reopens it."""
        await self._session.close()

    def close(self) -> None:
        """Close the cluster (sync filesystems; use ``await fs._close()`` with
        ``asynchronous=True``). The filesystem stays usable: the next call reopens it."""
        if self._session.is_open:
            self._run(self._close)

    async def _with_parents(self, path: str, op: Callable[[], Awaitable[T]]) -> T:
        """``op()``, which writes at ``path``; with ``auto_mkdir``, a missing parent directory
        is created and ``op`` retried once."""
        try:
            return await op()
        except NotFoundError:
            if not self.auto_mkdir:
                raise
        client = await self._client()
        await client.mkdir(self._parent(path), parents=True, exist_ok=True)
        return await op()

    # -- names ---------------------------------------------------------------------------------
    async def _stat(self, path: str) -> Stat:
        client = await self._client()
        return await client.stat(self._strip_protocol(path))

    async def _info(self, path: str, **kwargs: Any) -> Info:
        return _info_of(await self._stat(path))

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        try:
            await self._info(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Info] | list[str]:
        path = self._strip_protocol(path)
        client = await self._client()
        try:
            entries = await client.scandir(path)
        except NotADirectoryError_:
            info = await self._info(path)  # a file lists as itself (fsspec's convention)
            return [info] if detail else [info["name"]]
        names = [_join(path, e.name) for e in entries]
        return await self._stat_all(client, names) if detail else names

    async def _stat_all(self, client: Client, paths: list[str]) -> list[Info]:
        """Infos of ``paths`` (a few at a time), leaving out those deleted meanwhile."""
        slots = asyncio.Semaphore(LIST_STATS_IN_FLIGHT)
        found: list[Info | None] = [None] * len(paths)

        async def one(i: int, p: str) -> None:
            async with slots:
                with contextlib.suppress(FileNotFoundError):
                    found[i] = _info_of(await client.stat(p))

        try:
            async with asyncio.TaskGroup() as tg:
                for i, p in enumerate(paths):
                    tg.create_task(one(i, p))
        except BaseExceptionGroup as eg:
            raise first_error(eg) from None
        return [info for info in found if info is not None]

    async def _mkdir(
        self, path: str, create_parents: bool = True, encoding: str | None = None, **kwargs: Any
    ) -> None:
        """Create a directory; FileExistsError if ``path`` exists. ``encoding`` (``"r3"``,
        ``"rs-6-3"``...) is what files created below it inherit."""
        path = self._strip_protocol(path)
        client = await self._client()
        if create_parents and self._parent(path) != "/":
            await client.mkdir(self._parent(path), parents=True, exist_ok=True)
        await client.mkdir(path, encoding=encoding)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        if not exist_ok:
            return await self._mkdir(path, create_parents=True)
        client = await self._client()
        await client.mkdir(self._strip_protocol(path), parents=True, exist_ok=True)

    async def _rmdir(self, path: str) -> None:
        """Remove an empty directory. Raises NotADirectoryError, OSError(ENOTEMPTY)."""
        path = self._strip_protocol(path)
        client = await self._client()
        if (await client.stat(path)).kind != "dir":
            raise NotADirectoryError_("not a directory", path)
        await client.delete(path)

    def rmdir(self, path: str) -> None:
        self._run(self._rmdir, path)

    async def _rm_one(self, path: str, dirs: bool) -> None:
        """Delete a file, or with ``dirs`` an empty directory."""
        client = await self._client()
        if (await client.stat(path)).kind == "dir" and not dirs:
            raise IsADirectoryError_("is a directory (rm it with recursive=True)", path)
        await client.delete(path)

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        await self._rm_one(self._strip_protocol(path), dirs=False)

    async def _rm(
        self,
        path: str | list[str],
        recursive: bool = False,
        batch_size: int | None = None,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Delete files, and with ``recursive`` directories. A whole tree goes in one metadata
        transaction; with ``maxdepth``, deepest paths first, and a directory left non-empty
        raises OSError(ENOTEMPTY)."""
        paths = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        batch = batch_size or self.batch_size
        client = await self._client()
        if recursive and maxdepth is None:
            roots = _outermost(paths)
            if roots == ["/"]:  # the root itself stays
                roots = [_join("/", name) for name in await client.listdir("/")]
            coros = [client.delete(p, recursive=True) for p in roots]
            await _run_coros_in_chunks(coros, batch_size=batch, nofiles=True)
            return
        by_depth: dict[int, list[str]] = defaultdict(list)
        for p in paths:
            if p != "/":
                by_depth[p.count("/")].append(p)
        for depth in sorted(by_depth, reverse=True):
            coros = [self._rm_one(p, dirs=recursive) for p in by_depth[depth]]
            await _run_coros_in_chunks(coros, batch_size=batch, nofiles=True)

    async def _mv(
        self,
        path1: str | list[str],
        path2: str | list[str],
        recursive: bool = False,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Move one file or directory with one atomic rename (into ``path2`` when it is an
        existing directory, as mv(1) does). Lists, globs and ``maxdepth`` copy then delete."""
        if (
            not isinstance(path1, str)
            or not isinstance(path2, str)
            or has_magic(path1)
            or maxdepth is not None
        ):
            await self._copy(path1, path2, recursive=recursive, maxdepth=maxdepth, on_error="raise")
            await self._rm(path1, recursive=recursive)
            return
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if src == dst:
            return
        if path2.endswith("/") or await self._isdir(dst):
            dst = _join(dst, posixpath.basename(src))
        client = await self._client()
        await self._with_parents(dst, lambda: client.rename(src, dst))

    def mv(
        self,
        path1: str | list[str],
        path2: str | list[str],
        recursive: bool = False,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        self._run(self._mv, path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    async def _mv_file(self, path1: str, path2: str) -> None:
        await self._mv(path1, path2)

    def modified(self, path: str) -> datetime:
        return datetime.fromtimestamp(self.info(path)["mtime"], tz=UTC)

    def created(self, path: str) -> datetime:
        return datetime.fromtimestamp(self.info(path)["created"], tz=UTC)

    # -- links and times -----------------------------------------------------------------------
    async def _symlink(self, target: str, path: str) -> None:
        """Make ``path`` a symbolic link holding ``target``, kept as given (nothing here
        follows it; a mount's kernel reads it relative to the link's directory). Raises
        FileExistsError, InvalidArgumentError (an empty target)."""
        path = self._strip_protocol(path)
        client = await self._client()
        await self._with_parents(path, lambda: client.symlink(target, path))

    def symlink(self, target: str, path: str) -> None:
        """LocalFileSystem's ``symlink(src, dst)``: ``path`` becomes a link to ``target``."""
        self._run(self._symlink, target, path)

    async def _link(self, src: str, dst: str) -> None:
        """Give the file at ``src`` a second name ``dst`` (a hard link: its ``nlink``
        counts both). Raises FileNotFoundError, FileExistsError, PermissionError (a
        directory)."""
        src, dst = self._strip_protocol(src), self._strip_protocol(dst)
        client = await self._client()
        await client.stat(src)  # a missing src makes no parents of dst
        await self._with_parents(dst, lambda: client.link(src, dst))

    def link(self, src: str, dst: str) -> None:
        self._run(self._link, src, dst)

    async def _islink(self, path: str) -> bool:
        try:
            return (await self._stat(path)).kind == "symlink"
        except (FileNotFoundError, NotADirectoryError):
            return False

    def islink(self, path: str) -> bool:
        return self._run(self._islink, path)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        """Create an empty file (with ``truncate``, replace one by an empty version); with
        ``truncate=False``, an existing path's atime and mtime become now instead."""
        if truncate or not self.exists(path):
            super().touch(path, truncate=truncate, **kwargs)
            return
        self._run(self._touch_times, self._strip_protocol(path))

    async def _touch_times(self, path: str) -> None:
        client = await self._client()
        await client.utime(path)

    # -- bytes ---------------------------------------------------------------------------------
    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        path = self._strip_protocol(path)
        client = await self._client()
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = (await client.stat(path)).size
            start = max(0, size + start) if start is not None and start < 0 else start
            end = max(0, size + end) if end is not None and end < 0 else end
        start = start or 0
        return await client.read(path, start, -1 if end is None else max(0, end - start))

    async def _pipe_file(
        self, path: str, value: BytesLike, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        """Store ``value`` at ``path`` atomically (``mode="create"``: FileExistsError if a file
        is there when the write starts)."""
        writer, _ = await self._open_writer(path, _write_mode(mode))
        await _stream_into(writer, _one(value))

    async def _read_pieces(self, file_id: int, size: int) -> AsyncGenerator[memoryview, None]:
        """The first ``size`` bytes of file ``file_id``, a chunk at a time, in one reused
        buffer: use each piece before asking for the next."""
        client = await self._client()
        reader = await client.reader_id(file_id)  # its block map looked up once
        buf = memoryview(bytearray(min(TRANSFER_CHUNK, max(size, 1))))
        offset = 0
        while offset < size:
            n = await reader.read_into(offset, buf[: size - offset])
            if n == 0:
                return
            yield buf[:n]
            offset += n

    async def _read_version(self, file_id: int, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file version ``file_id`` (short at its end)."""
        client = await self._client()
        buf = bytearray(max(0, end - start))
        n = await client.read_id_into(file_id, start, buf)
        return bytes(memoryview(buf)[:n])

    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy inside the store (read, then write a new version; the copy inherits the
        encoding of its directory). A directory is created at ``path2``."""
        client = await self._client()
        st = await client.stat(self._strip_protocol(path1))
        if st.kind == "dir":
            return await self._makedirs(path2, exist_ok=True)
        _regular(st)
        writer, _ = await self._open_writer(path2, "wb")
        await _stream_into(writer, self._read_pieces(st.id, st.size))

    async def _put_file(
        self,
        lpath: str,
        rpath: str,
        callback: Callback = DEFAULT_CALLBACK,
        mode: str = "overwrite",
        **kwargs: Any,
    ) -> None:
        if await aiofiles.os.path.isdir(lpath):
            return await self._makedirs(rpath, exist_ok=True)
        writer, _ = await self._open_writer(rpath, _write_mode(mode))

        async def pieces() -> AsyncGenerator[bytes, None]:
            async with aiofiles.open(lpath, "rb") as f:
                callback.set_size(os.fstat(f.fileno()).st_size)
                while piece := await f.read(TRANSFER_CHUNK):
                    yield piece

        await _stream_into(writer, pieces(), callback)

    async def _get_file(
        self, rpath: str, lpath: str, callback: Callback = DEFAULT_CALLBACK, **kwargs: Any
    ) -> None:
        client = await self._client()
        st = await client.stat(self._strip_protocol(rpath))
        if st.kind == "dir":
            await aiofiles.os.makedirs(lpath, exist_ok=True)
            return
        callback.set_size(_regular(st).size)
        # A private temporary file beside lpath replaces it once complete; a symlink or a
        # special file at lpath is refused, never written through (localfile.py).
        output = atomic_output(Path(lpath))
        f = await asyncio.to_thread(output.__enter__)
        try:
            async with aclosing(self._read_pieces(st.id, st.size)) as pieces:
                async for piece in pieces:
                    await asyncio.to_thread(f.write, piece)
                    callback.relative_update(len(piece))
        except BaseException as exc:
            await asyncio.to_thread(output.__exit__, type(exc), exc, exc.__traceback__)
            raise
        await asyncio.to_thread(output.__exit__, None, None, None)

    # -- file objects --------------------------------------------------------------------------
    async def _open_writer(self, path: str, mode: str) -> tuple[FileWriter, int]:
        """A writer for ``path`` in ``mode`` and the store block size of its file."""
        path = self._strip_protocol(path)
        client = await self._client()
        if mode == "xb" and await self._exists(path):
            raise AlreadyExistsError("file exists", path)
        if mode == "ab":
            writer = await self._with_parents(path, lambda: client.open_writer(path))
        else:
            writer = await self._with_parents(path, lambda: client.new_version(path))
        return writer, client.config.block_size_for(writer.encoding)

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        cache_type: str = "readahead",
        **kwargs: Any,
    ) -> TectonicFile:
        if self.asynchronous:
            raise InvalidArgumentError(
                "open() needs a synchronous filesystem; with asynchronous=True use "
                "_cat_file/_pipe_file/_put_file/_get_file"
            )
        if mode not in READ_MODES + WRITE_MODES:
            raise InvalidArgumentError(
                f"mode {mode!r} is not supported: files are append-only and immutable once "
                "sealed, so nothing is written in place; use 'rb', 'wb', 'xb' or 'ab'"
            )
        if mode == "ab" and not autocommit:
            raise InvalidArgumentError("'ab' bytes are visible as they land: no transactions")
        path = self._strip_protocol(path)
        kwargs.pop("size", None)  # fsspec's reopen passes it; the size is the version's own
        options = {"cache_type": cache_type, "cache_options": cache_options, **kwargs}
        if mode == "rb":
            details = _info_of(_regular(self._run(self._stat, path)))
            return TectonicFile(
                self, path, mode, block_size, autocommit, details=details, **options
            )
        writer, store_block = self._run(self._open_writer, path, mode)
        return TectonicFile(
            self, path, mode, block_size or store_block, autocommit, writer=writer, **options
        )


def _write_mode(mode: str) -> str:
    if mode not in ("overwrite", "create"):
        raise InvalidArgumentError(f"mode must be 'overwrite' or 'create', not {mode!r}")
    return "xb" if mode == "create" else "wb"


async def _one(value: BytesLike) -> AsyncGenerator[BytesLike, None]:
    yield value


__all__ = ["TectonicFile", "TectonicFileSystem", "cluster_url", "split_url"]
