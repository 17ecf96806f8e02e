"""Argument checks at the public Python API: one clear line and a typed error.

A wrong type passed to ``Client.read``, ``write_file``, ``Cluster.create`` or
``Checkpointer`` used to surface as a bare ``TypeError`` from deep inside (``slice indices
must be integers``, ``memoryview: a bytes-like object is required``), after some state had
changed (a writer given a str was closed). These checks run first and raise
``ArgumentTypeError``, an ``InvalidArgumentError`` (EINVAL) that is also a ``TypeError``, whose
line names the call, the argument, what it got and what it takes::

    read: offset must be an int, not float 0.5

``bool`` is refused where an int is wanted (``True`` is an int to Python, never a sensible
offset), and an int where a bool is wanted. Integer types such as numpy's are accepted (by
``__index__``), as are bytes-like objects such as numpy arrays (by the buffer protocol).
"""

from __future__ import annotations

import math
import operator
import os
from typing import Any

from tectonic_emu.errors import ArgumentTypeError, InvalidArgumentError


def _got(value: object) -> str:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{type(value).__name__} {shown}"


def int_arg(where: str, name: str, value: Any, *, at_least: int | None = None) -> int:
    """``value`` as an int (anything with ``__index__`` but a bool); ArgumentTypeError for
    another type, InvalidArgumentError when below ``at_least``."""
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{where}: {name} must be an int, not {_got(value)}")
    try:
        n = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{where}: {name} must be an int, not {_got(value)}") from None
    if at_least is not None and n < at_least:
        raise InvalidArgumentError(f"{where}: {name} must be at least {at_least}, not {n}")
    return n


def optional_int_arg(where: str, name: str, value: Any) -> int | None:
    """``int_arg``, or None."""
    return None if value is None else int_arg(where, name, value)


def number_arg(where: str, name: str, value: Any, *, at_least: float | None = None) -> float:
    """``value`` as a finite float (an int or a float, not a bool or a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{where}: {name} must be a number, not {_got(value)}")
    x = float(value)
    if not math.isfinite(x):
        raise InvalidArgumentError(f"{where}: {name} must be a finite number, not {x}")
    if at_least is not None and x < at_least:
        raise InvalidArgumentError(f"{where}: {name} must be at least {at_least}, not {x}")
    return x


def bool_arg(where: str, name: str, value: Any) -> bool:
    """``value`` if it is a bool (``recursive="yes"`` is refused, not taken as true)."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{where}: {name} must be True or False, not {_got(value)}")
    return value


def str_arg(where: str, name: str, value: Any) -> str:
    """``value`` if it is a str."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{where}: {name} must be a str, not {_got(value)}")
    return value


def optional_str_arg(where: str, name: str, value: Any) -> str | None:
    """``value`` if it is a str or None."""
    if value is not None and not isinstance(value, str):
        raise ArgumentTypeError(f"{where}: {name} must be a str or None, not {_got(value)}")
    return value


def path_arg(where: str, name: str, value: Any) -> str:
    """A local path given as a str or an ``os.PathLike`` (a ``pathlib.Path``), as a str."""
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(
            f"{where}: {name} must be a local path (a str or a pathlib.Path), not {_got(value)}"
        )
    path = os.fspath(value)
    if not isinstance(path, str):
        raise ArgumentTypeError(f"{where}: {name} must be a str path, not {_got(path)}")
    return path


def bytes_arg(where: str, name: str, value: Any) -> memoryview:
    """A byte view of ``value``, which must be bytes-like (bytes, bytearray, memoryview, a
    numpy array...); a str is refused with a hint to encode it."""
    if isinstance(value, str):
        raise ArgumentTypeError(
            f"{where}: {name} must be bytes-like, not str (encode it: {name}.encode())"
        )
    try:
        return memoryview(value)
    except TypeError:
        raise ArgumentTypeError(f"{where}: {name} must be bytes-like, not {_got(value)}") from None


def buffer_arg(where: str, name: str, value: Any) -> memoryview:
    """A writable byte view of ``value`` (a bytearray, a writable memoryview or array)."""
    view = bytes_arg(where, name, value)
    if view.readonly:
        raise ArgumentTypeError(
            f"{where}: {name} must be a writable buffer (a bytearray...), not {_got(value)}"
        )
    return view


__all__ = [
    "bool_arg",
    "buffer_arg",
    "bytes_arg",
    "int_arg",
    "number_arg",
    "optional_int_arg",
    "optional_str_arg",
    "path_arg",
    "str_arg",
]
