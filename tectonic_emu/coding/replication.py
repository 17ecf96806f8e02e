"""``rN``: every chunk is the whole block."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tectonic_emu.buffers import BytesLike
from tectonic_emu.coding.base import Codec, byte_view, writable_view
from tectonic_emu.coding.synthetic import Payload, Synthetic


class ReplicationCodec(Codec):
    """N identical chunks; any one of them is the block."""

    def chunk_sizes(self, block_len: int) -> list[int]:
        return [block_len] * self.encoding.width

    def encode(
        self, block: Payload, *, parity_out: Sequence[BytesLike] | None = None
    ) -> list[Payload]:
        view = block if isinstance(block, Synthetic) else byte_view(block)
        return [view] * self.encoding.width  # one view N times: no copies

    def decode(
        self,
        chunks: Mapping[int, Payload],
        block_len: int,
        *,
        out: BytesLike | None = None,
    ) -> Payload:
        _, good = self._good_chunks(chunks, block_len)
        chunk = good[min(good)]
        if isinstance(chunk, Synthetic):
            self._no_out(out)
            return chunk
        if out is None:
            return chunk
        dst = writable_view(out, block_len)
        dst[:] = chunk
        return dst

    def reconstruct(
        self, chunks: Mapping[int, Payload], missing: Sequence[int], block_len: int
    ) -> dict[int, Payload]:
        missing = self._check_missing(missing)
        _, good = self._good_chunks(chunks, block_len, exclude=missing)
        source = good[min(good)]
        return dict.fromkeys(missing, source)


__all__ = ["ReplicationCodec"]
