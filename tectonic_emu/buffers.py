"""The byte-buffer types shared by every layer, at the bottom of the import graph.

Imports nothing from the project, so ``coding/`` (pure functions) and ``chunkstore/`` can both
name the buffers they take without one importing the other.
"""

from __future__ import annotations

# What chunk payloads and blocks may be passed as (``collections.abc.Buffer`` needs Python 3.12).
BytesLike = bytes | bytearray | memoryview

__all__ = ["BytesLike"]
