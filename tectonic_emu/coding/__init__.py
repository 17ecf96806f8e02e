"""Block encodings (replication, Reed-Solomon), chunk checksums and chunk compression."""

from tectonic_emu.coding.checksum import (
    crc32c,
    crc32c_combine,
    crc32c_each,
    crc32c_many,
    crc32c_pieces,
)
from tectonic_emu.coding.codec import Codec, codec_for
from tectonic_emu.coding.compression import (
    FLAG_ZSTD,
    POLICIES,
    CompressionPolicy,
    decompress,
    maybe_compress,
)
from tectonic_emu.coding.encoding import KNOWN_ENCODINGS, Encoding

__all__ = [
    "FLAG_ZSTD",
    "KNOWN_ENCODINGS",
    "POLICIES",
    "Codec",
    "CompressionPolicy",
    "Encoding",
    "codec_for",
    "crc32c",
    "crc32c_combine",
    "crc32c_each",
    "crc32c_many",
    "crc32c_pieces",
    "decompress",
    "maybe_compress",
]
