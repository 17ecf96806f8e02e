"""The committed checkpoints of a root, as one ``Checkpointer`` sees them: ``Catalog``.

What is committed and visible is decided by one listing of the root (``RootView``,
``clients/ckpt_retention.py``). A manifest is fetched once for every rank asking at the same
moment, decoded, indexed by name and by (name, rank) (``Indexed``) and kept while its file is
the same: 4,096 ranks loading at once read and decode it once. The save path, the load path
and the garbage collector all look at the root through one ``Catalog``.

Catalogs of one root in one process may share their decoded manifests (``SharedIndexes``):
each still lists the root and stats the manifest, as a process of its own would, but only
the first reads, decodes and indexes it. A projection's 3,072 hosts each reading and
decoding a 24,576-rank manifest at once held 3,072 copies of it (docs/simulate.md).
"""

from __future__ import annotations

import asyncio

from clients.ckpt_format import CheckpointNotFoundError, Entry, Manifest, manifest_name
from clients.ckpt_reads import FileReaders
from clients.ckpt_retention import RootView, view_of
from tectonic_emu.client import Client
from tectonic_emu.errors import NotFoundError

MANIFESTS_KEPT = 4  # decoded manifests a Catalog keeps (the newest steps asked for)


class Index:
    """A committed manifest with its entries by name and by (name, rank), and each rank's
    names in ``by_name``'s order: immutable, so Catalogs can share it. A load of every
    rank's own state walks only that rank's names (``names_of``), where walking every name
    for each rank had made it grow with ranks times names: 0.5 s of a real 1,024-rank
    load's 1.3 s on the loop (2026-12-06)."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.by_name: dict[str, list[Entry]] = {}
        self.own: dict[tuple[str, int], Entry] = {}
        by_rank: dict[int, list[str]] = {}
        for e in manifest.entries:
            self.by_name.setdefault(e.name, []).append(e)
            if (e.name, e.rank) not in self.own:
                self.own[e.name, e.rank] = e
                by_rank.setdefault(e.rank, []).append(e.name)
        order = {name: k for k, name in enumerate(self.by_name)}
        self._by_rank = {r: sorted(names, key=order.__getitem__) for r, names in by_rank.items()}

    def names_of(self, rank: int) -> list[str]:
        """The names ``rank`` saved, in ``by_name``'s order."""
        return self._by_rank.get(rank, [])


class Indexed:
    """A committed manifest's ``Index``, the file id it was read from, and this Catalog's
    readers of the data files it names (immutable once it is committed)."""

    def __init__(self, file_id: int, index: Index, files: FileReaders) -> None:
        self.file_id = file_id
        self.index = index
        self.manifest = self.index.manifest
        self.by_name = self.index.by_name
        self.own = self.index.own
        self.names_of = self.index.names_of
        self.files = files


class SharedIndexes:
    """Decoded manifests that Catalogs of one root share (module docstring), by (step,
    manifest file id), the newest MANIFESTS_KEPT steps."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[int, int], Index] = {}

    def get(self, step: int, file_id: int) -> Index | None:
        return self._by_key.get((step, file_id))

    def put(self, step: int, file_id: int, index: Index) -> None:
        self._by_key[(step, file_id)] = index
        while len({s for s, _ in self._by_key}) > MANIFESTS_KEPT:
            oldest = min(s for s, _ in self._by_key)
            self._by_key = {k: v for k, v in self._by_key.items() if k[0] != oldest}


class Catalog:
    """The checkpoints under the store directory ``root``: its listing, and the manifests
    decoded so far."""

    def __init__(self, client: Client, root: str, shared: SharedIndexes | None = None) -> None:
        self.client = client
        self.root = root
        self.shared = shared
        self._manifests: dict[int, Indexed] = {}  # decoded, by step
        self._fetching: dict[int, asyncio.Future[Indexed]] = {}

    def path(self, *names: str) -> str:
        return "/".join([self.root.rstrip("/"), *names])

    async def view(self) -> RootView:
        """The root's manifests, retirement markers and step directories, in one listing."""
        try:
            entries = await self.client.scandir(self.root)
        except NotFoundError:
            return RootView()
        return view_of((e.name, e.id) for e in entries)

    async def steps(self) -> list[int]:
        """Committed steps, oldest first, but for those retired."""
        return (await self.view()).visible

    async def manifest(self, step: int | None = None) -> Manifest:
        """The manifest of ``step`` (default: the latest). Raises CheckpointNotFoundError."""
        return (await self.indexed(step)).manifest

    async def indexed(self, step: int | None) -> Indexed:
        """The manifest of ``step`` (default: the latest) with its entries indexed; raises
        CheckpointNotFoundError for a step not committed or retired. Callers that ask while
        it is being fetched share one fetch, and a manifest already decoded is reused while
        its file is the same (one listing of the root)."""
        key = -1 if step is None else step
        flight = self._fetching.get(key)
        if flight is None:
            flight = asyncio.ensure_future(self._fetch(step))
            self._fetching[key] = flight
            flight.add_done_callback(lambda _: self._fetching.pop(key, None))
        return await asyncio.shield(flight)

    async def _fetch(self, step: int | None) -> Indexed:
        view = await self.view()
        if step is None:
            if not view.visible:
                raise CheckpointNotFoundError("no committed checkpoint", self.root)
            step = view.visible[-1]
        file_id = view.manifests.get(step)
        if step < view.retired_before:  # its files may be deleted already, or not yet
            how = "is retired" if file_id is not None else "is not committed, or was retired"
            raise CheckpointNotFoundError(
                f"step {step} {how} (beyond keep_last: steps before {view.retired_before} are)",
                self.root,
            )
        cached = self._manifests.get(step)
        if file_id is not None and cached is not None and cached.file_id == file_id:
            return cached
        path = self.path(manifest_name(step))
        try:
            if file_id is None:
                raise NotFoundError("no manifest", path)
            st = await self.client.stat(path)
            index = self.shared.get(step, st.id) if self.shared is not None else None
            if index is None:
                raw = bytearray(st.size)
                await self.client.read_id_into(st.id, 0, raw)  # the version stat named
                index = Index(Manifest.decode(bytes(raw), path))
        except NotFoundError:
            raise CheckpointNotFoundError(f"step {step} is not committed", self.root) from None
        indexed = Indexed(st.id, index, FileReaders(self.client))
        self.keep(step, indexed)
        return indexed

    def keep(self, step: int, indexed: Indexed) -> None:
        """Keep ``step``'s decoded manifest (its committer's, as written), dropping the
        oldest beyond MANIFESTS_KEPT."""
        if self.shared is not None:
            self.shared.put(step, indexed.file_id, indexed.index)
        self._manifests[step] = indexed
        while len(self._manifests) > MANIFESTS_KEPT:
            del self._manifests[min(self._manifests)]


__all__ = ["MANIFESTS_KEPT", "Catalog", "Index", "Indexed", "SharedIndexes"]
