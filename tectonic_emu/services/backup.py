"""Metadata backups into the cluster's own storage nodes: take, list, restore, retire.

A backup is a metadata dump (``metadata/snapshot.py``) cut into parts of at most one chunk
(``part_size``, the cluster's chunk size: what a served node takes in one write), each part a
chunk replicated on ``COPIES`` distinct nodes, plus a small manifest chunk written last::

    mb-<id>-p00000 .. mb-<id>-pNNNNN    the dump's bytes, in order
    mb-<id>-m                           {"format", "id", "created", "cluster_id", "keys",
                                         "nbytes", "sha256", "parts"}

``<id>`` is the UTC time the backup was taken (``20261201t231500123z``) and 4 random hex
digits, so ids sort by age. Nodes check every part's CRC32C on read, and the manifest's
SHA-256 covers the whole dump. Finding backups needs no metadata: ``list_backups`` lists the
nodes' chunks. Garbage collection leaves every ``mb-`` chunk alone (no block references it).

Who takes them: the ``serve`` supervisor's ``backup_loop`` for a served cluster; for an
embedded one, ``Cluster.open`` when its owner closes it and the last backup is older than the
interval (``backup_due``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import BinaryIO

from tectonic_emu import clock
from tectonic_emu.chunkstore.base import StorageNode, stored_bytes
from tectonic_emu.coding import Encoding
from tectonic_emu.coding.checksum import crc32c
from tectonic_emu.errors import (
    ChunkCorruptError,
    ChunkNotFoundError,
    DataUnavailableError,
    NodeUnavailableError,
    NotEnoughNodesError,
    NotFoundError,
)
from tectonic_emu.metadata.kv import KVStore
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.metadata.snapshot import SnapshotInfo, dump, load

log = logging.getLogger(__name__)

PREFIX = "mb-"
COPIES = 3
MANIFEST_FORMAT = 1
# When this process last backed the store up: {"id", "created"}; read to decide if one is due.
BACKUP_KEY = b"M\x00backup"

Listing = dict[str, list[tuple[int, int]]]  # chunk id -> [(node, disk)] holding it


@dataclass(frozen=True, slots=True)
class BackupInfo:
    """One backup as its manifest and the nodes' listings describe it."""

    id: str
    created: float
    cluster_id: str
    keys: int
    nbytes: int
    sha256: str
    parts: int
    complete: bool  # the manifest and at least one copy of every part are on live nodes
    copies: int  # the fewest copies of any of its chunks found

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _stamp(now: float) -> str:
    ms = round(now * 1000) % 1000
    return time.strftime("%Y%m%dt%H%M%S", time.gmtime(now)) + f"{ms:03d}z"


def _manifest_id(backup_id: str) -> str:
    return f"{PREFIX}{backup_id}-m"


def _part_id(backup_id: str, n: int) -> str:
    return f"{PREFIX}{backup_id}-p{n:05d}"


def _split(chunk_id: str) -> tuple[str, str] | None:
    """``mb-<id>-m`` -> (id, "m"); ``mb-<id>-p00003`` -> (id, "p00003"); else None."""
    if not chunk_id.startswith(PREFIX):
        return None
    backup_id, sep, what = chunk_id[len(PREFIX) :].rpartition("-")
    return (backup_id, what) if sep and backup_id else None


async def list_chunks(nodes: Sequence[StorageNode]) -> Listing:
    """Every chunk on every live node's disks (a node going down meanwhile is skipped)."""

    async def one(node: StorageNode, disk: int) -> list[tuple[str, int, int]]:
        with contextlib.suppress(NodeUnavailableError):
            return [(c.chunk_id, node.node_id, disk) for c in await node.list_chunks(disk)]
        return []

    jobs = [one(n, d) for n in nodes if n.available for d in range(n.disks)]
    found: Listing = {}
    for rows in await asyncio.gather(*jobs):
        for chunk_id, node_id, disk in rows:
            found.setdefault(chunk_id, []).append((node_id, disk))
    return found


