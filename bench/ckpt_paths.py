"""The paths of ``bench checkpoint``: each a ``Route`` that saves, loads and deletes one
checkpoint of the payload (``bench/ckpt_workload.py``) its own way, and returns when each rank
finished.

- ``RawRoute``: the disk's limit, the bytes as one file (fio, else pwrite + fdatasync);
- ``NativeRoute``: our ``Checkpointer`` on an embedded cluster (``native/<encoding>``), or on
  one across namespaced hosts (``hosts/<encoding>``, made by ``hosts_cluster``);
- ``FilesRoute``: each rank's files as plain files, on our FUSE mount (``fuse/<encoding>``) or
  on a peer's (``peer/<name>``, set up by ``peer_route``);
- ``TorchSaveRoute`` and ``DcpRoute``: torch.save and DCP, locally, through our plugin and at
  the mount (made by ``torch_routes``).

Routes of blocking calls (``ThreadedRoute``) run their ranks on a shared thread pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.ckpt_workload import Payload, Placed, byte_array
from bench.store import raw_read, raw_write, read_whole, write_durably
from clients.checkpoint import Checkpointer
from tectonic_emu import Client, Cluster
from tectonic_emu.coding import Encoding

STORE_ROOT = "/bench-ckpt"
DEFAULT_PATHS = ("raw", "native", "fuse", "torch.save", "dcp/local", "dcp/plugin", "dcp/fuse")
# Peers whose fsync on the mount leaves the bytes in their own storage's page cache: JuiceFS's
# local-directory object store writes objects without fsync; SeaweedFS's volume servers fsync
# an appended needle only when the upload asks for it, which weed mount's uploads do not.
NOT_DURABLE_AT_FSYNC = ("juicefs", "seaweedfs", "seaweedfs-r3")


def redundancy(encoding: str) -> tuple[int, float]:
    """(failures tolerated, bytes stored per byte) of an encoding."""
    enc = Encoding.parse(encoding)
    return enc.tolerance, enc.overhead


class Route:
    """One way to write and read the checkpoint. ``save``/``load`` return the monotonic time at
    which each rank finished, and the wall end of the whole operation."""

    key: str = ""
    title: str = ""
    tolerates: int = 0
    overhead: float = 1.0
    verified = True  # loads fill the read buffer, checked against the payload

    def __init__(self) -> None:
        self._held: list[tuple[Placed, Any]] = []  # loaded values not yet in the read buffer

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        raise NotImplementedError

    async def load(self, n: int, pl: Payload, shift: int) -> tuple[list[float], float]:
        raise NotImplementedError

    async def remove(self, n: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what the route keeps open (nothing by default)."""

    def hold(self, p: Placed, value: Any) -> None:
        """Keep a loaded value; ``settle`` copies it into the read buffer after the timing."""
        self._held.append((p, value))  # list.append: safe from the worker threads

    def settle(self, pl: Payload) -> None:
        held, self._held = self._held, []
        for p, value in held:
            pl.dst(p)[:] = memoryview(np.asarray(value)).cast("B")


