"""The backends of ``bench metadata``: each measured operation (mkdir, create, stat, list,
delete, rmdir) on one metadata backend (``MetaOps``), and per backend name a factory that sets
one up in a fresh directory and tears it down (``BACKEND_FACTORIES``).

The backends:

- ``sqlite``: a real cluster (``Cluster.create`` + ``Cluster.open``), SQLite WAL with
  ``synchronous=FULL``: every metadata commit is durable when it returns (group commit);
- ``sqlite-nosync``: the same with the cluster's ``sync=False``: SQLite ``synchronous=NORMAL``,
  commits reach the page cache only (a machine crash may lose the last ones);
- ``memory``: the same cluster with its metadata in ``MemoryKV`` (``Cluster.open(kv=...)``):
  nothing durable, the cost of the client and the layers alone;
- ``postgresql``: a real cluster whose metadata is in PostgreSQL (``cluster create
  --metadata``), every commit durable (group commit: synchronous flushes shared). The server is
  the one at ``postgres_url`` (a fresh table in it), or else a throwaway server on loopback
  that the bench starts and removes (``bench/postgres.py``, PostgreSQL's defaults, fsync on).
  Measured by default where PostgreSQL is installed or a URL is given;
- ``mount`` (opt-in, needs FUSE): the ``sqlite`` cluster through a FUSE mount in a child
  process, with ``min(ranks, 32)`` threads doing ``os.open(O_CREAT)``+``close``, ``os.stat``,
  ``os.listdir`` and ``os.unlink``. The kernel caches attributes for 1 s, so a stat may not
  reach the mount;
- ``juicefs`` (opt-in): JuiceFS through FUSE, its metadata in SQLite;
- ``fuse-floor``, ``fuse-raw-floor`` (opt-in, need FUSE; the raw one root): the same calls on
  Python FUSE daemons that store nothing (``bench/fuse_floor.py``), through mfusepy as the
  mount is built, and speaking the kernel's protocol on one event loop: the floor under the
  mount's rates.
"""

from __future__ import annotations

import abc
import asyncio
import os
import stat as stat_mod
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from bench import postgres
from tectonic_emu import Client, Cluster
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.metadata import MemoryKV

NODES = 3  # a cluster needs nodes; empty files never touch them
MOUNT_THREADS = 32
_T = TypeVar("_T")


class VerificationError(RuntimeError):
    """The backend did not do what the bench asked (a missing name, a leftover file)."""


# -- the operations, per backend -----------------------------------------------------------------
class MetaOps(abc.ABC):
    """The measured operations on one backend, plus the untimed setup around them.
    Paths are absolute in the cluster's namespace (``/mdtest/...``)."""

    durability: str

    @abc.abstractmethod
    def set_ranks(self, ranks: int) -> None:
        """Called before the runs of ``ranks`` ranks (the mount sizes its thread pool)."""

    @abc.abstractmethod
    async def mkdir(self, path: str) -> None: ...

    @abc.abstractmethod
    async def rmdir(self, path: str) -> None: ...

    @abc.abstractmethod
    async def create(self, path: str) -> None:
        """Make an empty file."""

    @abc.abstractmethod
    async def stat(self, path: str) -> None:
        """Stat ``path``; raise VerificationError unless it is an empty file."""

    @abc.abstractmethod
    async def listdir(self, path: str) -> list[str]: ...

    @abc.abstractmethod
    async def delete(self, path: str) -> None: ...

    @abc.abstractmethod
    async def files_left(self) -> int:
        """File records in the cluster, named or not (0 once everything is deleted)."""


