"""Retention (``keep_last``, clients/ckpt_retention.py): retired steps are hidden by the commit
that retires them, from every Checkpointer at once, and deleted behind it; a clean-up cut
short (a crash, the cluster closed under it) leaves them hidden and the next one collects
them, logging nothing."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.checkpoint import Checkpointer
from clients.ckpt_format import CheckpointNotFoundError, manifest_name, step_dir
from clients.ckpt_retention import Marker, RootView, commit_marker, tidy, view_of
from tectonic_emu import Cluster
from tectonic_emu.client import Client

from .conftest import fresh_root
from .conftest import run_in_fresh_root as run


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt-retention") / "c"
    Cluster.create(path, nodes=4, encoding="r3", block_size=256 << 10)
    return path


def state(step: int, rank: int) -> dict[str, Any]:
    return {"w": np.full(200, step, dtype=np.float32), "rng": np.array([rank, step])}


async def save(ckpt: Checkpointer, step: int) -> None:
    await asyncio.gather(*(ckpt.save(step, r, state(step, r)) for r in range(ckpt.world_size)))


def left_in(names: list[str]) -> tuple[list[str], list[str]]:
    """The manifests and step directories among a root's ``names``."""
    return [n for n in names if n.startswith("manifest-")], [
        n for n in names if n.startswith("step-")
    ]


class Cuts:
    """A client's namespace deletions and renames failing as a closed store fails them
    (EBADF) at the calls numbered in ``at``: clean-ups cut short at every point."""

    def __init__(self, client: Client, at: set[int]) -> None:
        self.calls = 0
        self.at = at
        delete, rename = client.delete, client.rename

        async def cut_delete(path: str, **kw: Any) -> None:
            self._count()
            await delete(path, **kw)

        async def cut_rename(src: str, dst: str, **kw: Any) -> None:
            self._count()
            await rename(src, dst, **kw)

        client.delete = cut_delete  # type: ignore[method-assign]
        client.rename = cut_rename  # type: ignore[method-assign]

    def _count(self) -> None:
        self.calls += 1
        if self.calls in self.at:
            raise OSError(errno.EBADF, "metadata store is closed")


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keep_last=st.integers(1, 4),
    saves=st.integers(1, 7),
    cuts=st.sets(st.integers(1, 40), max_size=6),
)
def test_steps_are_the_last_keep_last_as_soon_as_each_save_returns(
    cluster_dir: Path,
    caplog: pytest.LogCaptureFixture,
    keep_last: int,
    saves: int,
    cuts: set[int],
) -> None:
    """Right after every save (its clean-up not yet run, or cut short at random points),
    steps() and latest() are exactly the last keep_last steps, from this Checkpointer and
    from another on the same cluster that has no keep_last; a retired step does not load.
    Once a clean-up runs whole, only the kept steps' files are left."""
    caplog.set_level(logging.WARNING)
    caplog.clear()

    async def body(client: Client, root: str) -> None:
        faults = Cuts(client, cuts)
        other = Checkpointer(client, root, world_size=2)
        async with Checkpointer(client, root, world_size=2, keep_last=keep_last) as ckpt:
            done: list[int] = []
            for k in range(saves):
                step = 10 * (k + 1)
                await save(ckpt, step)
                done.append(step)
                want = done[-keep_last:]
                assert await ckpt.steps() == want and await other.steps() == want
                assert await ckpt.latest() == step and await other.latest() == step
                for gone in done[:-keep_last]:
                    with pytest.raises(CheckpointNotFoundError, match=f"step {gone} is.* retired"):
                        await other.load(0, gone)
                got = await other.load(1, want[0])
                assert np.array_equal(got["w"], state(want[0], 1)["w"])
            await ckpt.wait_cleanup()
            faults.at = set()
            await other.collect_garbage()
            assert await other.steps() == done[-keep_last:]
            manifests, dirs = left_in(await client.listdir(root))
            assert manifests == [manifest_name(s) for s in done[-keep_last:]]
            assert dirs == [step_dir(s) for s in done[-keep_last:]]
            markers = [n for n in await client.listdir(root) if n.startswith("retire-")]
            assert len(markers) <= 1

    run(cluster_dir, body)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_crash_between_the_commit_and_the_clean_up_leaves_retired_steps_hidden(
    cluster_dir: Path,
) -> None:
    """The committer dies right after each commit (no clean-up runs): the retired steps stay
    hidden from a new Checkpointer (never half-listed), and its collect_garbage deletes
    them. Deleting the newest step keeps the ones it retired hidden."""

    async def body(client: Client, root: str) -> None:
        ckpt = Checkpointer(client, root, world_size=2, keep_last=2)

        async def dies(newest: int, *, after: Any = None) -> None:
            return None  # the process is gone before its clean-up

        ckpt._retain = dies  # type: ignore[method-assign]
        for step in (1, 2, 3, 4):
            await save(ckpt, step)
        fresh = Checkpointer(client, root, world_size=2)
        assert await fresh.steps() == [3, 4]
        manifests, _ = left_in(await client.listdir(root))
        assert manifests == [manifest_name(s) for s in (1, 2, 3, 4)]  # hidden, not deleted
        with pytest.raises(CheckpointNotFoundError, match="retired"):
            await fresh.manifest(2)
        with pytest.raises(CheckpointNotFoundError, match="retired"):
            await fresh.delete(1)

        await fresh.delete(4)  # the marker 4's commit wrote stays in force without it
        assert await fresh.steps() == [3]
        assert await fresh.collect_garbage() == 2
        assert left_in(await client.listdir(root)) == ([manifest_name(3)], [step_dir(3)])
        await save(fresh, 5)
        await fresh.wait_cleanup()
        assert await fresh.steps() == [3, 5]  # a Checkpointer without keep_last retires none

    run(cluster_dir, body)