class ThreadedRoute(Route):
    """A route of blocking calls: ranks run ``save_rank``/``load_rank`` on a thread pool."""

    def __init__(self, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        super().__init__()
        self.pool = pool

    def save_rank(self, n: int, rank: int, pl: Payload) -> None:
        raise NotImplementedError

    def load_rank(self, n: int, rank: int, src: int, pl: Payload) -> None:
        raise NotImplementedError

    async def _each_rank(self, job: Callable[[int], None], ranks: int) -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()

        def timed(rank: int) -> float:
            job(rank)
            return time.perf_counter()

        ends = await asyncio.gather(
            *(loop.run_in_executor(self.pool, timed, r) for r in range(ranks))
        )
        return list(ends), time.perf_counter()

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        return await self._each_rank(lambda r: self.save_rank(n, r, pl), pl.plan.ranks)

    async def load(self, n: int, pl: Payload, shift: int) -> tuple[list[float], float]:
        timed = await self._each_rank(
            lambda r: self.load_rank(n, r, pl.source_rank(r, shift), pl), pl.plan.ranks
        )
        self.settle(pl)
        return timed


class FilesRoute(ThreadedRoute):
    """Each rank's files as plain files in ``root/ckpt-<n>/`` (a mount, or a peer's mount).

    ``sync_after``: for a peer whose fsync on the mount does not make the bytes durable in its
    own storage (``NOT_DURABLE_AT_FSYNC``), every save ends with ``sync``, counted in every
    rank's duration, so that all paths are timed to the same durability. JuiceFS's
    local-directory object store, for one, writes each object to a temporary file and renames
    it, never fsyncing (its pkg/object/file.go, ``Put``)."""

    def __init__(
        self,
        pool: concurrent.futures.ThreadPoolExecutor,
        key: str,
        title: str,
        root: Path,
        tolerates: int,
        overhead: float,
        *,
        sync_after: bool = False,
    ) -> None:
        super().__init__(pool)
        self.key, self.title, self.root = key, title, root
        self.tolerates, self.overhead = tolerates, overhead
        self.sync_after = sync_after

    def _dir(self, n: int) -> Path:
        return self.root / f"ckpt-{n}"

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        await asyncio.to_thread(self._dir(n).mkdir, exist_ok=True)
        ends, wall = await super().save(n, pl)
        if self.sync_after:
            await asyncio.to_thread(os.sync)
            wall = time.perf_counter()
            ends = [wall] * len(ends)  # no rank's checkpoint is durable before this
        return ends, wall

    def save_rank(self, n: int, rank: int, pl: Payload) -> None:
        for p in pl.ranks[rank]:
            write_durably(self._dir(n) / p.file.name, pl.src(p))

    def load_rank(self, n: int, rank: int, src: int, pl: Payload) -> None:
        for p in pl.ranks[src]:
            read_whole(self._dir(n) / p.file.name, pl.dst(p))

    async def remove(self, n: int) -> None:
        await asyncio.to_thread(shutil.rmtree, self._dir(n))


class RawRoute(Route):
    """The disk's limit: the checkpoint's bytes as one file, by fio if installed."""

    key, title = "raw", "raw disk"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.file = directory / "raw.bin"
        self.fio = shutil.which("fio")
        self.verified = self.fio is None  # fio reads into its own buffers
        self.title = "raw disk (fio, end_fsync)" if self.fio else "raw disk (pwrite + fdatasync)"

    def _fio(self, rw: str, size: int) -> float:
        assert self.fio is not None
        cmd = [
            self.fio,
            "--name=raw",
            f"--filename={self.file}",
            f"--rw={rw}",
            "--bs=1M",
            f"--size={size}",
            "--ioengine=psync",
            "--output-format=json",
        ]
        cmd += ["--end_fsync=1"] if rw == "write" else []
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        job = json.loads(out[out.index("{") :])["jobs"][0][rw]
        return size / max(job["bw_bytes"], 1)

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        t0 = time.perf_counter()
        if self.fio:
            secs = await asyncio.to_thread(self._fio, "write", pl.total)
        else:
            secs = await asyncio.to_thread(raw_write, self.file, pl.data)
        return [t0 + secs], t0 + secs

    async def load(self, n: int, pl: Payload, shift: int) -> tuple[list[float], float]:
        t0 = time.perf_counter()
        if self.fio:
            secs = await asyncio.to_thread(self._fio, "read", pl.total)
        else:
            secs = await asyncio.to_thread(raw_read, self.file, pl.back)
        return [t0 + secs], t0 + secs

    async def remove(self, n: int) -> None:
        self.file.unlink(missing_ok=True)


class NativeRoute(Route):
    """Our ``Checkpointer``: every rank ``save``s its files as arrays, and loads another
    rank's state (``load(src, into=...)``) into the read buffer in place, as the DCP routes
    load into tensors over it (allocating arrays per load costs fresh memory, 0.44 GB/s on
    this kind of VM: ../shared/MACHINE.md)."""

    def __init__(
        self,
        cluster: Cluster,
        client: Client,
        encoding: str,
        ranks: int,
        *,
        key: str = "native",
        where: str = "",
    ) -> None:
        super().__init__()
        enc = Encoding.parse(encoding).name
        self.key, self.title = f"{key}/{enc}", f"native Checkpointer, {enc}{where}"
        self.tolerates, self.overhead = redundancy(enc)
        self.cluster = cluster
        self.ckpt = Checkpointer(
            client, f"{STORE_ROOT}/native-{enc}", world_size=ranks, encoding=enc
        )

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        async def one(rank: int) -> float:
            state = {p.file.name: np.frombuffer(pl.src(p), dtype=np.uint8) for p in pl.ranks[rank]}
            await self.ckpt.save(n, rank, state)
            return time.perf_counter()

        ends = await asyncio.gather(*(one(r) for r in range(pl.plan.ranks)))
        await self.cluster.datapath.drain()
        return list(ends), time.perf_counter()

    async def load(self, n: int, pl: Payload, shift: int) -> tuple[list[float], float]:
        async def one(rank: int) -> float:
            src = pl.source_rank(rank, shift)
            into = {p.file.name: np.frombuffer(pl.dst(p), dtype=np.uint8) for p in pl.ranks[src]}
            await self.ckpt.load(src, step=n, into=into)
            return time.perf_counter()

        ends = await asyncio.gather(*(one(r) for r in range(pl.plan.ranks)))
        return list(ends), time.perf_counter()

    async def remove(self, n: int) -> None:
        await self.ckpt.delete(n)


class TorchSaveRoute(ThreadedRoute):
    """``torch.save`` of each file's tensor + fsync into a local directory; ``torch.load``."""

    key, title = "torch.save/local", "torch.save + fsync, local disk"

    def __init__(self, pool: concurrent.futures.ThreadPoolExecutor, root: Path) -> None:
        super().__init__(pool)
        self.root = root

    def _dir(self, n: int) -> Path:
        return self.root / f"ckpt-{n}"

    async def save(self, n: int, pl: Payload) -> tuple[list[float], float]:
        await asyncio.to_thread(self._dir(n).mkdir, parents=True, exist_ok=True)
        return await super().save(n, pl)

    def save_rank(self, n: int, rank: int, pl: Payload) -> None:
        import torch

        for p in pl.ranks[rank]:
            with open(self._dir(n) / p.file.name, "wb") as f:
                torch.save({"data": torch.from_numpy(byte_array(pl.src(p)))}, f)
                f.flush()
                os.fsync(f.fileno())

    def load_rank(self, n: int, rank: int, src: int, pl: Payload) -> None:
        import torch

        for p in pl.ranks[src]:
            self.hold(p, torch.load(self._dir(n) / p.file.name, weights_only=True)["data"])

    async def remove(self, n: int) -> None:
        await asyncio.to_thread(shutil.rmtree, self._dir(n))


class DcpRoute(ThreadedRoute):
    """torch DCP, one checkpoint directory per rank (``no_dist``), saved by ``writer(path)``
    and loaded by ``reader(path)`` into tensors over the read buffer. The writer and reader of
    each worker thread are made once and reused (``reset``), as a trainer keeps its own."""

    def __init__(
        self,
        pool: concurrent.futures.ThreadPoolExecutor,
        key: str,
        title: str,
        *,
        where: Callable[[int, int], str],
        writer: Callable[[str], Any],
        reader: Callable[[str], Any],
        remove: Callable[[int], Any],
        tolerates: int = 0,
        overhead: float = 1.0,
    ) -> None:
        super().__init__(pool)
        self.key, self.title = key, title
        self.tolerates, self.overhead = tolerates, overhead
        self._where, self._writer, self._reader, self._remove = where, writer, reader, remove
        self._local = threading.local()
        self._made: list[Any] = []
        # dcp.save/load without a process group warns at every call that it runs as one process
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled")

    def _mine(self, kind: str, make: Callable[[str], Any], path: str) -> Any:
        obj = getattr(self._local, kind, None)
        if obj is None:
            obj = make(path)
            setattr(self._local, kind, obj)
            self._made.append(obj)
        return obj

    def save_rank(self, n: int, rank: int, pl: Payload) -> None:
        import torch
        import torch.distributed.checkpoint as dcp

        path = self._where(n, rank)
        state = {p.file.name: torch.from_numpy(byte_array(pl.src(p))) for p in pl.ranks[rank]}
        writer = self._mine("writer", self._writer, path)
        dcp.save(state, checkpoint_id=path, storage_writer=writer, no_dist=True)

    def load_rank(self, n: int, rank: int, src: int, pl: Payload) -> None:
        import torch
        import torch.distributed.checkpoint as dcp

        path = self._where(n, src)
        state = {p.file.name: torch.from_numpy(byte_array(pl.dst(p))) for p in pl.ranks[src]}
        reader = self._mine("reader", self._reader, path)
        dcp.load(state, checkpoint_id=path, storage_reader=reader, no_dist=True)

    async def remove(self, n: int) -> None:
        result = self._remove(n)
        if asyncio.iscoroutine(result):
            await result

    def close(self) -> None:
        for obj in self._made:
            if hasattr(obj, "close"):
                obj.close()
        self._made.clear()


def torch_routes(
    paths: Sequence[str],
    pool: concurrent.futures.ThreadPoolExecutor,
    local: Path,
    mnt: Path,
    cluster_dir: Path,
    client: Client,
    encoding: str,
) -> list[Route]:
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    from clients.torch_dcp import TectonicStorageReader, TectonicStorageWriter

    def fs_writer(path: str) -> Any:
        return FileSystemWriter(path, sync_files=True, thread_count=1)

    def fs_dcp(key: str, title: str, base: Path, tolerates: int, overhead: float) -> DcpRoute:
        return DcpRoute(
            pool,
            key,
            title,
            where=lambda n, r: str(base / f"ckpt-{n}" / f"rank-{r}"),
            writer=fs_writer,
            reader=FileSystemReader,
            remove=lambda n: asyncio.to_thread(shutil.rmtree, base / f"ckpt-{n}"),
            tolerates=tolerates,
            overhead=overhead,
        )

    routes: list[Route] = []
    if "torch.save" in paths:
        routes.append(TorchSaveRoute(pool, local / "torch-save"))
    if "dcp/local" in paths:
        routes.append(
            fs_dcp("dcp/local", "DCP FileSystemWriter, local disk", local / "dcp", 0, 1.0)
        )
    if "dcp/plugin" in paths:
        t, o = redundancy(encoding)
        routes.append(
            DcpRoute(
                pool,
                "dcp/plugin",
                f"DCP through TectonicStorageWriter, {encoding}",
                where=lambda n, r: f"{STORE_ROOT}/dcp-plugin/ckpt-{n}/rank-{r}",
                writer=lambda path: TectonicStorageWriter(cluster_dir, path, encoding=encoding),
                reader=lambda path: TectonicStorageReader(cluster_dir, path),
                remove=lambda n: client.delete(f"{STORE_ROOT}/dcp-plugin/ckpt-{n}", recursive=True),
                tolerates=t,
                overhead=o,
            )
        )
    if "dcp/fuse" in paths:
        t, o = redundancy(encoding)
        routes.append(
            fs_dcp(
                "dcp/fuse", f"DCP FileSystemWriter on the mount, {encoding}", mnt / "dcp-fuse", t, o
            )
        )
    return routes


async def hosts_cluster(
    work: Path,
    hosts: int,
    width: int,
    nic_gbps: float,
    rtt_ms: float,
    stack: contextlib.AsyncExitStack,
    step: Callable[[str], None],
) -> tuple[Cluster, str] | str:
    """A cluster across ``hosts`` network namespaces (issue 8), open (torn down when
    ``stack`` closes), and the words for its paths' titles; or why it cannot be made here.
    Nodes: ``ceil(width / hosts)`` on each host, each served by ``node serve`` from the host's
    own copy of ``cluster.json``; metadata in a throwaway PostgreSQL server on the bridge; the
    links paced at ``nic_gbps`` and ``rtt_ms`` (0: not paced). This process is the client,
    in the root namespace."""
    from bench import netns, postgres

    reason = netns.unavailable()
    bindir = postgres.bin_dir()
    if reason or bindir is None:
        return reason or "no PostgreSQL server here (apt-get install postgresql)"
    step(f"making {hosts} hosts as network namespaces")
    names = [f"h{i}" for i in range(hosts)]
    net = stack.enter_context(netns.Hosts(names))
    server = postgres.PostgresServer(bindir, listen=(net.gateway,), trust=(net.network,))
    await asyncio.to_thread(server.start)
    stack.callback(server.stop)
    per_host = -(-width // hosts)
    placed = [(h, 7100 + j) for h in names for j in range(per_host)]
    template = work / "hosts" / "template"
    Cluster.create(
        template,
        nodes=len(placed),
        encoding="r1",
        metadata=server.url,
        node_addresses=tuple(f"{net.ip[h]}:{port}" for h, port in placed),
        nic_gbps=nic_gbps,
        rtt_ms=rtt_ms,
    )
    await asyncio.to_thread(
        netns.serve_nodes, net, template, work / "hosts", [h for h, _ in placed]
    )
    deadline = time.monotonic() + 60
    for h, port in placed:
        while not netns.listening(net.ip[h], port):
            if time.monotonic() > deadline:
                return f"the nodes on the namespaced hosts did not start ({work / 'hosts'})"
            await asyncio.sleep(0.05)
    cluster = await stack.enter_async_context(Cluster.open(template))
    link = f", {nic_gbps:g} Gb/s, {rtt_ms:g} ms" if nic_gbps or rtt_ms else ""
    return cluster, f", across {hosts} namespaced hosts x {per_host} nodes{link}"


async def peer_route(
    name: str,
    pool: concurrent.futures.ThreadPoolExecutor,
    work: Path,
    stack: contextlib.AsyncExitStack,
    step: Callable[[str], None],
) -> Route | str:
    """The peer ``name`` set up and mounted (torn down when ``stack`` closes), or why not."""
    from bench import peers

    if name not in peers.PEERS:
        return f"unknown peer; known: {', '.join(peers.PEERS)}"
    reason = peers.missing(name)
    if reason:
        return reason
    peer = peers.PEERS[name]
    title = f"{peer.title} {peers.version(name) or ''}".strip()
    step(f"setting up {title}")
    cm = peers.mounted(name, work / f"peer-{name}")
    where = await asyncio.to_thread(cm.__enter__)
    stack.push_async_callback(asyncio.to_thread, cm.__exit__, None, None, None)
    # A fresh peer makes its volumes on the first write (SeaweedFS: 7 of them): not measured.
    warm = where / "warm-up"
    await asyncio.to_thread(write_durably, warm, memoryview(os.urandom(8 << 20)))
    await asyncio.to_thread(warm.unlink)
    return FilesRoute(
        pool,
        f"peer/{name}",
        title,
        where,
        peer.copies - 1,
        float(peer.copies),
        sync_after=name in NOT_DURABLE_AT_FSYNC,
    )


__all__ = [
    "DEFAULT_PATHS",
    "NOT_DURABLE_AT_FSYNC",
    "STORE_ROOT",
    "DcpRoute",
    "FilesRoute",
    "NativeRoute",
    "RawRoute",
    "Route",
    "ThreadedRoute",
    "TorchSaveRoute",
    "hosts_cluster",
    "peer_route",
    "redundancy",
    "torch_routes",
]
