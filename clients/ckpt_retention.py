"""Retention: which committed steps a checkpoint root shows, and the markers that retire the
others (``keep_last``).

A step is committed when its manifest exists; it is *visible* (``steps()``, ``latest()``,
``load``) unless a marker retires it. A marker is an empty file in the root::

    ROOT/retire-<before>-<by>   once step <by> is committed, every step before <before> is
                                retired
    ROOT/retire-<before>        every step before <before> is retired

The committer of step N writes ``retire-<K>-<N>`` *before* N's manifest: the marker takes
effect with the manifest, so one listing of the root (one metadata transaction) shows either
neither or both, from any process. If the commit fails, the marker has no effect and is
tidied later. Retired steps' manifests and data are deleted behind the commit; a crash or a
store closed in between leaves them hidden, for the next clean-up to delete.

Before a manifest that the strongest marker waits on is deleted (``delete(step)``), that
marker is made unconditional (renamed ``retire-<before>``), so that nothing retired comes back.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from clients.ckpt_format import step_of_dir, step_of_manifest
from tectonic_emu.errors import WriterClosedError

_MARKER = re.compile(r"^retire-(\d{12})(?:-(\d{12}))?$")


@dataclass(frozen=True, slots=True, order=True)
class Marker:
    """Steps before ``before`` are retired once ``by`` is committed (always, when None)."""

    before: int
    by: int | None = None

    @property
    def name(self) -> str:
        head = f"retire-{self.before:012d}"
        return head if self.by is None else f"{head}-{self.by:012d}"


def marker_of(name: str) -> Marker | None:
    m = _MARKER.match(name)
    if m is None:
        return None
    return Marker(int(m.group(1)), None if m.group(2) is None else int(m.group(2)))


@dataclass(frozen=True, slots=True)
class RootView:
    """One listing of a checkpoint root: every manifest (by step, with its file id), every
    marker, and the steps that have a directory."""

    manifests: dict[int, int] = field(default_factory=dict)
    markers: tuple[Marker, ...] = ()
    step_dirs: tuple[int, ...] = ()

    def effective(self, m: Marker) -> bool:
        return m.by is None or m.by in self.manifests

    @property
    def strongest(self) -> Marker | None:
        """The effective marker that retires the most (unconditional ones first)."""
        live = [m for m in self.markers if self.effective(m)]
        return max(live, key=lambda m: (m.before, m.by is None, m.by or 0), default=None)

    @property
    def retired_before(self) -> int:
        top = self.strongest
        return 0 if top is None else top.before

    @property
    def visible(self) -> list[int]:
        """Committed steps not retired, oldest first."""
        k = self.retired_before
        return sorted(s for s in self.manifests if s >= k)

    @property
    def retired(self) -> list[int]:
        """Committed steps that are retired: hidden, their manifests not yet deleted."""
        k = self.retired_before
        return sorted(s for s in self.manifests if s < k)


def view_of(entries: Iterable[tuple[str, int]]) -> RootView:
    """The view of a root from its (name, file id) entries."""
    manifests: dict[int, int] = {}
    markers: list[Marker] = []
    dirs: list[int] = []
    for name, file_id in entries:
        if (s := step_of_manifest(name)) is not None:
            manifests[s] = file_id
        elif (m := marker_of(name)) is not None:
            markers.append(m)
        elif (s := step_of_dir(name)) is not None:
            dirs.append(s)
    return RootView(manifests, tuple(sorted(markers)), tuple(sorted(dirs)))


def commit_marker(view: RootView, step: int, keep_last: int | None) -> Marker | None:
    """The marker to write before ``step``'s manifest so that its commit retires the steps
    beyond ``keep_last`` (None when it retires nothing the root does not hide already)."""
    if keep_last is None:
        return None
    committed = sorted({*view.visible, step})
    kept = committed[-keep_last:]
    return None if kept[0] == committed[0] else Marker(kept[0], step)


@dataclass(frozen=True, slots=True)
class Tidy:
    """What a clean-up does to the markers before deleting manifests: ``confirm`` is renamed
    to its unconditional name (its step is about to go), ``remove`` are deleted."""

    confirm: Marker | None
    remove: list[Marker]


def tidy(view: RootView, dropping: Collection[int], before: int | None) -> Tidy:
    """The markers to confirm and delete when the manifests of ``dropping`` are deleted: the
    strongest marker stays in force (made unconditional if it waits on one of them); markers
    it supersedes go, and so do those of steps before ``before`` that never committed."""
    top = view.strongest
    confirm = top if top is not None and top.by is not None and top.by in dropping else None
    remove = []
    for m in view.markers:
        if m == top:
            continue
        if view.effective(m) or (before is not None and m.by is not None and m.by < before):
            remove.append(m)
    return Tidy(confirm, remove)


def stale_markers(view: RootView, step: int, keeping: Marker | None) -> list[Marker]:
    """Markers an earlier, failed attempt at ``step`` left (other than ``keeping``): they
    would take effect with this commit."""
    return [m for m in view.markers if m.by == step and m != keeping]


def store_closed(exc: OSError) -> bool:
    """Whether ``exc`` is the metadata store (or the cluster) being closed under a clean-up
    (EBADF), not a failure of it: what is left is collected by the next clean-up."""
    return exc.errno == errno.EBADF and not isinstance(exc, WriterClosedError)


__all__ = [
    "Marker",
    "RootView",
    "Tidy",
    "commit_marker",
    "marker_of",
    "stale_markers",
    "store_closed",
    "tidy",
    "view_of",
]
