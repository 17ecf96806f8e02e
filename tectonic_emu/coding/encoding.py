"""How a block is stored: N full replicas (``r3``) or Reed-Solomon with D data and P parity
chunks (``rs-6-3``). Every block is split into ``width`` chunks, each on a distinct node."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from tectonic_emu.errors import UnknownEncodingError

MAX_REPLICAS = 8
MAX_RS_DATA = 32
MAX_RS_PARITY = 16

# The encodings of the Tectonic paper, used by benches and tests.
KNOWN_ENCODINGS: tuple[str, ...] = ("r1", "r3", "rs-3-3", "rs-6-3", "rs-9-6", "rs-10-4")

_VALID_FORMS = (
    f"valid encodings are rN with 1 <= N <= {MAX_REPLICAS} (e.g. r3) and rs-D-P with "
    f"1 <= D <= {MAX_RS_DATA}, 1 <= P <= {MAX_RS_PARITY} (e.g. rs-6-3)"
)
_REPLICATION = re.compile(r"r([1-9][0-9]?)")
_RS = re.compile(r"rs-([1-9][0-9]?)-([1-9][0-9]?)")
_PARSED: dict[str, Encoding] = {}  # valid names parsed before


@dataclass(frozen=True, slots=True)
class Encoding:
    """A parsed encoding name. Build one with ``Encoding.parse("rs-6-3")``."""

    name: str  # canonical text: "r1", "r3", "rs-6-3"
    kind: Literal["replication", "rs"]
    data: int  # rN: 1; rs-D-P: D
    parity: int  # rN: N-1; rs-D-P: P

    @property
    def width(self) -> int:
        """Chunks per block."""
        return self.data + self.parity

    @property
    def min_chunks(self) -> int:
        """Good chunks needed to read a block."""
        return 1 if self.kind == "replication" else self.data

    @property
    def tolerance(self) -> int:
        """Chunk losses a block survives."""
        return self.width - self.min_chunks

    @property
    def overhead(self) -> float:
        """Stored bytes per logical byte (ignoring the few bytes of RS padding)."""
        return self.width / self.data

    @classmethod
    def parse(cls, text: str) -> Encoding:
        """Parse ``r1``..``r8`` or ``rs-D-P``; raise ``UnknownEncodingError`` on anything else.
        Names parsed before are answered from a table (every block read parses its record's:
        the regular expressions cost 3 µs of a 4 KiB read's 38)."""
        if not isinstance(text, str):
            raise UnknownEncodingError(f"encoding must be text ({_VALID_FORMS})", repr(text))
        known = _PARSED.get(text)
        if known is None:
            known = _PARSED[text] = cls._parse(text)  # only valid names: 520 at most
        return known

    @classmethod
    def _parse(cls, text: str) -> Encoding:
        if m := _REPLICATION.fullmatch(text):
            replicas = int(m[1])
            if replicas <= MAX_REPLICAS:
                return cls(text, "replication", 1, replicas - 1)
        elif m := _RS.fullmatch(text):
            data, parity = int(m[1]), int(m[2])
            if data <= MAX_RS_DATA and parity <= MAX_RS_PARITY:
                return cls(text, "rs", data, parity)
        raise UnknownEncodingError(f"unknown encoding ({_VALID_FORMS})", repr(text))

    def __str__(self) -> str:
        return self.name


__all__ = ["KNOWN_ENCODINGS", "MAX_REPLICAS", "MAX_RS_DATA", "MAX_RS_PARITY", "Encoding"]
