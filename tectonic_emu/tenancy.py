"""Tenants as a cluster's users manage them: ``client.tenants`` and ``tectonic-emu tenant``.

A tenant owns namespaces (directories made for it, empty) and has quotas on files and bytes;
what it uses is charged in the metadata transactions themselves
(``tectonic_emu/metadata/tenants.py`` says what counts and when a quota is checked). Here:
make a tenant with its namespaces, list tenants with their usage, change quotas, remove a
tenant whose namespaces are empty, and recount a tenant's usage from the records (a check
that the charges kept it exact).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from tectonic_emu import attrs, clock
from tectonic_emu.errors import (
    AlreadyExistsError,
    CrossTenantError,
    DirectoryNotEmptyError,
    InvalidArgumentError,
    NotFoundError,
)
from tectonic_emu.metadata.layers import MetaTxn, new_id
from tectonic_emu.metadata.records import ROOT_DIR_ID, TenantRecord
from tectonic_emu.namespace import Namespace
from tectonic_emu.paths import join_path, split_path

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
Keep = Literal["keep"]


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant as ``Tenants`` reports it: its namespaces by path, quotas (None: no limit),
    and usage (files and directories, stored bytes)."""

    name: str
    namespaces: tuple[str, ...]
    quota_files: int | None
    quota_bytes: int | None
    files_used: int
    bytes_used: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "namespaces": list(self.namespaces),
            "quota_files": self.quota_files,
            "quota_bytes": self.quota_bytes,
            "files_used": self.files_used,
            "bytes_used": self.bytes_used,
        }


