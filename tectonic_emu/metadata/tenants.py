"""Tenants: namespaces with quotas on files and bytes, charged inside the metadata
transactions that change what they count.

A tenant owns one or more *namespaces*: directories made for it by ``Tenants.create``
(``tectonic_emu/tenancy.py``), empty then. Every directory and file made below one carries
the tenant's id (``DirRecord.tenant``, ``FileRecord.tenant``), given at creation from its
parent directory (a nameless new version: from the file it will replace) and never changed:
a rename or a hard link across namespaces fails with EXDEV (``CrossTenantError``), as across
XFS project quotas, so ``mv`` copies and deletes instead.

**What a tenant's usage counts**: its named files and its directories, one each (a hard
link counts once, a namespace's own directory counts; a new version being written, or an
unlinked file still open, has no name yet or any more), and the stored bytes of all its
files, named or not: their size less their holes, whatever the encoding stores on the
nodes. So a rewrite (a new version swapped in) needs no spare file, but room for both
versions' bytes until the swap, as on a copy-on-write file system. The layers charge it where
records change (``FileLayer.put`` and ``delete``, ``NameLayer.put_dir`` and
``delete_dir``), in the same transaction: a crash keeps the change and its charge, or
neither, so usage stays equal to a recount (``Tenants.recount``) under concurrent writers
and after crashes. A transaction that leaves a tenant with more files or bytes than it
had and than its quota allows raises ``QuotaExceededError`` (EDQUOT) as it ends, and commits
nothing (its net change counts: a rewrite freeing what it adds passes); freeing never fails.
A writer's block is charged when it commits, so a write past the quota fails at the block
commit that would cross it, its chunks deleted, the blocks before it kept.

Keys (beside the layers' in ``layers.py``)::

    Tenant  T | tenant_id   -> TenantRecord
    Tenant  t | name        -> tenant_id (8 bytes)
"""

from __future__ import annotations

import struct
from dataclasses import replace

from tectonic_emu.errors import QuotaExceededError
from tectonic_emu.metadata.kv import Transaction
from tectonic_emu.metadata.records import TenantRecord

_U64 = struct.Struct(">Q")
TENANT_TAG = b"T"
NAME_TAG = b"t"


def tenant_key(tenant_id: int) -> bytes:
    return TENANT_TAG + _U64.pack(tenant_id)


def name_key(name: str) -> bytes:
    return NAME_TAG + name.encode()


class TenantLayer:
    """Tenant records in one transaction, each read once and kept decoded (a checkpoint's
    block commits charge the same tenant again and again)."""

    def __init__(self, txn: Transaction) -> None:
        self._txn = txn
        self._kept: dict[int, TenantRecord | None] = {}
        self._before: dict[int, TenantRecord] = {}  # tenants charged: as they were

    async def get(self, tenant_id: int) -> TenantRecord | None:
        if tenant_id not in self._kept:
            raw = await self._txn.get(tenant_key(tenant_id))
            self._kept[tenant_id] = None if raw is None else TenantRecord.decode(tenant_id, raw)
        return self._kept[tenant_id]

    async def by_name(self, name: str) -> TenantRecord | None:
        raw = await self._txn.get(name_key(name))
        return None if raw is None else await self.get(_U64.unpack(raw)[0])

    async def all(self) -> list[TenantRecord]:
        rows = await self._txn.scan(TENANT_TAG)
        return [TenantRecord.decode(_U64.unpack(k[1:])[0], v) for k, v in rows]

    async def put(self, rec: TenantRecord) -> None:
        """Write a new tenant's record and its name's entry."""
        await self.update(rec)
        await self._txn.put(name_key(rec.name), _U64.pack(rec.tenant_id))

    async def update(self, rec: TenantRecord) -> None:
        """Write a tenant's changed record (usage, quotas, namespaces; never its name)."""
        await self._txn.put(tenant_key(rec.tenant_id), rec.encode())
        self._kept[rec.tenant_id] = rec

    async def delete(self, rec: TenantRecord) -> None:
        await self._txn.delete(tenant_key(rec.tenant_id))
        await self._txn.delete(name_key(rec.name))
        self._kept[rec.tenant_id] = None

    async def charge(self, tenant_id: int, files: int, nbytes: int) -> None:
        """Add ``files`` and ``nbytes`` (either may be negative) to the tenant's usage; the
        quotas are checked on the transaction's net change (``check``). A tenant that is
        gone (removed once nothing of it was left) is not charged."""
        if not files and not nbytes:
            return
        rec = await self.get(tenant_id)
        if rec is None:
            return
        self._before.setdefault(tenant_id, rec)
        await self.update(
            replace(rec, files_used=rec.files_used + files, bytes_used=rec.bytes_used + nbytes)
        )

    def check(self) -> None:
        """Raise QuotaExceededError if the transaction leaves a tenant with more files or
        bytes than before and than its quota allows (``Metadata.transaction`` calls it before
        committing: a rewrite that frees as much as it adds passes however near the quota it
        is, and a tenant above a quota lowered under it may still shrink)."""
        for tenant_id, before in self._before.items():
            rec = self._kept[tenant_id]
            if rec is None:
                continue
            if rec.files_used > before.files_used and _over(rec.files_used, rec.quota_files):
                raise QuotaExceededError(
                    f"tenant {rec.name} would have {rec.files_used} files, over its quota of "
                    f"{rec.quota_files}"
                )
            if rec.bytes_used > before.bytes_used and _over(rec.bytes_used, rec.quota_bytes):
                raise QuotaExceededError(
                    f"tenant {rec.name} would store {rec.bytes_used} bytes, over its quota of "
                    f"{rec.quota_bytes}"
                )


def _over(used: int, quota: int | None) -> bool:
    return quota is not None and used > quota


__all__ = ["TenantLayer", "name_key", "tenant_key"]
