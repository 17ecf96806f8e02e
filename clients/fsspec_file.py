"""The file objects of a ``TectonicFileSystem``: ``TectonicFile``, opened by its ``open``.

A file reads through, and writes to, the filesystem's event loop (``LoopRunner``: the
filesystem's sync face), so that ``clients/fsspec.py`` stays above this module.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, Protocol, TypeVar

from fsspec.spec import AbstractBufferedFile  # type: ignore[import-untyped]

from tectonic_emu import FileWriter
from tectonic_emu.chunkstore.base import BytesLike

T = TypeVar("T")
P = ParamSpec("P")
Info = dict[str, Any]  # what a filesystem's info() says of a path


class LoopRunner(Protocol):
    """What a file needs of its filesystem: to run a coroutine function on its loop and wait,
    and to read a range of one version of a file."""

    def _run(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T: ...

    async def _read_version(self, file_id: int, start: int, end: int) -> bytes: ...


class TectonicFile(AbstractBufferedFile):  # type: ignore[misc]  # fsspec ships no type hints
    """A file opened through ``TectonicFileSystem.open``.

    ``"rb"``: the version of the file that was there at open; reads are ranged reads of it
    (readahead cache). Once that version is replaced or deleted, an uncached read raises
    FileNotFoundError: never bytes of another version.
    ``"wb"``/``"xb"``: a new version, nameless until ``close`` publishes it atomically; an
    exception inside ``with`` (or ``discard``) drops it.
    ``"ab"``: the file's single writer; bytes become visible as store blocks commit, all of
    them at ``flush()``; ``close`` seals the file.
    """

    fs: LoopRunner
    buffer: io.BytesIO
    forced: bool
    loc: int

    def __init__(
        self,
        fs: LoopRunner,
        path: str,
        mode: str,
        block_size: int | None,
        autocommit: bool,
        *,
        details: Info | None = None,
        writer: FileWriter | None = None,
        **kwargs: Any,
    ) -> None:
        self._file_id = details["id"] if details is not None else 0
        self._writer = writer
        size = details["size"] if details is not None else None
        super().__init__(fs, path, mode, block_size, autocommit, size=size, **kwargs)
        if details is not None:
            self._details = details
        if writer is not None:
            self.loc = writer.offset  # "ab": tell() is the offset in the file

    @property
    def _w(self) -> FileWriter:
        assert self._writer is not None, "write modes have a writer"
        return self._writer

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs._run(self.fs._read_version, self._file_id, start, end)

    def write(self, data: BytesLike) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if not self.writable():
            raise ValueError("File not in write mode")
        if self.forced:
            raise ValueError("This file has been force-flushed, can only close")
        n: int = self.buffer.write(data)
        self.loc += n
        if self.buffer.tell() >= self.blocksize:
            self._ship()
        return n

    def _ship(self) -> None:
        """Hand the buffered bytes to the store's writer (full blocks go out at once)."""
        data = self.buffer.getvalue()
        self.buffer = io.BytesIO()
        if data:
            self.fs._run(self._w.append, data)

    def flush(self, force: bool = False) -> None:
        """``force`` (on close): write everything and, with autocommit, publish or seal.
        Otherwise, in ``"ab"``, make every byte written so far durable and visible."""
        if self.closed:
            raise ValueError("Flush on closed file")
        if self.readable():
            return
        if force:
            if self.forced:
                raise ValueError("Force flush cannot be called more than once")
            self.forced = True
            self._ship()
            if self.autocommit:
                self.commit()
        elif self.mode == "ab":
            self._ship()
            self.fs._run(self._w.flush)

    def commit(self) -> None:
        """Publish the new version (``"wb"``/``"xb"``) or seal the file (``"ab"``)."""
        self.fs._run(self._w.close)

    def discard(self) -> None:
        """Drop the new version; in ``"ab"``, drop the bytes not yet flushed."""
        self.fs._run(self._w.abort)

    def __del__(self) -> None:
        # At interpreter exit fsspec's IO thread is gone and waiting for it would hang: the
        # file is left as a crash leaves it (a new version is dropped, "ab" keeps its flushes).
        if not sys.is_finalizing():
            super().__del__()

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None and self.writable():
            self.closed = True
            with contextlib.suppress(Exception):  # the caller's exception is the one to see
                self.discard()
            return
        self.close()


__all__ = ["Info", "LoopRunner", "TectonicFile"]