class ClientOps(MetaOps):
    """The native async client."""

    def __init__(self, client: Client, durability: str) -> None:
        self.client = client
        self.durability = durability

    def set_ranks(self, ranks: int) -> None:
        pass  # ranks are tasks on this event loop: nothing to size

    async def mkdir(self, path: str) -> None:
        await self.client.mkdir(path)

    async def rmdir(self, path: str) -> None:
        await self.client.delete(path)

    async def create(self, path: str) -> None:
        writer = await self.client.open_writer(path)
        await writer.close()

    async def stat(self, path: str) -> None:
        st = await self.client.stat(path)
        if st.kind != "file" or st.size != 0:
            raise VerificationError(f"{path}: not an empty file ({st.kind}, {st.size} B)")

    async def listdir(self, path: str) -> list[str]:
        return await self.client.listdir(path)

    async def delete(self, path: str) -> None:
        await self.client.delete(path)

    async def files_left(self) -> int:
        return sum([1 async for _ in self.client.meta.iter_files()])


class MountOps(MetaOps):
    """POSIX calls through a FUSE mount, on a pool of ``min(ranks, 32)`` threads; the
    cluster's own client (opened beside the mount) only counts what is left."""

    durability = "the sqlite cluster through FUSE (kernel attribute cache 1 s)"

    def __init__(self, mountpoint: Path, client: Client) -> None:
        self.mountpoint = mountpoint
        self.client = client
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mdtest-mount")

    def set_ranks(self, ranks: int) -> None:
        self.pool.shutdown()
        self.pool = ThreadPoolExecutor(min(ranks, MOUNT_THREADS), thread_name_prefix="mdtest")

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _local(self, path: str) -> str:
        return str(self.mountpoint) + path

    async def mkdir(self, path: str) -> None:
        await self._call(os.mkdir, self._local(path))

    async def rmdir(self, path: str) -> None:
        await self._call(os.rmdir, self._local(path))

    async def create(self, path: str) -> None:
        await self._call(_create_empty, self._local(path))

    async def stat(self, path: str) -> None:
        st = await self._call(os.stat, self._local(path))
        if not stat_mod.S_ISREG(st.st_mode) or st.st_size != 0:
            raise VerificationError(f"{path}: not an empty file (mode {st.st_mode:o})")

    async def listdir(self, path: str) -> list[str]:
        return await self._call(os.listdir, self._local(path))

    async def delete(self, path: str) -> None:
        await self._call(os.unlink, self._local(path))

    async def files_left(self) -> int:
        return sum([1 async for _ in self.client.meta.iter_files()])


class PeerMountOps(MountOps):
    """POSIX calls through another file system's FUSE mount (``bench/peers.py``); what is
    left is counted by walking the mount."""

    def __init__(self, mountpoint: Path, durability: str) -> None:
        self.mountpoint = mountpoint
        self.durability = durability
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mdtest-peer")

    async def files_left(self) -> int:
        def count() -> int:
            return sum(len(files) for _, _, files in os.walk(self.mountpoint))

        return await self._call(count)


