"""The save path of a ``Checkpointer``: ``Saver``.

A step is opened once per Checkpointer (checked against the committed steps, its directory
made), each rank's state staged (``clients/ckpt_stage.py``) and queued for the step's writer,
and every rank answered once the step commits (``clients/ckpt_commit.py``). ``save`` calls
made in the same event-loop iteration are served together, as by ``save_many``. A rank that
fails or is cancelled before the commit marks the step aborted, so that it fails everywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clients.ckpt_catalog import Catalog
from clients.ckpt_commit import Step, StepWriter, abort
from clients.ckpt_format import CheckpointError, Value, check_step, rank_error, step_dir
from clients.ckpt_gc import forget_retirement
from clients.ckpt_stage import Staged, StagingPool, stage_state
from tectonic_emu import clock
from tectonic_emu.coding import work


@dataclass(slots=True)
class SaveResult:
    """What one rank's save did. ``blocked_s``: how long the rank's call held it up;
    ``persist_s``: from the call to the commit."""

    step: int
    rank: int
    bytes_total: int  # this rank's state
    bytes_written: int  # of which written by this save (less when incremental)
    blocked_s: float
    persist_s: float


@dataclass(slots=True)
class PendingSave:
    """``save_async``'s answer: the state is staged; ``await pending.committed``."""

    committed: asyncio.Future[SaveResult]
    blocked_s: float


@dataclass(slots=True)
class _SaveAsk:
    """A ``save`` call waiting to be served with the others of its loop iteration."""

    rank: int
    state: Mapping[str, Value]
    incremental: bool
    started: float
    done: asyncio.Future[SaveResult]


