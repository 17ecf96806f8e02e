"""What the store does with a bench's ``--size`` bytes, for checking it fits beforehand.

Every bench that holds or writes ``size`` bytes says what a run of that size needs
(``tectonic_emu.resources.Needs``: the memory it keeps resident at its peak, its mounts' and
node processes' included, and the bytes it has on disk at once), worked out from its own code
(each module's ``needs``), from the estimates here. ``tectonic_emu.resources.check_fits``
compares them with the memory available and the space free under ``--dir``, and refuses a
size that does not fit with one line naming the largest that does.
"""

from __future__ import annotations

import math

from tectonic_emu.client import Client
from tectonic_emu.coding import Encoding
from tectonic_emu.config import DEFAULT_BLOCK_SIZE

PAGE = 4096  # a chunk file's header page, and the file system's rounding of its payload


# -- what the store does with N bytes ---------------------------------------------------------
def block_bytes(encoding: str, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Bytes of one block of a file (every chunk is ``block_size``; RS blocks hold D)."""
    enc = Encoding.parse(encoding)
    return block_size * (enc.data if enc.kind == "rs" else 1)


def stored_bytes(
    nbytes: int, encoding: str, block_size: int = DEFAULT_BLOCK_SIZE, *, files: int = 1
) -> int:
    """Disk taken by ``nbytes`` written in ``files`` files of ``encoding``: the bytes times the
    storage overhead, plus per chunk a header page and the last page's rounding."""
    enc = Encoding.parse(encoding)
    blocks = max(files, math.ceil(nbytes / block_bytes(encoding, block_size)))
    return math.ceil(nbytes * enc.overhead) + blocks * enc.width * 2 * PAGE


def in_flight(
    encoding: str, block_size: int = DEFAULT_BLOCK_SIZE, *, writers: int = 1, nbytes: int
) -> int:
    """Memory of blocks a client has in flight for ``writers`` writers at once (each
    ``Client.write_depth`` blocks encoded into chunks: the parity besides the block for RS,
    one shared copy for replication, and ``read_depth`` blocks read back), at most
    ``nbytes`` of data in all."""
    enc = Encoding.parse(encoding)
    block = block_bytes(encoding, block_size)
    chunks = enc.overhead if enc.kind == "rs" else 1.0
    written = min(nbytes, writers * Client.write_depth * block)
    read = min(nbytes, writers * Client.read_depth * block)
    return math.ceil(written * chunks) + read


__all__ = ["block_bytes", "in_flight", "stored_bytes"]
