"""Retention and garbage collection of a checkpoint root: the store side of
``clients/ckpt_retention.py``'s decisions.

- ``mark_retirement``: just before a step's manifest, the marker by which its commit retires
  the steps beyond ``keep_last``.
- ``retain``: behind a commit, retired checkpoints and failed steps' leftovers deleted
  (``collect_garbage``), never a data file a kept checkpoint references.
- ``delete_step``: one committed checkpoint deleted, manifest first.
- ``forget_retirement``: a new series started below the retired steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence

from clients.ckpt_catalog import Catalog
from clients.ckpt_format import CheckpointNotFoundError, manifest_name, step_dir
from clients.ckpt_retention import (
    Marker,
    RootView,
    commit_marker,
    stale_markers,
    store_closed,
    tidy,
)
from tectonic_emu.errors import NotFoundError

# The public module's logger: the clean-up is the Checkpointer's, whoever configures its logs.
log = logging.getLogger("clients.checkpoint")


async def mark_retirement(catalog: Catalog, step: int, keep_last: int | None) -> None:
    """Before ``step``'s manifest: the marker by which its commit retires the steps beyond
    ``keep_last``, at once for every process (``ckpt_retention``); markers that an earlier,
    failed attempt at this step left are deleted first."""
    view = await catalog.view()
    marker = commit_marker(view, step, keep_last)
    for m in stale_markers(view, step, marker):
        with contextlib.suppress(NotFoundError):
            await catalog.client.delete(catalog.path(m.name))
    if marker is not None and marker not in view.markers:
        await catalog.client.write_file(catalog.path(marker.name), b"")


async def retain(
    catalog: Catalog, newest: int, *, after: asyncio.Future[None] | None = None
) -> None:
    """Delete retired checkpoints and failed steps' leftovers (after the clean-up before it,
    if any). Errors are logged: the checkpoint is committed either way, and what is left
    stays hidden until the next clean-up. A store closed under it (the cluster closed
    first) is no error: the next commit or ``collect_garbage`` finishes it."""
    if after is not None:
        with contextlib.suppress(Exception):
            await after
    try:
        await collect_garbage(catalog, before=newest)
    except OSError as exc:
        if store_closed(exc):
            log.debug("checkpoint clean-up after step %d left to the next: %s", newest, exc)
        else:
            log.warning("checkpoint clean-up after step %d failed: %s", newest, exc)


async def delete_step(catalog: Catalog, step: int) -> None:
    """Delete a committed checkpoint (its manifest first, then the data files no other
    checkpoint references). Raises CheckpointNotFoundError, for a retired step too."""
    await catalog.manifest(step)
    await drop(catalog, [step], await catalog.view())


async def collect_garbage(catalog: Catalog, before: int | None = None) -> int:
    """Delete retired checkpoints, and what steps that never committed left behind for
    steps before ``before`` (default: the latest committed), keeping data files a
    checkpoint references. Returns how many steps it cleaned."""
    view = await catalog.view()
    if before is None:
        before = view.visible[-1] if view.visible else view.retired_before
    stale = [s for s in view.step_dirs if s < before and s not in view.manifests]
    retired = view.retired
    await drop(catalog, retired, view, before)
    if stale:
        kept = await _files_of(catalog, await catalog.steps())
        for s in stale:
            await _remove_step_dir(catalog, s, kept)
    return len(stale) + len(retired)


async def forget_retirement(catalog: Catalog, view: RootView) -> None:
    """Every checkpoint was deleted or retired, and a new series starts below the steps
    retired: delete the retired ones, then the markers, which would hide the new one.
    Once no manifest lies below them they hide nothing, so a crash in between is safe."""
    await drop(catalog, view.retired, view)
    for m in (await catalog.view()).markers:
        with contextlib.suppress(NotFoundError):
            await catalog.client.delete(catalog.path(m.name))


async def drop(
    catalog: Catalog, steps: Sequence[int], view: RootView, before: int | None = None
) -> None:
    """Delete the manifests of ``steps``, then their data files that no checkpoint left
    references. Retirement markers go first (``ckpt_retention.tidy``): the one in force is
    made unconditional if it waits on one of ``steps``, those it supersedes and those of
    steps before ``before`` that never committed are deleted."""
    client = catalog.client
    plan = tidy(view, steps, before)
    if plan.confirm is not None:
        done = catalog.path(Marker(plan.confirm.before).name)
        with contextlib.suppress(NotFoundError):
            await client.rename(catalog.path(plan.confirm.name), done)
    for m in plan.remove:
        with contextlib.suppress(NotFoundError):
            await client.delete(catalog.path(m.name))
    if not steps:
        return
    for s in steps:
        with contextlib.suppress(NotFoundError):
            await client.delete(catalog.path(manifest_name(s)))
    files = await _files_of(catalog, await catalog.steps())
    for s in steps:
        await _remove_step_dir(catalog, s, files)


async def _files_of(catalog: Catalog, steps: Iterable[int]) -> set[str]:
    """The data files the checkpoints of ``steps`` reference (one already deleted: none)."""
    files: set[str] = set()
    for s in steps:
        with contextlib.suppress(CheckpointNotFoundError):
            files |= (await catalog.manifest(s)).files()
    return files


async def _remove_step_dir(catalog: Catalog, step: int, kept: set[str]) -> None:
    client, sdir = catalog.client, step_dir(step)
    try:
        names = await client.listdir(catalog.path(sdir))
    except NotFoundError:
        return
    for n in names:
        if f"{sdir}/{n}" not in kept:
            with contextlib.suppress(NotFoundError):
                await client.delete(catalog.path(sdir, n))
    if not any(f"{sdir}/{n}" in kept for n in names):
        with contextlib.suppress(NotFoundError, OSError):
            await client.delete(catalog.path(sdir))


__all__ = [
    "collect_garbage",
    "delete_step",
    "drop",
    "forget_retirement",
    "mark_retirement",
    "retain",
]