def test_a_commit_that_fails_after_its_marker_retires_nothing(cluster_dir: Path) -> None:
    """The marker is written before the manifest; if the manifest write fails, the step is
    not committed and retires nothing, and the next commit tidies the marker away."""

    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=1, keep_last=1) as ckpt:
            await ckpt.save(1, 0, state(1, 0))
            real = client.new_version

            async def fails(path: str, **kw: Any) -> Any:
                if path.endswith(manifest_name(2)):
                    raise OSError(errno.EIO, "disk on fire")
                return await real(path, **kw)

            client.new_version = fails  # type: ignore[method-assign]
            with pytest.raises(OSError, match="disk on fire"):
                await ckpt.save(2, 0, state(2, 0))
            client.new_version = real  # type: ignore[method-assign]
            names = await client.listdir(root)
            assert Marker(2, 2).name in names  # written, but without its manifest: no effect
            assert await ckpt.steps() == [1]
            assert np.array_equal((await ckpt.load(0, 1))["w"], state(1, 0)["w"])
            await ckpt.save(3, 0, state(3, 0))
            await ckpt.wait_cleanup()
            assert await ckpt.steps() == [3]
            names = await client.listdir(root)
            assert [n for n in names if n.startswith("retire-")] == [Marker(3, 3).name]
            assert left_in(names) == ([manifest_name(3)], [step_dir(3)])

    run(cluster_dir, body)


