"""``WriteHandle``: a file open for writing on the mount, streamed, rewritten after
O_TRUNC, or staged (``docs/fuse.md``, *How POSIX writes meet append-only files*)."""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any, Protocol

from fuse_mount.sparse import staged_regions
from tectonic_emu import clock
from tectonic_emu.bridge import Bridge
from tectonic_emu.writer import FileWriter, Replaced, VersionWriter

# Bytes copied per step between a staging file and the store.
COPY_STEP = 8 << 20


class Host(Protocol):
    """What a write handle asks of its mount (``TectonicFS``)."""

    bridge: Bridge
    encoding: str | None  # of new contents (None: the file's own)
    staging_dir: str | None

    def replaced(self, file_id: int, old: Replaced | None) -> None: ...


class WriteHandle:
    """A file opened for writing (see the module docstring for the three ways it writes)."""

    def __init__(
        self,
        fs: Host,
        file_id: int,
        path: str,
        *,
        writer: FileWriter | None,
        size: int,
        base_exists: bool,
    ) -> None:
        self.fs = fs
        # It writes the file ``file_id`` wherever it is named (renamed, or unlinked and kept
        # while open); ``path``, where it was opened, only names it in errors.
        self.file_id = file_id
        self.path = path
        self.writer = writer  # streaming (append-only) while not None
        self.size = size  # the file's size as this handle's writer sees it
        self.base_exists = base_exists  # staging must start from the stored file
        self.staging: Any = None  # a temporary file once random writes happened
        # Streamed bytes not yet handed to the writer: one call into the event loop per
        # block, not per 1 MiB FUSE write, and the block goes out without another copy.
        self.pending = bytearray()
        self.block = fs.bridge.client.config.block_size_for(writer.encoding) if writer else 0
        self.dirty = False  # staging content not yet published
        # When this handle last wrote or truncated: the file's mtime and ctime until its
        # bytes are published (a write moves them at once, as POSIX has it).
        self.changed: float | None = None
        self.visible = size  # bytes a new reader sees (streaming: flushed so far)
        self.privileged = False  # setuid or setgid when opened: a user's write clears them
        # Descriptors open on it: every writer of a file here shares one handle (one view
        # of its bytes, published at each close), released with the last.
        self.opens = 1
        self.lock = threading.Lock()
        # A file just created here: its attributes, read in the same call into the event
        # loop, for the getattr libfuse makes inside the create (``TectonicFS._stat_open``).
        self.created: Any = None

    # -- streaming ---------------------------------------------------------------------------
    def _hand_over(self) -> None:
        """Give the pending bytes to the writer (which encodes whole blocks in place)."""
        if self.pending and self.writer is not None:
            pending, self.pending = self.pending, bytearray()
            self.fs.bridge.call(self.writer.append(pending, owned=True))

    def _to_staging(self) -> None:
        """Move to a staging file holding the whole current content."""
        if self.staging is not None:
            return
        b = self.fs.bridge
        # Lives as long as the handle (closed in release), so no ``with``.
        staging = tempfile.TemporaryFile(dir=self.fs.staging_dir)  # noqa: SIM115
        try:
            if self.writer is not None:
                self._hand_over()
                b.call(self.writer.flush())
                b.call(self._copy_out(self.writer.file_id, self.size, staging))
                b.call(self.writer.abort())
                self.writer = None
            elif self.base_exists:
                st = b.call(b.client.stat_id(self.file_id))
                b.call(self._copy_out(self.file_id, st.size, staging))
                self.size = st.size
            self.staging = staging
        except BaseException:
            staging.close()
            raise

    async def _copy_out(self, file_id: int, size: int, staging: Any) -> None:
        """The first ``size`` bytes of stored file ``file_id`` into ``staging``: its data
        regions written, its holes left as holes of the (sparse) staging file, never read or
        written."""
        reader = await self.fs.bridge.client.reader_id(file_id)
        buf = bytearray(min(COPY_STEP, max(size, 1)))
        for start, end in reader.data_ranges():
            for off in range(start, min(end, size), COPY_STEP):
                view = memoryview(buf)[: min(COPY_STEP, min(end, size) - off)]
                got = await reader.read_into(off, view)
                os.pwrite(staging.fileno(), view[:got], off)
        os.ftruncate(staging.fileno(), size)  # a hole at the end, too

    def write(self, data: bytes, offset: int) -> int:
        with self.lock:
            self.changed = clock.wall()
            if self.staging is None and self.writer is not None and offset == self.size:
                self.pending += data
                self.size += len(data)
                if len(self.pending) >= self.block:
                    self._hand_over()
                return len(data)
            self._to_staging()
            os.pwrite(self.staging.fileno(), data, offset)
            self.size = max(self.size, offset + len(data))
            self.dirty = True
            return len(data)

    def truncate(self, length: int) -> None:
        """Set the size to ``length``: growing appends a hole (nothing written), shrinking
        stages the file. Raises FileTooLargeError (EFBIG) past the store's largest size."""
        with self.lock:
            self.changed = clock.wall()
            if self.staging is None and self.writer is None and length > self.size:
                # An existing file grown without a handle that wrote: a new version holding
                # its content (holes as holes), then the hole, streamed like any other.
                self.writer = self.fs.bridge.call(self._restream(self.size))
                self.base_exists = False
            if self.staging is None and self.writer is not None:
                if length == self.size:
                    return
                if length > self.size:
                    self._hand_over()
                    self.fs.bridge.call(self.writer.append_hole(length - self.size))
                    self.size = length
                    return
            self._to_staging()
            os.ftruncate(self.staging.fileno(), length)
            self.size = length
            self.dirty = True

    async def _restream(self, size: int) -> VersionWriter:
        """New contents of the file holding its first ``size`` bytes: data copied, holes
        appended as holes (nothing of them read or written). Runs on the event loop."""
        client = self.fs.bridge.client
        reader = await client.reader_id(self.file_id)
        writer = await self.new_contents()
        try:
            at = 0
            for start, end in reader.data_ranges():
                if start >= size:  # the stored file grew since this handle looked
                    break
                end = min(end, size)
                if start > at:
                    await writer.append_hole(start - at)
                for off in range(start, end, COPY_STEP):
                    buf = bytearray(min(COPY_STEP, end - off))
                    got = await reader.read_into(off, buf)
                    await writer.append(memoryview(buf)[:got], owned=True)
                at = max(at, end)
            if size > at:
                await writer.append_hole(size - at)
        except BaseException:
            await writer.abort()
            raise
        return writer

    @property
    def stored(self) -> int:
        """Bytes of this handle's view of the file that take room (not holes)."""
        if self.staging is not None:
            return os.fstat(self.staging.fileno()).st_blocks * 512
        if self.writer is not None:
            return max(0, self.size - self.writer.holes)
        return self.size

    def read(self, size: int, offset: int) -> bytes:
        with self.lock:
            if self.staging is not None:
                return os.pread(self.staging.fileno(), size, offset)
            if self.writer is not None:  # read back what this handle streamed so far
                self._hand_over()
                self.fs.bridge.call(self.writer.flush())
                end = min(self.size, offset + size)
                if end <= offset:
                    return b""
                buf = bytearray(end - offset)
                n = self.fs.bridge.call(
                    self.fs.bridge.client.read_id_into(self.writer.file_id, offset, buf)
                )
                return bytes(buf[:n])
            buf = bytearray(max(0, size))
            n = self.fs.bridge.call(self.fs.bridge.client.read_id_into(self.file_id, offset, buf))
            return bytes(buf[:n])

    # -- making it visible ---------------------------------------------------------------------
    @property
    def unpublished(self) -> bool:
        """Whether its view of the file differs from the stored one until ``flush``."""
        return (self.staging is not None and self.dirty) or isinstance(self.writer, VersionWriter)

    def share(self) -> bool:
        """A reader opens the file: make the bytes streamed so far visible (committed);
        whether there were any. A rewrite (staged, or after O_TRUNC) stays unseen until its
        ``flush``, as it must land whole."""
        with self.lock:
            if self.staging is not None or isinstance(self.writer, VersionWriter):
                return False
            if self.writer is None or self.visible == self.size:
                return False
            self._hand_over()
            self.fs.bridge.call(self.writer.flush())
            self.visible = self.size
            return True

    def flush(self) -> None:
        """Every ``close``: what was written is durable and visible at the path, its times
        the stored ones from then on."""
        with self.lock:
            self._flush()
            self.changed = None

    def _flush(self) -> None:
        """(``flush``, lock held)."""
        b = self.fs.bridge
        if self.staging is not None:
            if self.dirty:
                self.fs.replaced(self.file_id, b.call(self._publish_staging()))
                self.dirty = False
            return
        if self.writer is None:
            return
        self._hand_over()
        if isinstance(self.writer, VersionWriter):  # O_TRUNC: the new contents move in
            b.call(self.writer.close())
            self.fs.replaced(self.file_id, self.writer.replaced)
            self.writer = None
            self.base_exists = True  # later writes (rare) restage from the stored file
        elif self.visible != self.size:  # else nothing since the last flush to make so
            b.call(self.writer.flush())
            self.visible = self.size

    async def new_contents(self) -> VersionWriter:
        """A writer of the file's new contents, the replaced ones kept for the readers open
        here (``TectonicFS.replaced`` sorts out who holds them). Runs on the event loop."""
        writer = await self.fs.bridge.client.new_contents(
            self.file_id, path=self.path, encoding=self.fs.encoding
        )
        writer.keep_replaced = True
        return writer

    async def _publish_staging(self) -> Replaced | None:
        """Runs on the event loop: never call back into the bridge from here."""
        writer = await self.new_contents()
        try:
            fd = self.staging.fileno()
            for start, end, data in staged_regions(fd, self.size):
                if not data:
                    await writer.append_hole(end - start)
                    continue
                for off in range(start, end, COPY_STEP):
                    await writer.append(os.pread(fd, min(COPY_STEP, end - off), off))
            await writer.close()
        except BaseException:
            await writer.abort()
            raise
        return writer.replaced

    def release(self) -> None:
        try:
            self.flush()
            with self.lock:
                if self.writer is not None:  # a new file streamed in place: seal it
                    self.fs.bridge.call(self.writer.close())
                    self.writer = None
        finally:
            if self.staging is not None:
                self.staging.close()
                self.staging = None


__all__ = ["COPY_STEP", "Host", "WriteHandle"]