async def _read(
    nodes: Sequence[StorageNode], places: list[tuple[int, int]], chunk_id: str
) -> bytes:
    """A chunk's bytes from the first copy that reads back intact."""
    why = "no copy on a live node"
    for node_id, disk in places:
        try:
            data, _ = await nodes[node_id].read_chunk(disk, chunk_id)
            return bytes(stored_bytes(data, node_id))
        except (NodeUnavailableError, ChunkNotFoundError, ChunkCorruptError) as e:
            why = str(e) or type(e).__name__
    raise DataUnavailableError(f"no good copy of {chunk_id} ({why})")


async def list_backups(
    nodes: Sequence[StorageNode], listing: Listing | None = None
) -> list[BackupInfo]:
    """Every backup whose manifest a live node holds, newest first. A manifest no copy of
    which reads back is left out."""
    listing = await list_chunks(nodes) if listing is None else listing
    out: list[BackupInfo] = []
    for chunk_id, places in listing.items():
        split = _split(chunk_id)
        if split is None or split[1] != "m":
            continue
        try:
            man = json.loads(await _read(nodes, places, chunk_id))
            parts = int(man["parts"])
            info = BackupInfo(
                str(man["id"]),
                float(man["created"]),
                str(man["cluster_id"]),
                int(man["keys"]),
                int(man["nbytes"]),
                str(man["sha256"]),
                parts,
                False,
                0,
            )
        except (DataUnavailableError, ValueError, KeyError, TypeError) as e:
            log.warning("metadata backup manifest %s unreadable: %s", chunk_id, e)
            continue
        held = [len(listing.get(_part_id(info.id, n), ())) for n in range(parts)]
        copies = min([len(places), *held])
        out.append(replace(info, complete=copies > 0, copies=copies))
    out.sort(key=lambda b: b.id, reverse=True)
    return out


def _placement(nodes: Sequence[StorageNode], n: int) -> list[tuple[StorageNode, int]]:
    """Where part (or manifest) ``n`` goes: ``COPIES`` distinct live nodes (all of them on a
    smaller cluster), rotating so that parts spread."""
    live = [node for node in nodes if node.available]
    want = min(COPIES, len(nodes))
    if len(live) < want:
        raise NotEnoughNodesError(
            f"a metadata backup needs {want} live nodes for its copies, {len(live)} are live"
        )
    start = n % len(live)
    chosen = [live[(start + i) % len(live)] for i in range(want)]
    return [(node, (n + i) % node.disks) for i, node in enumerate(chosen)]


async def _put(nodes: Sequence[StorageNode], n: int, chunk_id: str, data: bytes) -> None:
    crc = crc32c(data)
    await asyncio.gather(
        *(node.write_chunk(disk, chunk_id, data, crc32c=crc) for node, disk in _placement(nodes, n))
    )


async def _delete(nodes: Sequence[StorageNode], listing: Listing, chunk_ids: list[str]) -> None:
    for chunk_id in chunk_ids:
        for node_id, disk in listing.get(chunk_id, ()):
            with contextlib.suppress(NodeUnavailableError):
                await nodes[node_id].delete_chunk(disk, chunk_id)