def test_closing_the_cluster_under_a_clean_up_logs_nothing_and_the_next_commit_collects(
    cluster_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The cluster closes while the clean-up after step 30 is deleting: no error is logged,
    step 20 stays hidden, and the next commit's clean-up (another process's, here another
    opening of the cluster) deletes what it left."""
    caplog.set_level(logging.DEBUG, logger="clients.checkpoint")
    root = fresh_root()
    s = {"w": np.arange(1000, dtype=np.float64)}

    async def first() -> None:
        gate, entered = asyncio.Event(), asyncio.Event()
        async with Cluster.open(cluster_dir) as cluster:
            client = cluster.client()
            ckpt = Checkpointer(client, root, world_size=1, keep_last=1)
            for step in (10, 20):
                await ckpt.save(step, 0, s)
            await ckpt.wait_cleanup()
            delete = client.delete

            async def held(path: str, **kw: Any) -> None:
                entered.set()
                await gate.wait()
                await delete(path, **kw)

            client.delete = held  # type: ignore[method-assign]
            await ckpt.save(30, 0, s)
            await entered.wait()  # the clean-up is under way
        gate.set()  # the cluster is closed: the clean-up goes on against a closed store
        await ckpt.close()

    asyncio.run(first())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("left to the next" in r.getMessage() for r in caplog.records)

    async def second(client: Client, _: str) -> None:
        ckpt = Checkpointer(client, root, world_size=1, keep_last=1)
        assert await ckpt.steps() == [30]
        manifests, dirs = left_in(await client.listdir(root))
        assert manifest_name(20) in manifests and step_dir(20) in dirs  # left behind, hidden
        await ckpt.save(40, 0, s)
        await ckpt.wait_cleanup()
        assert left_in(await client.listdir(root)) == ([manifest_name(40)], [step_dir(40)])

    run(cluster_dir, second)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_series_started_again_below_the_retired_steps_is_not_hidden(cluster_dir: Path) -> None:
    """Every checkpoint deleted, training starts again at step 1: the markers that retired
    steps before 6 must not hide it."""

    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=1, keep_last=1) as ckpt:
            for step in (5, 6):
                await ckpt.save(step, 0, state(step, 0))
            await ckpt.delete(6)
            assert await ckpt.steps() == []
            await ckpt.save(1, 0, state(1, 0))
            assert await ckpt.steps() == [1]
            assert np.array_equal((await ckpt.load(0))["w"], state(1, 0)["w"])
            await ckpt.save(2, 0, state(2, 0))
            await ckpt.wait_cleanup()
            assert await ckpt.steps() == [2]
            assert left_in(await client.listdir(root)) == ([manifest_name(2)], [step_dir(2)])

    run(cluster_dir, body)


# -- the markers alone ---------------------------------------------------------------------
def view(manifests: list[int], markers: list[Marker]) -> RootView:
    entries = [(manifest_name(s), s) for s in manifests] + [(m.name, 0) for m in markers]
    return view_of(entries)


def test_a_marker_takes_effect_only_with_its_manifest() -> None:
    assert view([1, 2, 3], [Marker(3, 4)]).visible == [1, 2, 3]  # 4 not committed
    assert view([1, 2, 3, 4], [Marker(3, 4)]).visible == [3, 4]
    assert view([1, 2, 3, 4], [Marker(3, 4)]).retired == [1, 2]
    assert view([2, 3], [Marker(3)]).visible == [3]  # unconditional
    assert Marker(3, 4).name == "retire-000000000003-000000000004"
    assert view([], [Marker(3, 4), Marker(7)]).markers == (Marker(3, 4), Marker(7))


@given(
    committed=st.lists(st.integers(0, 50), unique=True, max_size=8).map(sorted),
    keep_last=st.integers(1, 5),
)
def test_the_commit_marker_keeps_exactly_the_last_keep_last(
    committed: list[int], keep_last: int
) -> None:
    step = (committed[-1] if committed else 0) + 1
    before = view(committed, [])
    marker = commit_marker(before, step, keep_last)
    after = view([*committed, step], [] if marker is None else [marker])
    assert after.visible == [*committed, step][-keep_last:]
    # Tidying for a clean-up keeps the retirement in force: confirm or keep the strongest.
    plan = tidy(after, after.retired, before=step)
    left = [m for m in after.markers if m not in plan.remove]
    if plan.confirm is not None:
        left = [Marker(plan.confirm.before) if m == plan.confirm else m for m in left]
    kept = [s for s in after.manifests if s not in after.retired]
    assert view(kept, left).visible == after.visible


def test_a_step_retired_before_another_process_saw_its_commit_ends_that_wait(
    cluster_dir: Path,
) -> None:
    """Overlapping saves (save_async) commit tens of ms apart: step 20's commit retires
    step 10 (keep_last=1) and its clean-up deletes step 10's manifest before the process of
    rank 1 looks for it. That process's wait for step 10 ends there (the step is hidden
    either way), where it used to poll for the manifest until the timeout."""
    root = fresh_root()

    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            a, b = cluster.client(), cluster.client()
            gate = asyncio.Event()
            exists = b.exists

            async def late_exists(path: str) -> bool:
                if path.endswith(manifest_name(10)):
                    await gate.wait()  # this process looks only once step 20 is committed
                return await exists(path)

            b.exists = late_exists  # type: ignore[method-assign]
            first = Checkpointer(a, root, world_size=2, keep_last=1)
            second = Checkpointer(b, root, world_size=2, keep_last=1, timeout=5)
            rank1_10 = asyncio.ensure_future(second.save(10, 1, state(10, 1)))
            await first.save(10, 0, state(10, 0))
            await asyncio.gather(first.save(20, 0, state(20, 0)), second.save(20, 1, state(20, 1)))
            await first.wait_cleanup()
            assert manifest_name(10) not in await a.listdir(root)
            gate.set()
            await asyncio.wait_for(rank1_10, 4)
            assert await second.steps() == [20]
            await first.close()
            await second.close()

    asyncio.run(main())
