"""How ``ls`` and ``stat`` show a ``Stat``: its JSON (one source for both commands), the
rows of ``ls -l`` and the lines of ``stat``.

Owners are shown as numbers, never names: the uids and gids are those of the mount's
callers on whichever host they ran, and a name looked up on this machine could be
another's. Times are local, as ``ls -l`` shows them.
"""

from __future__ import annotations

import os
import time
from stat import filemode
from typing import Any

from tectonic_emu import attrs
from tectonic_emu.namespace import Stat

# ls -l's columns: type and permissions, links, uid, gid, size, encoding, state, mtime; then
# the name. Each is as wide as its widest cell; numbers are right-aligned.
_RIGHT = (False, True, True, True, True, False, False, False)


def stat_dict(st: Stat) -> dict[str, Any]:
    """The JSON of a ``Stat`` (``ls --json`` rows, ``stat --json``): ``mode`` is the
    permission bits as chmod takes them, ``mode_str`` the type and permissions as
    ``ls -l`` shows them."""
    return {
        "path": st.path,
        "kind": st.kind,
        "size": st.size,
        "encoding": st.encoding,
        "sealed": st.sealed,
        "blocks": st.nblocks,
        "mode": st.mode,
        "mode_str": filemode(attrs.st_mode(st.kind, st.mode)),
        "nlink": st.nlink,
        "uid": st.uid,
        "gid": st.gid,
        "atime": st.atime,
        "mtime": st.mtime,
        "ctime": st.ctime,
        "target": st.target,
        "rdev": st.rdev,
    }


def long_listing(rows: list[dict[str, Any]]) -> list[str]:
    """The lines of ``ls -l`` for ``stat_dict`` rows, e.g.
    ``-rw-r--r-- 1 0 0 67108864 rs-6-3 s 2026-12-08 10:41 model.bin``: the state is ``s``
    sealed, ``o`` open (being written, or left by a writer that crashed), ``-`` for what
    is not a regular file; a device's size is its major,minor. Within 80 columns for
    names of 15 characters with links up to 99, ids up to 99999, sizes under 100 GB (11
    digits) and encodings up to 7 characters (``rs-10-4``)."""
    cells = [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(_RIGHT))] if cells else []
    lines = []
    for c, r in zip(cells, rows, strict=True):
        padded = [
            v.rjust(w) if right else v.ljust(w)
            for v, w, right in zip(c, widths, _RIGHT, strict=True)
        ]
        lines.append(" ".join([*padded, _long_name(r)]))
    return lines


def _cells(r: dict[str, Any]) -> list[str]:
    kind = r["kind"]
    if kind in ("chardev", "blockdev"):
        size = f"{os.major(r['rdev'])},{os.minor(r['rdev'])}"
    else:
        size = str(r["size"])
    return [
        r["mode_str"],
        str(r["nlink"]),
        str(r["uid"]),
        str(r["gid"]),
        size,
        (r["encoding"] or "-") if kind in ("file", "dir") else "-",
        ("s" if r["sealed"] else "o") if kind == "file" else "-",
        time.strftime("%Y-%m-%d %H:%M", time.localtime(r["mtime"])),
    ]


def _long_name(r: dict[str, Any]) -> str:
    target: str | None = r["target"]
    return entry_name(r) + ("" if target is None else " -> " + target)


def entry_name(r: dict[str, Any]) -> str:
    """The last part of a row's path, with a ``/`` after a directory's (``ls``'s names)."""
    name: str = r["path"].rsplit("/", 1)[-1]
    return name + ("/" if r["kind"] == "dir" else "")


def stat_lines(d: dict[str, Any]) -> list[str]:
    """``stat``'s lines of a ``stat_dict``: a field a line (a symlink's target, a
    device's number when it has them; times local, to the second)."""
    out = [f"{k:9} {d[k]}" for k in ("path", "kind", "size", "encoding", "sealed", "blocks")]
    out.append(f"{'mode':9} {d['mode_str']} ({d['mode']:04o})")
    out += [f"{k:9} {d[k]}" for k in ("nlink", "uid", "gid")]
    out += [f"{k:9} {_when(d[k])}" for k in ("atime", "mtime", "ctime")]
    if d["target"] is not None:
        out.append(f"{'target':9} {d['target']}")
    if d["kind"] in ("chardev", "blockdev"):
        out.append(f"{'rdev':9} {os.major(d['rdev'])},{os.minor(d['rdev'])}")
    return out


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


__all__ = ["entry_name", "long_listing", "stat_dict", "stat_lines"]