async def take_backup(
    nodes: Sequence[StorageNode],
    kv: KVStore,
    *,
    part_size: int,
    now: float | None = None,
) -> BackupInfo:
    """Dump ``kv`` (one consistent snapshot) and store it on ``nodes`` as a new backup.

    The dump is spooled to a local temporary file first, so the store's transaction never
    spans network I/O. Raises NotEnoughNodesError with fewer live nodes than copies, and the
    nodes' errors (NodeUnavailableError, NoSpaceError); a failed backup leaves no manifest
    (its parts are deleted, as far as the nodes answer)."""
    now = clock.wall() if now is None else now
    backup_id = f"{_stamp(now)}-{secrets.token_hex(2)}"
    written: list[str] = []
    with tempfile.TemporaryFile(prefix="tectonic-backup-") as spool:
        snap = await dump(kv, spool, created=now)
        spool.seek(0)
        parts = 0
        sha = hashlib.sha256()  # of the parts as stored: what a restore checks
        try:
            while chunk := spool.read(part_size):
                sha.update(chunk)
                cid = _part_id(backup_id, parts)
                written.append(cid)
                await _put(nodes, parts, cid, chunk)
                parts += 1
            manifest = {
                "format": MANIFEST_FORMAT,
                "id": backup_id,
                "created": now,
                "cluster_id": snap.cluster_id,
                "keys": snap.keys,
                "nbytes": snap.nbytes,
                "sha256": sha.hexdigest(),
                "parts": parts,
            }
            written.append(_manifest_id(backup_id))
            await _put(nodes, parts, _manifest_id(backup_id), json.dumps(manifest).encode())
        except BaseException:
            with contextlib.suppress(Exception):
                await _delete(nodes, await list_chunks(nodes), written)
            raise
    async with kv.transaction() as txn:
        await txn.put(BACKUP_KEY, json.dumps({"id": backup_id, "created": now}).encode())
    copies = min(COPIES, len(nodes))
    return BackupInfo(
        backup_id,
        now,
        snap.cluster_id,
        snap.keys,
        snap.nbytes,
        sha.hexdigest(),
        parts,
        True,
        copies,
    )


