"""``OpenChunks``: chunk files a node keeps open for small ranged reads.

A 4 KiB ranged read cost more in opening the chunk file, reading its header and closing it
(and in the hop to an I/O thread) than in reading its two 8 KiB pieces. A node keeps the
last ``OpenChunks.LIMIT`` chunks it read ranges of open, with their checked headers and
their piece tables (4 KiB for an 8 MiB chunk): chunks are immutable, so a header and table
read once hold. A table read per request was a second disk read for every first read of a
chunk since the page cache was dropped. Used from the node's event loop thread alone, so an
entry is never closed under a read.

A file unlinked since it was opened (``st_nlink`` 0: deleted, or damaged by a test) is
opened again, so a deleted chunk reads as missing, as it would uncached. A file renamed over
keeps serving the chunk it was (its inode); its pieces are still checked against its own
table, so never wrong bytes.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tectonic_emu.chunkstore._chunkfile import _open_checked, _pread_exact
from tectonic_emu.chunkstore._format import HEADER_SIZE, ChunkHeader


@dataclass(frozen=True, slots=True)
class OpenChunk:
    fd: int
    header: ChunkHeader
    mtime: float
    table: bytes  # the packed piece checksums (version 3; empty before)


class OpenChunks:
    """Least recently used open chunk files, by (disk, chunk id)."""

    LIMIT = 256

    def __init__(self) -> None:
        self._files: OrderedDict[tuple[int, str], OpenChunk] = OrderedDict()

    def get(self, disk: int, chunk_id: str, path_of: Callable[[], str]) -> OpenChunk:
        """The open file of the chunk, opened at ``path_of()`` (and its header checked) if
        it is not open, or no longer has a name. Raises as ``_open_chunk`` and
        ``unpack_header``."""
        key = (disk, chunk_id)
        entry = self._files.get(key)
        if entry is not None:
            if os.fstat(entry.fd).st_nlink:
                self._files.move_to_end(key)
                return entry
            self.drop(disk, chunk_id)
        fd, st, header = _open_checked(path_of(), chunk_id, whole=False)
        table = b""
        if header.piece_size:
            try:
                count = len(header.pieces(0, header.payload_len))
                table = _pread_exact(fd, 4 * count, HEADER_SIZE, chunk_id)
            except BaseException:
                os.close(fd)
                raise
        entry = self._files[key] = OpenChunk(fd, header, st.st_mtime, table)
        while len(self._files) > self.LIMIT:
            _, old = self._files.popitem(last=False)
            os.close(old.fd)
        return entry

    def drop(self, disk: int, chunk_id: str) -> None:
        """Close the chunk's file, if open (it is being deleted, or failed a read)."""
        entry = self._files.pop((disk, chunk_id), None)
        if entry is not None:
            os.close(entry.fd)

    def close(self) -> None:
        while self._files:
            _, entry = self._files.popitem()
            os.close(entry.fd)


__all__ = ["OpenChunk", "OpenChunks"]
