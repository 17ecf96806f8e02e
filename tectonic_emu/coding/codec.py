"""``codec_for``: the one shared codec of each encoding.

The seam itself (``Codec``, ``byte_view``, ``writable_view``) lives in ``coding/base.py``, below
the concrete codecs; this module sits above them and keeps re-exporting the seam's names.
"""

from __future__ import annotations

import threading

from tectonic_emu.coding.base import Codec, byte_view, writable_view
from tectonic_emu.coding.encoding import Encoding
from tectonic_emu.coding.reed_solomon import ReedSolomonCodec
from tectonic_emu.coding.replication import ReplicationCodec
from tectonic_emu.errors import UnknownEncodingError

_codecs: dict[str, Codec] = {}
_codecs_lock = threading.Lock()


def codec_for(encoding: Encoding | str) -> Codec:
    """The shared codec of an encoding (``Encoding`` or its name). Safe to use from any
    number of threads at once."""
    name = str(encoding)
    codec = _codecs.get(name)
    if codec is None:
        parsed = Encoding.parse(name)
        with _codecs_lock:
            codec = _codecs.get(name)
            if codec is None:
                if parsed.kind == "replication":
                    codec = ReplicationCodec(parsed)
                else:
                    codec = ReedSolomonCodec(parsed)
                _codecs[name] = codec
    if isinstance(encoding, Encoding) and encoding != codec.encoding:
        raise UnknownEncodingError(f"inconsistent encoding {encoding!r}", name)
    return codec


__all__ = ["Codec", "byte_view", "codec_for", "writable_view"]
