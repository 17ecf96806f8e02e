"""What a load asks for: the values named (``names=``) and the caller's arrays to read them
into (``into=``), checked before anything is read.

As DCP's ``load`` is driven by the state dict it is given, ``load(..., names=[...])`` loads
only the values named: a trainer resharding to another world size names the sharded tensors
and leaves out per-rank values (RNG state, data-loader state), which cannot be resharded.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from clients.ckpt_format import CheckpointError, CheckpointNotFoundError, Entry, Shard


def selected(
    names: Collection[str] | None, saved: Collection[str], step: int, root: str
) -> list[str]:
    """The names a load reads: ``names`` (each once, in the order given) or, when None, every
    name ``saved``. Raises CheckpointError for a bare string and CheckpointNotFoundError
    naming the first name the checkpoint does not hold."""
    if names is None:
        return list(saved)
    if isinstance(names, (str, bytes)):
        raise CheckpointError(f"names= is a collection of names, not {type(names).__name__}")
    out = list(dict.fromkeys(names))
    for name in out:
        if name not in saved:
            held = ", ".join(repr(n) for n in sorted(saved)[:8])
            raise CheckpointNotFoundError(
                f"step {step} has no {name!r} (it holds {held}{' ...' if len(saved) > 8 else ''})",
                root,
            )
    return out


def not_saved_by(rank: int, name: str, step: int, root: str) -> CheckpointNotFoundError:
    """The error for a name asked for by ``names=`` that ``rank`` did not save."""
    return CheckpointNotFoundError(f"step {step}: rank {rank} saved no {name!r}", root)


def destination(e: Entry, given: Any) -> tuple[Any, memoryview]:
    """``given`` (``load``'s ``into``) checked as a place for ``e``'s value: the value to
    return (the array, or the buffer for bytes) and its bytes, to read into."""
    what = f"{e.name!r} of rank {e.rank}"
    if e.kind == "synthetic":
        raise CheckpointError(f"{what}: a synthetic value is not read into a buffer (no into=)")
    if e.kind == "bytes":
        try:
            view = memoryview(given).cast("B")
        except (TypeError, ValueError):
            raise CheckpointError(f"{what}: into= needs a writable contiguous buffer") from None
        if view.readonly or view.nbytes != e.nbytes:
            raise CheckpointError(
                f"{what}: into= needs a writable buffer of {e.nbytes} bytes, "
                f"not {'a read-only one' if view.readonly else view.nbytes}"
            )
        return given, view
    arr = _array_for(what, given, np.dtype(e.dtype), tuple(e.shape))
    return arr, arr.reshape(-1).view(np.uint8).data


def box_destination(
    name: str, rank: int, given: Any, dtype: str, shape: Sequence[int]
) -> np.ndarray[Any, Any]:
    """``given`` checked as the place for ``rank``'s box of the global array ``name`` when
    resharding: a writable C-contiguous array (or a Shard of one) of ``dtype`` and ``shape``."""
    return _array_for(f"{name!r} of rank {rank}", given, np.dtype(dtype), tuple(shape))


def _array_for(
    what: str, given: Any, dtype: np.dtype[Any], shape: tuple[int, ...]
) -> np.ndarray[Any, Any]:
    arr = given.array if isinstance(given, Shard) else given
    if (
        not isinstance(arr, np.ndarray)
        or arr.dtype != dtype
        or tuple(arr.shape) != shape
        or not arr.flags.c_contiguous
        or not arr.flags.writeable
    ):
        got = (
            f"a {arr.dtype} array of shape {arr.shape}"
            + ("" if arr.flags.c_contiguous else ", not C-contiguous")
            + ("" if arr.flags.writeable else ", read-only")
            if isinstance(arr, np.ndarray)
            else type(arr).__name__
        )
        raise CheckpointError(
            f"{what}: into= needs a writable C-contiguous {dtype} array of shape {shape}, not {got}"
        )
    return arr


__all__ = ["box_destination", "destination", "not_saved_by", "selected"]