def check_name(name: object) -> str:
    """A tenant name: 1 to 64 letters, digits, '.', '_' or '-', not starting with a mark."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"a tenant's name is 1 to 64 letters, digits, '.', '_' or '-', not {name!r}"
        )
    return name


def check_quota(what: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"a quota of {what} is a count of at least 0, not {value!r}")
    return value


class Tenants:
    """The tenants of the cluster a client (``ns``) reaches."""

    def __init__(self, ns: Namespace) -> None:
        self._client = ns

    async def create(
        self,
        name: str,
        namespaces: Sequence[str],
        *,
        quota_files: int | None = None,
        quota_bytes: int | None = None,
    ) -> Tenant:
        """Make tenant ``name`` and a new, empty directory at each of ``namespaces`` for it,
        in one transaction. Each namespace's parent must exist outside every tenant's
        namespace. Raises AlreadyExistsError (the tenant, or something at a path),
        NotFoundError (a parent), CrossTenantError (a parent inside a namespace),
        InvalidArgumentError, QuotaExceededError (a quota of files below the namespaces)."""
        check_name(name)
        quota_files = check_quota("files", quota_files)
        quota_bytes = check_quota("bytes", quota_bytes)
        if isinstance(namespaces, str) or not namespaces:
            raise InvalidArgumentError("a tenant needs at least one namespace (a path)")
        paths = [join_path(split_path(p)) for p in namespaces]
        if len(set(paths)) < len(paths):
            raise InvalidArgumentError("the same namespace twice")
        client, now = self._client, clock.wall()
        async with client.meta.transaction() as m:
            if await m.tenants.by_name(name) is not None:
                raise AlreadyExistsError(f"tenant {name} exists")
            rec = TenantRecord(new_id(), name, (), quota_files, quota_bytes)
            await m.tenants.put(rec)
            made = []
            for path in paths:
                parts = split_path(path)
                if not parts:
                    raise InvalidArgumentError("the root cannot be a tenant's namespace", "/")
                parent, _ = await client._walk(m, parts[:-1], path=path)
                if (await client._dir(m, parent)).tenant:
                    raise CrossTenantError("inside a tenant's namespace", path)
                if await m.names.lookup(parent, parts[-1]) is not None:
                    raise AlreadyExistsError("a namespace must be made new", path)
                made.append(
                    await client._new_dir(
                        m, parent, parts[-1], None, None, now, tenant=rec.tenant_id
                    )
                )
            rec = replace(await self._record(m, name), namespaces=tuple(made))  # charged
            await m.tenants.update(rec)
            return await self._view(m, rec)

    async def list(self) -> list[Tenant]:
        """Every tenant, by name."""
        async with self._client.meta.view() as m:
            return [await self._view(m, r) for r in sorted(await m.tenants.all(), key=_name)]

    async def get(self, name: str) -> Tenant:
        """One tenant. Raises NotFoundError."""
        async with self._client.meta.view() as m:
            return await self._view(m, await self._record(m, check_name(name)))

    async def set_quota(
        self,
        name: str,
        *,
        files: int | Keep | None = "keep",
        nbytes: int | Keep | None = "keep",
    ) -> Tenant:
        """Change a tenant's quotas (None: no limit; "keep": as it is). A quota below what
        the tenant uses is allowed: it may then only shrink. Raises NotFoundError,
        InvalidArgumentError."""
        check_name(name)
        qf = None if files == "keep" else check_quota("files", files)
        qb = None if nbytes == "keep" else check_quota("bytes", nbytes)
        async with self._client.meta.transaction() as m:
            rec = await self._record(m, name)
            rec = replace(
                rec,
                quota_files=rec.quota_files if files == "keep" else qf,
                quota_bytes=rec.quota_bytes if nbytes == "keep" else qb,
            )
            await m.tenants.update(rec)
            return await self._view(m, rec)

    async def remove(self, name: str) -> None:
        """Remove a tenant and its namespaces' directories, which must be empty. Raises
        NotFoundError, DirectoryNotEmptyError."""
        check_name(name)
        client, now = self._client, clock.wall()
        async with client.meta.transaction() as m:
            rec = await self._record(m, name)
            for dir_id in rec.namespaces:
                if await m.names.entries(dir_id, limit=1):
                    path = await self._path(m, dir_id)
                    raise DirectoryNotEmptyError(f"tenant {name}'s namespace is not empty", path)
            for dir_id in rec.namespaces:
                d = await client._dir(m, dir_id)
                await m.names.unlink(d.parent, d.name)
                await m.drop_dir(dir_id)
                await attrs.touch_dir(m, d.parent, now, subdirs_added=-1)
            await m.tenants.delete(await self._record(m, name))

    async def recount(self, name: str) -> tuple[int, int]:
        """(files, bytes) of the tenant counted from every file and directory record, not
        from its usage: what the charges must have kept its usage equal to (with nothing
        changing meanwhile: the records are read in batches)."""
        tenant_id = (await self._by_name(name)).tenant_id
        files = nbytes = 0
        async for f in self._client.meta.iter_files():
            if f.tenant == tenant_id:
                files, nbytes = files + f.named, nbytes + f.stored
        async for d in self._client.meta.iter_dirs():
            files += d.tenant == tenant_id
        return files, nbytes

    async def _by_name(self, name: str) -> TenantRecord:
        async with self._client.meta.view() as m:
            return await self._record(m, check_name(name))

    @staticmethod
    async def _record(m: MetaTxn, name: str) -> TenantRecord:
        rec = await m.tenants.by_name(name)
        if rec is None:
            raise NotFoundError(f"no tenant {name}")
        return rec

    async def _view(self, m: MetaTxn, rec: TenantRecord) -> Tenant:
        paths = tuple([await self._path(m, d) for d in rec.namespaces])
        return Tenant(
            rec.name, paths, rec.quota_files, rec.quota_bytes, rec.files_used, rec.bytes_used
        )

    async def _path(self, m: MetaTxn, dir_id: int) -> str:
        """A directory's path, from its record up (its ancestors may have been renamed)."""
        names: list[str] = []
        while dir_id != ROOT_DIR_ID:
            d = await self._client._dir(m, dir_id)
            names.append(d.name)
            dir_id = d.parent
        return join_path(names[::-1])


def _name(rec: TenantRecord) -> str:
    return rec.name


__all__ = ["Keep", "Tenant", "Tenants", "check_name", "check_quota"]
