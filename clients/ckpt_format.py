"""What a checkpoint is in the store: names, the manifest, and the errors of the checkpoint API.

A checkpoint root holds one directory per step and, once the step is committed, one manifest::

    ROOT/step-000000000042/data-<writer>-<n>[.<k>]  pieces of the ranks one writer staged
    ROOT/step-000000000042/index-<writer>-<n>.json  which ranks batch n (its data files) completes
    ROOT/step-000000000042/abort-<rank>             a rank gave up: the step cannot commit
    ROOT/manifest-000000000042.json                 the commit: every piece of every rank
    ROOT/retire-000000000040[-000000000042]         steps before 40 are retired (once 42
                                                    is committed): ckpt_retention.py

A writer is one ``Checkpointer`` in one process. The manifest names, for every (rank, name),
the *parts* the value was cut into and where each lies (a data file, an offset, a length, a
CRC32C). An incremental checkpoint's parts may lie in an older step's data files.
``docs/checkpoint.md`` describes the commit protocol.
"""

from __future__ import annotations

import errno
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from tectonic_emu.errors import TectonicError

FORMAT = "tectonic-ckpt/1"
_STEP_DIR = re.compile(r"^step-(\d{12})$")
_MANIFEST = re.compile(r"^manifest-(\d{12})\.json$")
_JSON = json.JSONEncoder(separators=(",", ":"))
_str = json.encoder.encode_basestring_ascii  # a JSON string, as _JSON writes it

# "synthetic": bytes described by a seed, not made (a projection's, docs/simulate.md); such
# a value loads as the ``Synthetic`` that was saved.
Kind = Literal["shard", "array", "bytes", "synthetic"]


class CheckpointError(TectonicError):
    """A checkpoint cannot be saved or loaded as asked (a bad argument, a missing step, a
    per-rank value asked for at another world size)."""

    default_errno = errno.EINVAL


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    default_errno = errno.ENOENT


class CheckpointAbortedError(CheckpointError):
    """A step cannot commit: a rank gave up or failed, or ranks did not all finish in time."""

    default_errno = errno.ECANCELED


class CheckpointTimeoutError(CheckpointAbortedError, TimeoutError):
    default_errno = errno.ETIMEDOUT


class CheckpointCorruptError(CheckpointError):
    """Stored bytes of a checkpoint do not match the checksum its manifest recorded."""

    default_errno = errno.EIO


@dataclass(frozen=True, slots=True)
class Shard:
    """One rank's piece of a larger array: ``array`` sits at ``offset`` in an array of
    ``global_shape``."""

    array: np.ndarray[Any, Any]
    global_shape: tuple[int, ...]
    offset: tuple[int, ...]

    def __post_init__(self) -> None:
        try:  # numpy integers welcome; stored as ints
            object.__setattr__(self, "global_shape", tuple(map(operator.index, self.global_shape)))
            object.__setattr__(self, "offset", tuple(map(operator.index, self.offset)))
        except TypeError:
            raise CheckpointError(
                f"a Shard's global_shape and offset are integers (got {self.global_shape}, "
                f"{self.offset})"
            ) from None
        if len(self.global_shape) != self.array.ndim or len(self.offset) != self.array.ndim:
            raise CheckpointError(
                f"a Shard of a {self.array.ndim}-d array needs a {self.array.ndim}-d "
                f"global_shape and offset (got {self.global_shape}, {self.offset})"
            )
        for o, n, g in zip(self.offset, self.array.shape, self.global_shape, strict=True):
            if o < 0 or o + n > g:
                raise CheckpointError(
                    f"a Shard of shape {self.array.shape} at {self.offset} does not fit in "
                    f"{self.global_shape}"
                )


Value = Any  # a state's value: a numpy array, a bytes-like, a Shard, or a Synthetic


class Part(NamedTuple):
    """Rows [row0, row1) of a value (all of it for bytes), stored at ``pos`` in ``file``
    (relative to the checkpoint root).

    Parts and entries are named tuples, not dataclasses: a manifest of 4,096 ranks holds
    thousands of them, and tuples of strings and numbers leave the cyclic garbage
    collector's care after its first pass over them, where tracked objects made each full
    collection walk them again (tens of ms a save at 4,096 ranks, ``docs/performance.md``).
    They are built faster too."""

    file: str
    pos: int
    length: int
    crc32c: int
    row0: int = 0
    row1: int = 0
    digest: str | None = None  # blake2b-128, recorded by incremental saves

    def text(self) -> str:
        """This part's JSON (see ``entry_text``)."""
        file, pos, length, crc, row0, row1, digest = self
        dg = "null" if digest is None else _str(digest)
        return (
            f'{{"file":{_str(file)},"pos":{pos:d},"length":{length:d},"crc32c":{crc:d},'
            f'"row0":{row0:d},"row1":{row1:d},"digest":{dg}}}'
        )


