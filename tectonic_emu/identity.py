"""A cluster's identity in its own metadata: written at create, checked at every open.

``Cluster.create`` gives the cluster a random id (``cluster.json``'s ``cluster_id``) and writes
it into the new metadata store beside the root directory (``snapshot.CLUSTER_KEY``).
``Cluster.open`` reads it back, one key, and refuses a store that lacks it (deleted, truncated,
a fresh file, a load cut short), names another cluster, or cannot be read (damaged), with a
line that names the fix. Before this, every open created the root directory afresh: a lost
metadata file read as an empty namespace, and ``repair`` then collected every chunk.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

from tectonic_emu.config import METADATA_FILE, ClusterConfig, redact
from tectonic_emu.errors import MetadataLostError
from tectonic_emu.metadata import SQLiteKV
from tectonic_emu.metadata.kv import KVStore
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.metadata.snapshot import CLUSTER_KEY, cluster_value, read_cluster_id
from tectonic_emu.offload import run_apart

RESTORE_HINT = (
    "restore it with `tectonic-emu meta restore --latest` (from the backups on the nodes) "
    "or `tectonic-emu meta load FILE` (from a dump)"
)


def init_metadata(open_store: Callable[[], KVStore], config: ClusterConfig) -> None:
    """Give a new cluster's metadata store (``open_store()``) its root directory and the
    cluster's id. Runs on a thread and loop of its own, so it works inside a running loop.
    Raises OSError from the store."""

    async def init() -> None:
        kv = open_store()
        try:
            await Metadata(kv).ensure_root(config.created)
            async with kv.transaction() as txn:
                await txn.put(CLUSTER_KEY, cluster_value(config.cluster_id))
        finally:
            await kv.close()

    run_apart(init, name="tectonic-metadata-init")


def where(root: Path, config: ClusterConfig) -> str:
    """The metadata store's name for messages: its file, or its (redacted) URL."""
    return redact(config.metadata) if config.metadata else str(root / METADATA_FILE)


def check_missing_file(root: Path, config: ClusterConfig) -> None:
    """MetadataLostError when the cluster's SQLite file is gone (checked before SQLite
    would make a new, empty one in its place)."""
    if config.cluster_id and not config.metadata and not (root / METADATA_FILE).exists():
        raise MetadataLostError(
            f"the metadata database is missing: {RESTORE_HINT}", where(root, config)
        )


async def check_metadata(root: Path, config: ClusterConfig, kv: KVStore) -> None:
    """Raise MetadataLostError unless ``kv`` is this cluster's metadata: it names the cluster
    id of ``config``. A cluster made before ids (none in its config) is not checked."""
    if not config.cluster_id:
        return
    try:
        found = await read_cluster_id(kv)
    except OSError as e:
        if e.errno != errno.EIO:
            raise  # busy, no space, no access: not a lost store
        raise MetadataLostError(
            f"the metadata store is damaged ({e.strerror}): {RESTORE_HINT}", where(root, config)
        ) from e
    if found is None:
        raise MetadataLostError(
            "the metadata store is empty or incomplete (truncated, new, or a load cut short), "
            f"not this cluster's namespace: {RESTORE_HINT}",
            where(root, config),
        )
    if found != config.cluster_id:
        raise MetadataLostError(
            f"the metadata store is another cluster's ({found}; this is {config.cluster_id}): "
            f"{RESTORE_HINT}",
            where(root, config),
        )


async def check_store(root: Path, config: ClusterConfig, open_store: Callable[[], KVStore]) -> None:
    """``check_missing_file`` and ``check_metadata`` on a store opened (``open_store()``)
    and closed for the purpose: ``serve`` runs it before it starts any node."""
    check_missing_file(root, config)
    kv = open_store()
    try:
        await check_metadata(root, config, kv)
    finally:
        await kv.close()


async def adopt_if_empty(kv: KVStore, config: ClusterConfig) -> None:
    """Make an empty store the caller chose (``Cluster.open(kv=MemoryKV())``) this cluster's."""
    if not await kv.scan(b"", limit=1):
        async with kv.transaction() as txn:
            await txn.put(CLUSTER_KEY, cluster_value(config.cluster_id))


async def set_aside_damaged(root: Path, config: ClusterConfig) -> Path | None:
    """Before a restore: rename a SQLite metadata file that cannot be read (with its WAL and
    shared-memory files) to ``metadata.db.damaged-<time>``, so that a new one takes its place
    and the damaged one stays for a post-mortem. Returns where it went, or None when the file
    reads (or is missing, or the metadata is in PostgreSQL)."""
    path = _sqlite_file(root, config)
    if path is None:
        return None
    kv = SQLiteKV(path, synchronous="normal")
    try:
        await read_cluster_id(kv)
        await kv.scan(b"", limit=1)
        return None
    except OSError as e:
        if e.errno != errno.EIO:
            raise
    finally:
        await kv.close()
    return _move_aside(path)


def _sqlite_file(root: Path, config: ClusterConfig) -> Path | None:
    path = root / METADATA_FILE
    return path if not config.metadata and path.exists() else None


def _move_aside(path: Path) -> Path:
    aside = path.with_name(f"{METADATA_FILE}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(str(path) + suffix)
        if src.exists():
            os.replace(src, Path(str(aside) + suffix))
    return aside


__all__ = [
    "RESTORE_HINT",
    "adopt_if_empty",
    "check_metadata",
    "check_store",
    "check_missing_file",
    "init_metadata",
    "set_aside_damaged",
    "where",
]
