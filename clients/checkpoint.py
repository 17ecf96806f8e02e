"""Synchronized multi-rank checkpoints in the store: ``Checkpointer``.

Every rank calls ``await ckpt.save(step, rank, state)``; it returns once the whole step is
committed. Ranks are coroutines of one process or ranks in other processes and hosts: they
meet only through the store (``clients/ckpt_format.py`` has the layout), so all work alike.

How a step commits (``docs/checkpoint.md`` has the failure cases):

1. A rank's state is *staged*: cut into parts of whole rows, copied into reused buffers by
   ``save_async`` (the caller may change its arrays once it returns), referenced by ``save``.
2. One writer per ``Checkpointer`` appends the parts of every rank it has staged into one data
   file of the step, seals it (durable), then writes an index file naming those ranks and
   where their parts lie. Ranks staged meanwhile go into the next data file.
3. The ``Checkpointer`` holding rank 0 polls the step's index files. Once they cover every
   rank, it publishes ``manifest-<step>.json`` in one atomic write: that is the commit. Every
   other ``Checkpointer`` polls for the manifest. A rank that fails or is cancelled before the
   commit leaves ``abort-<rank>``, and the step fails everywhere at once. Ranks that never
   come make it fail after ``timeout`` seconds.
4. Just before its manifest, the committer writes a marker retiring the checkpoints the
   commit leaves beyond ``keep_last`` (``clients/ckpt_retention.py``): they are hidden with
   the commit, everywhere at once. After it, the committer deletes them (never a data file a
   kept checkpoint references) and what failed steps before it left behind.

The pieces, each a module of its own below this one:

- ``ckpt_format``: the layout in the store, manifests, entries and parts, the errors;
- ``ckpt_catalog``: one listing of the root, manifests fetched once and kept (``Catalog``);
- ``ckpt_stage``: a rank's state cut into parts and staged; ``ckpt_commit``: batches written,
  the commit waited for and published (``StepWriter``); ``ckpt_save``: the save calls
  (``Saver``);
- ``ckpt_load``: the load calls (``Loader``); ``ckpt_parts``: parts read and checked;
  ``ckpt_reads``: small reads merged; ``ckpt_region``, ``ckpt_select``: resharding, regions
  and names;
- ``ckpt_retention``: which steps are visible, the markers; ``ckpt_gc``: markers written,
  retired and failed steps deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from clients.ckpt_catalog import Catalog, SharedIndexes
from clients.ckpt_commit import WRITERS, StepWriter
from clients.ckpt_format import CheckpointAbortedError as CheckpointAbortedError
from clients.ckpt_format import CheckpointCorruptError as CheckpointCorruptError
from clients.ckpt_format import CheckpointError, Manifest, Shard, Value
from clients.ckpt_format import CheckpointNotFoundError as CheckpointNotFoundError
from clients.ckpt_format import CheckpointTimeoutError as CheckpointTimeoutError
from clients.ckpt_gc import collect_garbage, delete_step, retain
from clients.ckpt_load import Loader
from clients.ckpt_parts import ARENA_BYTES as ARENA_BYTES
from clients.ckpt_save import PendingSave, Saver, SaveResult
from clients.ckpt_stage import PART_BYTES, StagingPool
from tectonic_emu import entropy
from tectonic_emu.argcheck import (
    bool_arg,
    int_arg,
    number_arg,
    optional_int_arg,
    optional_str_arg,
    str_arg,
)
from tectonic_emu.client import Client
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.qos.groups import TrafficGroup, grouped


class Checkpointer:
    """Checkpoints of ``world_size`` ranks under the store directory ``root``.

    One instance serves every rank of its process; other processes (and hosts) make their own
    over the same cluster. Use it as an async context manager, or ``await close()``.
    ``shared``: decoded manifests to share with the other Checkpointers of ``root`` in this
    process, as a projection's hosts do (``clients/ckpt_catalog.py``). ``group``: the
    TrafficGroup of its saves and loads (``tectonic_emu/qos``; None: the caller's), such as
    a bronze one so that a checkpoint burst does not starve the data loaders.
    """

    def __init__(
        self,
        client: Client,
        root: str,
        *,
        world_size: int,
        encoding: str | None = None,
        keep_last: int | None = None,
        timeout: float = 300.0,
        part_bytes: int = PART_BYTES,
        writers: int = WRITERS,
        shared: SharedIndexes | None = None,
        group: TrafficGroup | None = None,
    ) -> None:
        with _as_checkpoint_error():
            where = "Checkpointer"
            str_arg(where, "root", root)
            for name, value in (("world_size", world_size), ("part_bytes", part_bytes)):
                int_arg(where, name, value)
            int_arg(where, "writers", writers)
            optional_int_arg(where, "keep_last", keep_last)
            optional_str_arg(where, "encoding", encoding)
            number_arg(where, "timeout", timeout)
        if world_size < 1:
            raise CheckpointError(f"world_size must be at least 1, not {world_size}")
        if writers < 1:
            raise CheckpointError(f"writers must be at least 1, not {writers}")
        if keep_last is not None and keep_last < 1:
            raise CheckpointError(f"keep_last must be at least 1, not {keep_last}")
        self.client = client
        self.group = group
        self.root = root.rstrip("/") or "/"
        self.world_size = world_size
        self.encoding = encoding
        self.keep_last = keep_last
        self.timeout = timeout
        self.part_bytes = part_bytes
        self.writers = writers
        self._cleanup: asyncio.Future[None] | None = None  # retention after the last commit
        self._catalog = Catalog(client, self.root, shared)
        pool = StagingPool()
        self._writer = StepWriter(
            self._catalog,
            pool,
            world_size=world_size,
            encoding=encoding,
            keep_last=keep_last,
            timeout=timeout,
            writers=writers,
            writer_id=entropy.token_hex(4),
            committed=self._committed,
        )
        self._saver = Saver(
            self._catalog,
            self._writer,
            pool,
            world_size=world_size,
            encoding=encoding,
            part_bytes=part_bytes,
        )
        self._loader = Loader(self._catalog)

    @property
    def _writer_id(self) -> str:
        """The name this instance's data and index files carry."""
        return self._writer.writer_id

    @_writer_id.setter
    def _writer_id(self, value: str) -> None:
        self._writer.writer_id = value

    async def __aenter__(self) -> Checkpointer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_cleanup(self) -> None:
        """Wait until the clean-up after the last commit here (``keep_last``, failed steps'
        leftovers) is done; a save returns as soon as its step commits, before that."""
        if self._cleanup is not None:
            await asyncio.gather(self._cleanup, return_exceptions=True)

    async def close(self) -> None:
        """Finish cleaning up after the last commit; cancel what is still running for
        unfinished steps and wait for it."""
        await self.wait_cleanup()
        tasks = self._saver.tasks() + self._loader.tasks()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._saver.forget_steps()

    # -- saving ------------------------------------------------------------------------------
    @grouped
    async def save(
        self, step: int, rank: int, state: Mapping[str, Value], *, incremental: bool = False
    ) -> SaveResult:
        """Save ``rank``'s ``state`` for ``step``; return once the whole step is committed.

        ``state`` maps names to numpy arrays, bytes-likes and ``Shard``s; arrays are read in
        place, so leave them alone until this returns. ``incremental``: parts whose content
        equals the latest committed checkpoint's are referenced, not written again.

        Raises CheckpointError (bad arguments, a step already committed or not after the
        latest), CheckpointAbortedError (another rank gave up), CheckpointTimeoutError (ranks
        missing after ``timeout`` seconds), and the store's errors. If it raises or is
        cancelled, the step does not commit anywhere; its files are collected later.

        Ranks of this process that call in the same event-loop iteration are staged and
        waited for together, as by ``save_many``, where 4,096 ranks each opening the step,
        waiting for their parts and for the commit cost 0.06 ms of Python apiece. Each rank
        still gets its own answer (a bad rank number or state is that rank's error).
        """
        _check_save("save", step, state, incremental)
        return await self._saver.save(step, rank, state, incremental=incremental)

    @grouped
    async def save_async(
        self, step: int, rank: int, state: Mapping[str, Value], *, incremental: bool = False
    ) -> PendingSave:
        """Stage ``rank``'s state (a copy) and return; ``await pending.committed`` for the
        commit. The caller may change its arrays as soon as this returns."""
        _check_save("save_async", step, state, incremental)
        return await self._saver.save_async(step, rank, state, incremental=incremental)

    @grouped
    async def save_many(
        self,
        step: int,
        states: Mapping[int, Mapping[str, Value]],
        *,
        incremental: bool = False,
    ) -> list[SaveResult]:
        """``save`` for many ranks of this process in one call (``states`` by rank): the
        same checkpoint, but one coroutine stages them all and waits once, where each
        ``save`` costs its own coroutines and futures (``bench scale``: about 0.1 ms of
        Python per rank at 4,096 ranks). Returns once the step is committed, a result per
        rank in the order of ``states``; raises what ``save`` raises."""
        _check_save("save_many", step, states, incremental)
        return await self._saver.save_many(step, states, incremental=incremental)

    def _committed(self, step: int) -> None:
        """Step ``step`` was just published here: clean up behind the ranks rather than hold
        them, after the clean-up before it."""
        previous = self._cleanup
        self._cleanup = asyncio.ensure_future(self._retain(step, after=previous))

    async def _retain(self, newest: int, *, after: asyncio.Future[None] | None = None) -> None:
        """Delete retired checkpoints and failed steps' leftovers (``ckpt_gc.retain``)."""
        await retain(self._catalog, newest, after=after)

    # -- reading -----------------------------------------------------------------------------
    async def steps(self) -> list[int]:
        """Committed steps, oldest first, but for those retired (``keep_last``): a step is
        retired by the commit that leaves it beyond ``keep_last``, for every process at
        once, though its files are deleted behind the commit."""
        return await self._catalog.steps()

    async def latest(self) -> int | None:
        done = await self.steps()
        return done[-1] if done else None

    async def manifest(self, step: int | None = None) -> Manifest:
        """The manifest of ``step`` (default: the latest). Raises CheckpointNotFoundError."""
        with _as_checkpoint_error():
            optional_int_arg("manifest", "step", step)
        return await self._catalog.manifest(step)

    @grouped
    async def load(
        self,
        rank: int,
        step: int | None = None,
        world_size: int | None = None,
        *,
        into: Mapping[str, Value] | None = None,
        names: Collection[str] | None = None,
    ) -> dict[str, Value]:
        """``rank``'s state at ``step`` (default: the latest) for ``world_size`` ranks
        (default: as saved). At another world size, ``Shard``s are cut anew, evenly along
        axis 0; a value every rank saved alike comes back as saved; a value that differs
        between ranks raises CheckpointError. Every part read whole is checked against its
        CRC32C: CheckpointCorruptError names the rank, the value and the step.

        ``names``: load only these values (as DCP's ``load`` loads the state dict it is
        given), e.g. the sharded ones when resharding, leaving out per-rank values (RNG and
        data-loader state) that cannot be. A name the step does not hold, or (at the world
        size saved) that this rank did not save, raises CheckpointNotFoundError naming it.

        ``into``: values to read into in place, by name, instead of allocating new ones (a
        trainer restoring into the arrays it has, as DCP's ``load`` does): a writable,
        C-contiguous numpy array of the dtype and shape to be loaded (or a Shard of one; at
        another world size, this rank's new box of a Shard), or a writable buffer of the
        saved length for bytes; the values returned for those names are these arrays (bytes:
        the buffer). A mismatch is a CheckpointError before anything is read; on a failed
        check the array holds the bytes read.

        Ranks of this process that ask in the same event-loop iteration are served together,
        as by ``load_many`` (one manifest look-up, one plan, merged reads and checks), where
        4,096 ranks each doing their own cost 0.1 ms of Python apiece; so the arrays of ranks
        loaded together may be views of one shared buffer. A rank's error is its own: when
        a joint load fails, each of its ranks is loaded alone."""
        with _as_checkpoint_error():
            int_arg("load", "rank", rank)
            optional_int_arg("load", "step", step)
            optional_int_arg("load", "world_size", world_size)
        return await self._loader.load(rank, step, world_size, into=into, names=names)

    @grouped
    async def read(
        self, step: int, name: str, index: Any = None, *, rank: int | None = None
    ) -> Value:
        """A region of the global array ``name`` at ``step``: ``index`` is a numpy basic
        index (ints, slices, ...), and only the rows it needs are read. For a value saved per
        rank, ``rank`` picks whose (needed when they differ)."""
        with _as_checkpoint_error():
            int_arg("read", "step", step)
            str_arg("read", "name", name)
            optional_int_arg("read", "rank", rank)
        return await self._loader.read(step, name, index, rank=rank)

    @grouped
    async def load_many(
        self,
        ranks: Sequence[int],
        step: int | None = None,
        *,
        into: Sequence[Mapping[str, Value] | None] | None = None,
        names: Collection[str] | None = None,
    ) -> list[dict[str, Value]]:
        """``[load(r, step, names=names) for r in ranks]`` at the world size saved, for a
        process hosting many ranks: the same values, but one call plans every read and
        checks every part, where each ``load`` costs its own coroutines and futures (``bench
        scale``: about 0.1 ms of Python per rank at 4,096 ranks).

        Values whose parts lie back to back in a file (the usual case) are laid out in
        file order in shared buffers of up to ARENA_BYTES and read straight into place:
        one read per buffer, no copy. So the arrays returned may be views of one buffer,
        which stays allocated while any of them lives. ``into``: for each rank, values to
        read into in place, as ``load``'s; ``names``: the values to load, for every rank.
        Raises what ``load`` raises; nothing is returned unless every part read checks."""
        return await self._loader.load_many(ranks, step, into=into, names=names)

    @grouped
    async def verify(
        self, step: int | None = None, *, progress: Callable[[int], None] | None = None
    ) -> Manifest:
        """Read every part of a checkpoint and check it; raises CheckpointCorruptError.
        ``progress(nbytes)`` is called as values are checked."""
        return await self._loader.verify(step, progress=progress)

    # -- deleting ----------------------------------------------------------------------------
    @grouped
    async def delete(self, step: int) -> None:
        """Delete a committed checkpoint (its manifest first, then the data files no other
        checkpoint references). Raises CheckpointNotFoundError, for a retired step too (it
        is deleted already, or will be by the next clean-up)."""
        with _as_checkpoint_error():
            int_arg("delete", "step", step)
        await delete_step(self._catalog, step)

    async def collect_garbage(self, before: int | None = None) -> int:
        """Delete retired checkpoints (``keep_last``), and what steps that never committed
        left behind for steps before ``before`` (default: the latest committed), keeping
        data files a checkpoint references. Returns how many steps it cleaned."""
        return await collect_garbage(self._catalog, before)


@contextlib.contextmanager
def _as_checkpoint_error() -> Iterator[None]:
    """Wrong argument types are CheckpointErrors here, as the checkpoint API's other bad
    arguments are (docs/errors.md)."""
    try:
        yield
    except InvalidArgumentError as e:
        raise CheckpointError(e.message) from None


def _check_save(where: str, step: Any, state: Any, incremental: Any) -> None:
    """Types of a save's arguments (for ``save_many``, ``state`` maps ranks to states); the
    stages check the rank, and the step's value."""
    if not isinstance(state, Mapping):
        name = "states" if where == "save_many" else "state"
        raise CheckpointError(
            f"{where}: {name} must be a mapping (a dict), not {type(state).__name__}"
        )
    with _as_checkpoint_error():
        int_arg(where, "step", step)
        bool_arg(where, "incremental", incremental)


__all__ = ["Checkpointer", "PendingSave", "SaveResult", "Shard"]
