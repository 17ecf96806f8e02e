"""The codec seam: a block in, ``width`` chunks out, and back.

A codec is stateless apart from read-only tables, so one instance per encoding serves every
thread at once (``codec_for`` in ``codec.py`` caches them). Chunks are opaque bytes to storage;
a chunk's length is a function of the block length alone (``chunk_sizes``), which lets
``decode`` reject a chunk of the wrong length instead of returning wrong bytes.

The concrete codecs (``replication.py``, ``reed_solomon.py``) subclass ``Codec`` from here;
``codec.py`` sits above them all and picks one per encoding.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

from tectonic_emu.buffers import BytesLike
from tectonic_emu.coding.encoding import Encoding
from tectonic_emu.coding.synthetic import Payload, Synthetic
from tectonic_emu.errors import DataUnavailableError, InvalidArgumentError


class Codec(abc.ABC):
    """Turns a block into ``encoding.width`` chunks (chunk ``i`` for the ``i``-th node of the
    block's placement) and back.

    Chunks returned by ``encode`` may alias the block (replicas, RS data chunks): keep the
    block unchanged until the chunks are written.
    """

    encoding: Encoding

    def __init__(self, encoding: Encoding) -> None:
        self.encoding = encoding

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.encoding.name!r})"

    @abc.abstractmethod
    def chunk_sizes(self, block_len: int) -> list[int]:
        """The length of each chunk ``encode`` makes from a block of ``block_len`` bytes."""

    @abc.abstractmethod
    def encode(
        self, block: Payload, *, parity_out: Sequence[BytesLike] | None = None
    ) -> list[Payload]:
        """Split ``block`` into ``encoding.width`` chunks (a ``Synthetic`` block into
        ``Synthetic`` chunks).

        ``parity_out``: optional writable buffers (``encoding.parity`` of them, each at least
        ``chunk_sizes(len(block))[-1]`` bytes) to compute RS parity into, e.g. from a pool of
        warm buffers; the parity chunks returned are then views of them. Ignored by
        replication, whose extra chunks are the block itself.
        """

    @abc.abstractmethod
    def decode(
        self,
        chunks: Mapping[int, Payload],
        block_len: int,
        *,
        out: BytesLike | None = None,
    ) -> Payload:
        """The ``block_len`` bytes of the block, from any ``min_chunks`` good chunks.

        Chunks whose length is not what ``encode`` made are ignored. ``out``: optional
        writable buffer of at least ``block_len`` bytes to decode into; the result is then a
        view of it. Synthetic chunks decode to a ``Synthetic`` (``out`` must then be None).
        Raises ``DataUnavailableError`` if too few good chunks remain.
        """

    @abc.abstractmethod
    def reconstruct(
        self, chunks: Mapping[int, Payload], missing: Sequence[int], block_len: int
    ) -> dict[int, Payload]:
        """Rebuild the chunks at ``missing`` from the good ones in ``chunks``, byte-identical
        to what ``encode`` made (so their CRCs match). Chunks at ``missing`` indexes found in
        ``chunks`` are not trusted. Raises ``DataUnavailableError`` if too few remain."""

    # -- shared checks -----------------------------------------------------------------------
    def _good_chunks(
        self,
        chunks: Mapping[int, Payload],
        block_len: int,
        exclude: Sequence[int] = (),
    ) -> tuple[list[int], dict[int, memoryview | Synthetic]]:
        """Chunk sizes and the usable chunks as byte views (synthetic ones as they are);
        raises if fewer than min_chunks."""
        if block_len < 0:
            raise InvalidArgumentError(f"negative block length {block_len}")
        sizes = self.chunk_sizes(block_len)
        good: dict[int, memoryview | Synthetic] = {}
        wrong: list[str] = []
        for index, chunk in chunks.items():
            self._check_index(index)
            if index in exclude:
                continue
            view = chunk if isinstance(chunk, Synthetic) else byte_view(chunk)
            if len(view) == sizes[index]:
                good[index] = view
            else:
                wrong.append(f"chunk {index} has {len(view)} bytes, expected {sizes[index]}")
        needed = self.encoding.min_chunks
        if len(good) < needed:
            detail = f" ({'; '.join(wrong)})" if wrong else ""
            raise DataUnavailableError(
                f"{self.encoding.name} block of {block_len} bytes needs {needed} good chunks, "
                f"got {len(good)}{detail}"
            )
        return sizes, good

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.encoding.width:
            raise InvalidArgumentError(
                f"chunk index {index} out of range for {self.encoding.name} "
                f"(0..{self.encoding.width - 1})"
            )

    @staticmethod
    def _no_out(out: BytesLike | None) -> None:
        if out is not None:
            raise InvalidArgumentError("a synthetic block is not decoded into a buffer")

    def _check_missing(self, missing: Sequence[int]) -> list[int]:
        for index in missing:
            self._check_index(index)
        if len(set(missing)) != len(missing):
            raise InvalidArgumentError(f"duplicate chunk indexes in {list(missing)}")
        return list(missing)


def real_views(good: Mapping[int, memoryview | Synthetic]) -> dict[int, memoryview] | None:
    """``_good_chunks``'s chunks as byte views, or None when any of them is synthetic."""
    views: dict[int, memoryview] = {}
    for index, chunk in good.items():
        if isinstance(chunk, Synthetic):
            return None
        views[index] = chunk
    return views


def byte_view(buf: BytesLike) -> memoryview:
    """A flat unsigned-byte view of any contiguous buffer (no copy)."""
    view = memoryview(buf)
    if not view.c_contiguous:
        raise InvalidArgumentError("not a contiguous buffer")
    if view.format == "B" and view.ndim == 1:
        return view
    try:
        return view.cast("B")
    except TypeError as exc:
        raise InvalidArgumentError(f"not a contiguous buffer: {exc}") from exc


def writable_view(buf: BytesLike, nbytes: int) -> memoryview:
    """The first ``nbytes`` of a writable buffer, as a byte view."""
    view = byte_view(buf)
    if view.readonly:
        raise InvalidArgumentError("output buffer is read-only")
    if len(view) < nbytes:
        raise InvalidArgumentError(f"output buffer of {len(view)} bytes, {nbytes} needed")
    return view[:nbytes]


__all__ = ["Codec", "byte_view", "writable_view"]