class Saver:
    """The saves of one Checkpointer: its open steps, its staging buffers and its writer.
    ``Checkpointer``'s methods of the same names document what they raise."""

    def __init__(
        self,
        catalog: Catalog,
        writer: StepWriter,
        pool: StagingPool,
        *,
        world_size: int,
        encoding: str | None,
        part_bytes: int,
    ) -> None:
        self.catalog = catalog
        self.writer = writer
        self.pool = pool
        self.world_size = world_size
        self.encoding = encoding
        self.part_bytes = part_bytes
        self._steps: dict[int, Step] = {}
        self._made_root = False
        self._saving: dict[int, list[_SaveAsk]] = {}  # save calls waiting, by step
        self._save_tasks: set[asyncio.Task[None]] = set()

    def tasks(self) -> list[asyncio.Future[Any]]:
        """What is still running for steps and batched saves (for ``close`` to cancel)."""
        tasks: list[asyncio.Future[Any]] = [
            t
            for s in self._steps.values()
            for t in (s.prepared, s.writer, s.commit)
            if t is not None
        ]
        return tasks + list(self._save_tasks)

    def forget_steps(self) -> None:
        self._steps.clear()

    async def save(
        self, step: int, rank: int, state: Mapping[str, Value], *, incremental: bool = False
    ) -> SaveResult:
        """``Checkpointer.save``: queued with the other calls of this loop iteration."""
        loop = asyncio.get_running_loop()
        ask = _SaveAsk(rank, state, incremental, clock.monotonic(), loop.create_future())
        batch = self._saving.get(step)
        if batch is None:
            batch = self._saving[step] = []
            loop.call_soon(self._serve_saves, step)  # after this iteration's other callers
        batch.append(ask)
        try:
            return await ask.done
        except asyncio.CancelledError as exc:
            st = self._steps.get(step)
            if st is None or not _succeeded(st.commit):  # the step must not commit without it
                await asyncio.shield(abort(self.catalog, step, rank, exc))
            raise

    def _serve_saves(self, step: int) -> None:
        asks = self._saving.pop(step)
        task = asyncio.ensure_future(self._save_batch(step, asks))
        self._save_tasks.add(task)
        task.add_done_callback(self._save_tasks.discard)

    async def _save_batch(self, step: int, asks: list[_SaveAsk]) -> None:
        """Stage the ranks of ``asks`` for ``step``, wait for their parts and the commit, and
        answer each (a rank that cannot be staged gets its own error and aborts the step, as
        its own ``save`` would)."""
        for a in asks:  # before the step is opened, as a single save checks
            if (err := rank_error(a.rank, self.world_size)) is not None:
                _settle(a.done, err)
        asks = [a for a in asks if not a.done.done()]  # (a cancelled one marked the abort)
        if not asks:
            return
        try:
            check_step(step)
            st = await self._step_state(step)
            if _succeeded(st.commit):
                raise CheckpointError(f"step {step} is already committed", self.catalog.root)
        except BaseException as exc:
            for a in asks:
                _settle(a.done, exc)
            if isinstance(exc, asyncio.CancelledError):
                await asyncio.shield(abort(self.catalog, step, asks[0].rank, exc))
                raise
            return
        staged: list[tuple[_SaveAsk, Staged]] = []
        try:
            for a in asks:
                if a.done.done():
                    continue  # cancelled while the step opened (its save marked the abort)
                if a.rank in st.ranks:
                    _settle(a.done, CheckpointError(f"rank {a.rank} already saved step {step}"))
                    continue
                try:
                    s = self._staged(a.rank, a.state, a.incremental, False, a.started)
                except BaseException as exc:
                    _settle(a.done, exc)
                    await asyncio.shield(abort(self.catalog, step, a.rank, exc))
                    continue
                st.ranks.add(a.rank)
                staged.append((a, s))
            if not staged:
                return
            await work.settle()  # the ranks' Python, in a projection (coding/work.py)
            st.queue += [s for _, s in staged]
            self.writer.start(st)
            written = await asyncio.gather(*(s.written for _, s in staged), return_exceptions=True)
            bad = next((n for n in written if isinstance(n, BaseException)), None)
            if bad is not None:  # the step cannot commit: say so now, not at the timeout
                await asyncio.shield(abort(self.catalog, step, staged[0][0].rank, bad))
            assert st.commit is not None
            failed: BaseException | None = None
            try:
                await asyncio.shield(st.commit)
            except Exception as exc:
                failed = exc
                if bad is None:
                    await asyncio.shield(abort(self.catalog, step, staged[0][0].rank, exc))
            now = clock.monotonic()
            for (a, s), n in zip(staged, written, strict=True):
                if isinstance(n, BaseException):
                    _settle(a.done, n)
                elif failed is not None:
                    _settle(a.done, failed)
                elif not a.done.done():
                    elapsed = now - a.started
                    a.done.set_result(SaveResult(step, a.rank, s.nbytes, n, elapsed, elapsed))
        except BaseException as exc:  # cancelled (close): so are the saves waiting
            for a in asks:
                _settle(a.done, exc)
            raise

    async def save_async(
        self, step: int, rank: int, state: Mapping[str, Value], *, incremental: bool = False
    ) -> PendingSave:
        """``Checkpointer.save_async``: staged (a copy), the commit left to wait for."""
        started = clock.monotonic()
        st = await self._open_step(step, [rank])
        staged = await self._stage_rank(st, rank, state, incremental, True, started)
        await work.settle()  # the staging copy's CPU, in a projection (coding/work.py)
        self.writer.start(st)
        staged.blocked_s = clock.monotonic() - started
        committed = asyncio.ensure_future(self._finish(st, staged))
        return PendingSave(committed, staged.blocked_s)

    async def save_many(
        self, step: int, states: Mapping[int, Mapping[str, Value]], *, incremental: bool = False
    ) -> list[SaveResult]:
        """``Checkpointer.save_many``: every rank staged, then one wait."""
        started = clock.monotonic()
        st = await self._open_step(step, states)
        staged_all = []
        for rank, state in states.items():  # all staged before any is queued
            try:
                staged_all.append(self._staged(rank, state, incremental, False, started))
            except BaseException as exc:
                await asyncio.shield(abort(self.catalog, st.step, rank, exc))
                raise
        st.ranks.update(s.rank for s in staged_all)
        st.queue += staged_all
        self.writer.start(st)
        try:
            await work.settle()  # the ranks' Python, in a projection (coding/work.py)
            written = await asyncio.gather(*(s.written for s in staged_all))
            assert st.commit is not None
            await asyncio.shield(st.commit)
        except BaseException as exc:
            if not _succeeded(st.commit) and staged_all:
                await asyncio.shield(abort(self.catalog, st.step, staged_all[0].rank, exc))
            raise
        elapsed = clock.monotonic() - started
        return [
            SaveResult(step, s.rank, s.nbytes, n, elapsed, elapsed)
            for s, n in zip(staged_all, written, strict=True)
        ]

    async def _open_step(self, step: int, ranks: Iterable[int]) -> Step:
        """The step's state, once ``ranks`` are known to be valid for it; on cancellation
        the step is marked aborted (by the first of ``ranks``)."""
        check_step(step)
        ranks = list(ranks)
        for rank in ranks:
            if (err := rank_error(rank, self.world_size)) is not None:
                raise err
        if len(set(ranks)) != len(ranks):
            raise CheckpointError(f"a rank is given twice: {sorted(ranks)}")
        try:
            st = await self._step_state(step)
        except asyncio.CancelledError as exc:
            if ranks:
                await asyncio.shield(abort(self.catalog, step, ranks[0], exc))
            raise
        if _succeeded(st.commit):
            raise CheckpointError(f"step {step} is already committed", self.catalog.root)
        for rank in ranks:
            if rank in st.ranks:
                raise CheckpointError(f"rank {rank} already saved step {step}")
        return st

    def _staged(
        self, rank: int, state: Mapping[str, Value], incremental: bool, copy: bool, started: float
    ) -> Staged:
        """``rank``'s state staged (copied into staging buffers when ``copy``)."""
        work.python("rank-save")  # a rank's Python on the loop, for a projection to charge
        return stage_state(
            rank,
            state,
            incremental=incremental,
            started=started,
            part_bytes=self.part_bytes,
            pool=self.pool if copy else None,
        )

    async def _stage_rank(
        self,
        st: Step,
        rank: int,
        state: Mapping[str, Value],
        incremental: bool,
        copy: bool,
        started: float,
    ) -> Staged:
        """``rank``'s state staged and queued for the step's writer. If staging fails, the
        step is marked aborted: this rank will not save it, so neither will the others."""
        try:
            staged = self._staged(rank, state, incremental, copy, started)
        except BaseException as exc:
            await asyncio.shield(abort(self.catalog, st.step, rank, exc))
            raise
        st.ranks.add(rank)
        st.queue.append(staged)
        return staged

    async def _step_state(self, step: int) -> Step:
        st = self._steps.get(step)
        if st is None:
            for old in [s for s in self._steps.values() if _succeeded(s.commit) and not s.queue]:
                del self._steps[old.step]  # committed: a late save of it is refused by the store
            st = self._steps[step] = Step(step)
            st.prepared = asyncio.ensure_future(self._prepare(st))
        assert st.prepared is not None
        try:
            await asyncio.shield(st.prepared)
        except BaseException:
            if self._steps.get(step) is st and st.prepared.done():
                del self._steps[step]  # let a later call try again
            raise
        return st

    async def _prepare(self, st: Step) -> None:
        """Once per step and Checkpointer: check the step may be saved, note the previous
        checkpoint (for incremental saves), make the step's directory."""
        client, root = self.catalog.client, self.catalog.root
        if not self._made_root:
            await client.mkdir(root, parents=True, encoding=self.encoding)
            self._made_root = True
        view = await self.catalog.view()
        committed = view.visible
        if st.step in committed:
            raise CheckpointError(f"step {st.step} is already committed", root)
        if committed and st.step < committed[-1]:
            raise CheckpointError(
                f"step {st.step} comes before the latest committed step {committed[-1]}", root
            )
        if committed:
            st.previous = committed[-1]
        elif st.step < view.retired_before:
            await forget_retirement(self.catalog, view)
        await client.mkdir(self.catalog.path(step_dir(st.step)), exist_ok=True)

    async def _finish(self, st: Step, staged: Staged) -> SaveResult:
        """One rank's wait: its parts durable, then the step committed."""
        try:
            bytes_written = await staged.written
            assert st.commit is not None
            await asyncio.shield(st.commit)
        except BaseException as exc:
            if not _succeeded(st.commit):
                await asyncio.shield(abort(self.catalog, st.step, staged.rank, exc))
            raise
        total = staged.nbytes
        elapsed = clock.monotonic() - staged.started
        blocked = elapsed if staged.blocked_s is None else staged.blocked_s
        return SaveResult(st.step, staged.rank, total, bytes_written, blocked, elapsed)


def _settle(fut: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail ``fut`` with ``exc`` (cancel it for a cancellation), unless it is done."""
    if fut.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        fut.cancel()
    else:
        fut.set_exception(exc)


def _succeeded(task: asyncio.Future[Any] | None) -> bool:
    return task is not None and task.done() and not task.cancelled() and not task.exception()


__all__ = ["PendingSave", "SaveResult", "Saver"]
