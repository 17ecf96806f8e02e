"""The JSON schema of every bench's ``--json`` output, derived from its result dataclass.

A bench's result is a dataclass of plain types (``int``, ``float``, ``str``, ``bool``, lists,
``dict[str, ...]``, ``X | None`` and nested dataclasses); ``schema_of`` turns its annotations
into a JSON Schema (draft 2020-12) in which every field is required and no other is allowed.
The schemas are committed under ``docs/schemas/`` and a test fails when the code's schema and
the committed one differ, so a change of the JSON is always a deliberate one
(``tectonic-emu bench schema NAME`` prints the current schema).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _of(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return {}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is type(None):
        return {"type": "null"}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_of(a) for a in args]}
    if origin in (list, tuple) or tp in (list, tuple):
        item = args[0] if args else Any
        return {"type": "array", "items": _of(item)}
    if origin is dict or tp is dict:
        value = args[1] if len(args) == 2 else Any
        return {"type": "object", "additionalProperties": _of(value)}
    if dataclasses.is_dataclass(tp):
        return _object(tp)
    raise TypeError(f"no JSON schema for {tp!r}")


def _object(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    return {
        "type": "object",
        "required": names,
        "additionalProperties": False,
        "properties": {n: _of(hints[n]) for n in names},
    }


def schema_of(cls: Any, schema_id: str, title: str) -> dict[str, Any]:
    """The JSON Schema of ``dataclasses.asdict`` of a ``cls`` instance."""
    return {"$schema": DRAFT, "$id": schema_id, "title": title, **_object(cls)}


__all__ = ["schema_of"]