async def prune(nodes: Sequence[StorageNode], *, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` complete backups, and the parts of any backup older
    than the oldest one kept that never got its manifest. Returns the ids removed. A manifest
    goes before its parts, so a half-deleted backup is never taken for a whole one."""
    listing = await list_chunks(nodes)
    backups = [b for b in await list_backups(nodes, listing) if b.complete]
    kept = backups[:keep]
    if not kept:
        return []
    oldest = kept[-1].id
    kept_ids = {b.id for b in kept}
    doomed: dict[str, list[str]] = {}
    for chunk_id in listing:
        split = _split(chunk_id)
        if split is not None and split[0] not in kept_ids and split[0] < oldest:
            doomed.setdefault(split[0], []).append(chunk_id)
    for _, chunk_ids in sorted(doomed.items()):
        chunk_ids.sort(key=lambda c: not c.endswith("-m"))  # the manifest first
        await _delete(nodes, listing, chunk_ids)
    return sorted(doomed)


async def fetch_backup(
    nodes: Sequence[StorageNode], info: BackupInfo, dest: BinaryIO, listing: Listing
) -> None:
    """Write backup ``info``'s dump to ``dest``, checked against its manifest's SHA-256.
    Raises DataUnavailableError for a part that no copy returns intact or a checksum that
    does not match."""
    sha = hashlib.sha256()
    total = 0
    for n in range(info.parts):
        cid = _part_id(info.id, n)
        data = await _read(nodes, listing.get(cid, []), cid)
        sha.update(data)
        total += len(data)
        dest.write(data)
    if total != info.nbytes or sha.hexdigest() != info.sha256:
        raise DataUnavailableError(f"backup {info.id} does not match its manifest's checksum")


async def restore(
    nodes: Sequence[StorageNode],
    kv: KVStore,
    *,
    cluster_id: str,
    backup_id: str | None = None,
) -> tuple[BackupInfo, SnapshotInfo, list[str]]:
    """Replace what ``kv`` holds by the newest complete, checksum-valid backup of this cluster
    (or the one named ``backup_id``). Returns the backup, its dump's summary, and one line for
    every newer backup skipped and why. Raises NotFoundError when no backup qualifies."""
    listing = await list_chunks(nodes)
    backups = [b for b in await list_backups(nodes, listing) if b.cluster_id == cluster_id]
    if backup_id is not None:
        backups = [b for b in backups if b.id == backup_id]
        if not backups:
            raise NotFoundError(f"no backup {backup_id} of this cluster on its live nodes")
    skipped: list[str] = []
    for info in backups:
        if not info.complete:
            skipped.append(f"{info.id}: incomplete (a part has no copy on a live node)")
            continue
        with tempfile.TemporaryFile(prefix="tectonic-restore-") as spool:
            try:
                await fetch_backup(nodes, info, spool, listing)
            except DataUnavailableError as e:
                skipped.append(f"{info.id}: {e}")
                if backup_id is not None:
                    raise
                continue
            spool.seek(0)
            snap = await load(kv, spool, replace=True, cluster_id=cluster_id)
            return info, snap, skipped
    raise NotFoundError(
        "no complete backup of this cluster on its live nodes"
        + (f" ({'; '.join(skipped)})" if skipped else "")
    )


@dataclass(frozen=True, slots=True)
class Unaccounted:
    """What the nodes and a (restored) namespace disagree on."""

    chunks: int  # chunk files no block references, written since the backup: lost writes
    nbytes: int
    older: int  # chunk files no block references, from before it (garbage, or in flight then)
    blocks_lost: int  # blocks too few of whose chunks are on the nodes to read


async def unaccounted(nodes: Sequence[StorageNode], meta: Metadata, *, since: float) -> Unaccounted:
    """Compare the nodes' chunks with the Block layer, after a restore of a backup taken at
    ``since``: chunks no block references and written since then are the writes lost with
    the newer metadata; blocks without enough chunks to read are files deleted (and
    collected) after the backup."""
    unnamed: dict[tuple[int, int, str], tuple[int, float]] = {}
    for node in nodes:
        if not node.available:
            continue
        for d in range(node.disks):
            with contextlib.suppress(NodeUnavailableError):
                for c in await node.list_chunks(d):
                    if not c.chunk_id.startswith(PREFIX):
                        unnamed[(node.node_id, d, c.chunk_id)] = (c.stored_len, c.mtime)
    present = set(unnamed)
    lost = 0
    async for rec in meta.iter_blocks():
        where = [(p.node, p.disk, p.chunk_id) for p in rec.chunks]
        need = Encoding.parse(rec.encoding).data  # 1 for replicas
        if rec.length > 0 and sum(w in present for w in where) < need:
            lost += 1
        for w in where:
            unnamed.pop(w, None)
    newer = [size for size, mtime in unnamed.values() if mtime >= since]
    return Unaccounted(len(newer), sum(newer), len(unnamed) - len(newer), lost)


async def backup_due(kv: KVStore, *, interval: float, since: float, now: float) -> bool:
    """Whether a backup is due: backups are on and the last one this store records (or
    ``since``, the cluster's creation, before the first) is ``interval`` seconds old."""
    if interval <= 0:
        return False
    last = since
    raw = await kv.get(BACKUP_KEY)
    if raw is not None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            last = max(last, float(json.loads(raw)["created"]))
    return now - last >= interval


async def backup_loop(
    nodes: Sequence[StorageNode],
    kv: KVStore,
    *,
    interval: float,
    keep: int,
    part_size: int,
    since: float,
) -> None:
    """The served cluster's backups: every ``interval`` seconds (checked at least once a
    minute), a backup and retirement of all but ``keep``. A failed pass is logged and tried
    again at the next check. Runs until cancelled."""
    check = min(interval, 60.0)
    while True:
        try:
            if await backup_due(kv, interval=interval, since=since, now=clock.wall()):
                info = await take_backup(nodes, kv, part_size=part_size)
                removed = await prune(nodes, keep=keep)
                log.info(
                    "metadata backup %s: %d keys, %d bytes; retired %d",
                    info.id,
                    info.keys,
                    info.nbytes,
                    len(removed),
                )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the next check tries again
            log.warning("metadata backup failed: %s", e)
        await asyncio.sleep(check)


__all__ = [
    "BACKUP_KEY",
    "COPIES",
    "PREFIX",
    "BackupInfo",
    "Unaccounted",
    "backup_due",
    "backup_loop",
    "fetch_backup",
    "list_backups",
    "list_chunks",
    "prune",
    "restore",
    "take_backup",
    "unaccounted",
]