class Entry(NamedTuple):
    """One named value of one rank."""

    rank: int
    name: str
    kind: Kind
    dtype: str = ""  # numpy dtype string, arrays and shards
    shape: tuple[int, ...] = ()  # this rank's array
    global_shape: tuple[int, ...] = ()  # shards: the whole array
    offset: tuple[int, ...] = ()  # shards: where this rank's array sits
    parts: tuple[Part, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(p.length for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "name": self.name,
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "global_shape": list(self.global_shape),
            "offset": list(self.offset),
            "parts": [p._asdict() for p in self.parts],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Entry:
        parts = tuple(
            Part(
                str(p["file"]),
                int(p["pos"]),
                int(p["length"]),
                int(p["crc32c"]),
                int(p.get("row0", 0)),
                int(p.get("row1", 0)),
                p.get("digest"),
            )
            for p in d["parts"]
        )
        return cls(
            int(d["rank"]),
            str(d["name"]),
            d["kind"],
            str(d.get("dtype", "")),
            tuple(d.get("shape", ())),
            tuple(d.get("global_shape", ())),
            tuple(d.get("offset", ())),
            parts,
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    step: int
    world_size: int
    entries: tuple[Entry, ...]
    committed_at: float = 0.0

    def encode(self, entry_texts: Sequence[str] | None = None) -> bytes:
        """The manifest's JSON. ``entry_texts``: each entry's ``entry_text``, in order, when
        the caller has them already (the index files a committer wrote hold the same text:
        encoding 4,096 entries twice cost 20-40 ms of the commit)."""
        if entry_texts is None:
            entry_texts = [entry_text(e) for e in self.entries]
        head = _JSON.encode(
            {
                "format": FORMAT,
                "step": self.step,
                "world_size": self.world_size,
                "committed_at": self.committed_at,
            }
        )
        return f'{head[:-1]},"entries":[{",".join(entry_texts)}]}}'.encode()

    @classmethod
    def decode(cls, raw: bytes, where: str) -> Manifest:
        try:
            d = json.loads(raw)
            if d.get("format") != FORMAT:
                raise CheckpointCorruptError(f"not a {FORMAT} manifest", where)
            entries = tuple(Entry.from_json(e) for e in d["entries"])
            return cls(int(d["step"]), int(d["world_size"]), entries, float(d["committed_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointCorruptError(f"unreadable manifest: {exc}", where) from exc

    def files(self) -> set[str]:
        """The data files this checkpoint's parts lie in."""
        return {p.file for e in self.entries for p in e.parts}


def entry_text(e: Entry | dict[str, Any]) -> str:
    """The JSON of one entry (an ``Entry`` or its ``to_json()``), as manifests and index
    files hold it: ``json.dumps(e.to_json(), separators=(",", ":"))``, character for
    character. An ``Entry``'s is written by hand, at under half the cost of building a dict
    for the encoder (4.5 us an entry against 10.6: 25 ms of a save at 4,096 ranks)."""
    if not isinstance(e, Entry):
        return _JSON.encode(e)
    rank, name, kind, dtype, shape, global_shape, offset, parts = e
    texts = ",".join([p.text() for p in parts])
    return (
        f'{{"rank":{rank:d},"name":{_str(name)},"kind":{_str(kind)},"dtype":{_str(dtype)},'
        f'"shape":{_ints(shape)},"global_shape":{_ints(global_shape)},'
        f'"offset":{_ints(offset)},"parts":[{texts}]}}'
    )


def _ints(xs: tuple[int, ...]) -> str:
    return "[" + ",".join([f"{x:d}" for x in xs]) + "]"


def step_dir(step: int) -> str:
    return f"step-{step:012d}"


def manifest_name(step: int) -> str:
    return f"manifest-{step:012d}.json"


def step_of_dir(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def step_of_manifest(name: str) -> int | None:
    m = _MANIFEST.match(name)
    return int(m.group(1)) if m else None


def check_step(step: int) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**12:
        raise CheckpointError(f"a step is an int in [0, 10**12), not {step!r}")


def rank_error(rank: object, world_size: int) -> CheckpointError | None:
    """The error for ``rank`` unless it is a rank number (an int, numpy's too) in
    [0, world_size)."""
    if (
        not isinstance(rank, bool)
        and isinstance(rank, (int, np.integer))
        and 0 <= rank < world_size
    ):
        return None
    # A number as it is, anything else by its repr: one line, whatever it holds.
    shown = rank if isinstance(rank, (int, np.integer)) else repr(rank)
    return CheckpointError(f"rank {shown} is not in [0, {world_size})")


__all__ = [
    "entry_text",
    "FORMAT",
    "CheckpointAbortedError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointTimeoutError",
    "Entry",
    "Kind",
    "Manifest",
    "Part",
    "Shard",
    "Value",
    "check_step",
    "manifest_name",
    "rank_error",
    "step_dir",
    "step_of_dir",
    "step_of_manifest",
]