def _create_empty(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


# -- backends: name -> factory of MetaOps in a fresh directory ---------------------------------
BackendFactory = Callable[[Path], AbstractAsyncContextManager[MetaOps]]


@asynccontextmanager
async def _sqlite_backend(work: Path, *, sync: bool) -> AsyncIterator[MetaOps]:
    root = work / "cluster"
    Cluster.create(root, nodes=NODES, encoding="r1", sync=sync)
    durability = (
        "SQLite WAL, synchronous=FULL: every commit durable (group commit: fsyncs shared)"
        if sync
        else "SQLite WAL, synchronous=NORMAL: commits in the page cache only"
    )
    async with Cluster.open(root) as cluster:
        yield ClientOps(cluster.client(), durability)


@asynccontextmanager
async def _memory_backend(work: Path) -> AsyncIterator[MetaOps]:
    # The same cluster with its metadata in MemoryKV: what the layers above the seam cost.
    root = work / "cluster"
    Cluster.create(root, nodes=NODES, encoding="r1", sync=False)
    async with Cluster.open(root, kv=MemoryKV()) as cluster:
        yield ClientOps(cluster.client(), "MemoryKV: nothing durable")


@asynccontextmanager
async def _mount_backend(work: Path) -> AsyncIterator[MetaOps]:
    from fuse_mount.mount import start_mount, unmount

    root, mnt = work / "cluster", work / "mnt"
    Cluster.create(root, nodes=NODES, encoding="r1")
    mnt.mkdir()
    proc = await asyncio.to_thread(start_mount, root, mnt, log=work / "mount.log")
    try:
        async with Cluster.open(root) as cluster:
            ops = MountOps(mnt, cluster.client())
            try:
                yield ops
            finally:
                ops.pool.shutdown()
    finally:
        await asyncio.to_thread(unmount, mnt)
        await asyncio.to_thread(proc.wait, 30)


@asynccontextmanager
async def _juicefs_backend(work: Path) -> AsyncIterator[MetaOps]:
    # JuiceFS with its metadata in SQLite, as ours: the peer a mount user would pick.
    from bench import peers

    with peers.mounted("juicefs", work / "juicefs") as mnt:
        ops = PeerMountOps(mnt, "JuiceFS through FUSE, SQLite metadata (its defaults)")
        try:
            yield ops
        finally:
            ops.pool.shutdown()


@asynccontextmanager
async def _floor_backend(work: Path, kind: str) -> AsyncIterator[MetaOps]:
    # A Python FUSE daemon that stores nothing (bench/fuse_floor.py): the mount's floor.
    from bench import fuse_floor

    mnt = work / "mnt"
    mnt.mkdir()
    proc = await asyncio.to_thread(fuse_floor.start, kind, mnt, work / "floor.log")
    try:
        ops = PeerMountOps(mnt, fuse_floor.DESCRIPTION[kind])
        try:
            yield ops
        finally:
            ops.pool.shutdown()
    finally:
        await asyncio.to_thread(fuse_floor.stop, proc, mnt)


@asynccontextmanager
async def postgres_backend(work: Path, url: str | None = None) -> AsyncIterator[MetaOps]:
    server = None
    if url is None:
        found = postgres.bin_dir()
        if found is None:
            raise InvalidArgumentError(
                "no PostgreSQL server here to start (apt-get install postgresql), and no "
                "--postgres URL given"
            )
        server = await asyncio.to_thread(postgres.PostgresServer(found).start)
        url = server.url
    try:
        root = work / "cluster"
        table = f"bench_{os.getpid()}_{int(time.time() * 1000)}"
        await asyncio.to_thread(
            Cluster.create, root, nodes=NODES, encoding="r1", metadata=url, metadata_table=table
        )
        durability = (
            "PostgreSQL, synchronous_commit: every commit durable (group commit: flushes "
            f"shared){'; a throwaway server on loopback' if server else ''}"
        )
        async with Cluster.open(root) as cluster:
            yield ClientOps(cluster.client(), durability)
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)


BACKEND_FACTORIES: dict[str, BackendFactory] = {
    "sqlite": lambda work: _sqlite_backend(work, sync=True),
    "sqlite-nosync": lambda work: _sqlite_backend(work, sync=False),
    "memory": _memory_backend,
    "postgresql": postgres_backend,
    "mount": _mount_backend,
    "juicefs": _juicefs_backend,
    "fuse-floor": lambda work: _floor_backend(work, "mfusepy"),
    "fuse-raw-floor": lambda work: _floor_backend(work, "raw"),
}
BACKENDS: tuple[str, ...] = tuple(BACKEND_FACTORIES)
DEFAULT_BACKENDS = ("sqlite", "sqlite-nosync", "memory")  # mount, juicefs need FUSE: opt-in


def default_backends() -> tuple[str, ...]:
    """DEFAULT_BACKENDS, and ``postgresql`` where its server is installed."""
    return DEFAULT_BACKENDS + (("postgresql",) if postgres.bin_dir() is not None else ())


__all__ = [
    "BACKENDS",
    "BACKEND_FACTORIES",
    "DEFAULT_BACKENDS",
    "BackendFactory",
    "ClientOps",
    "MetaOps",
    "MountOps",
    "PeerMountOps",
    "VerificationError",
    "default_backends",
    "postgres_backend",
]
